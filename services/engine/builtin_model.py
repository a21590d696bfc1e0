"""The built-in default model: a random-weight Llama checkpoint in Hugging Face format, made offline.

Seawall must start, serve and be tested with nothing downloaded, so it carries a real byte-level BPE
tokenizer (``builtin/tokenizer.json``, trained by ``scripts/train_tokenizer.py``) and writes random weights
for it on demand. The result is an ordinary Hugging Face Llama checkpoint: ``transformers`` loads it as
``LlamaForCausalLM`` with no missing or unexpected keys, which makes it the oracle for the engine's own runner.

Checkpoint directory written by :func:`init_model`::

    config.json                  LlamaForCausalLM config (preset fields + overrides, token ids)
    model.safetensors            all weights                       (num_shards == 1)
    model-0000k-of-0000n.safetensors + model.safetensors.index.json  (num_shards == n > 1)
    tokenizer.json               copy of builtin/tokenizer.json
    tokenizer_config.json        special tokens, chat template, model_max_length, add_bos_token=false
    generation_config.json       bos, eos = [<|end_of_text|>, <|eot_id|>], greedy

Contracts:

- Same ``(preset, overrides, seed, num_shards)`` -> byte-identical files on every machine. Each tensor has its
  own ``torch.Generator`` seeded from ``(seed, tensor name)`` and is drawn with integer-only randomness and
  exactly rounded arithmetic (see :func:`_approx_normal`), so prefill and decode hosts that each create the
  default model get the same weights, and changing the layer count leaves the other tensors unchanged.
- A checkpoint directory appears atomically: it is built in a temp dir beside the target and renamed into
  place, so a reader never sees a half-written model and concurrent initialisers of one cache dir are safe.
- Encoding plain text never adds ``<|begin_of_text|>``; the chat template puts it at the start of a prompt.

Bump ``BUILTIN_VERSION`` when the tokenizer, a preset or the init scheme changes: cached default models are
keyed by it and are never rebuilt in place.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from services.common.errors import InvalidArgument, ModelLoadError

if TYPE_CHECKING:
    import torch

BUILTIN_VERSION = 1
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
TOKENIZER_PATH = BUILTIN_DIR / "tokenizer.json"

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
PAD_TOKEN = "<|pad|>"
START_HEADER_TOKEN = "<|start_header_id|>"
END_HEADER_TOKEN = "<|end_header_id|>"
EOT_TOKEN = "<|eot_id|>"

# Llama 3 chat format. The tokenizer does not add bos by itself, so the template does, once per prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first -%}{{ bos_token }}{%- endif -%}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] | trim)"
    " + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"
)

PRESETS: dict[str, dict[str, Any]] = {
    # ~2.6M parameters: CPU tests and `seawall up` without a GPU.
    "tiny": {
        "vocab_size": 4096,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    },
    # ~29M parameters with Llama 3.1 rope scaling and an untied lm_head: GPU benchmarks.
    "small": {
        "vocab_size": 4096,
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    },
}

_POSITIVE_INT_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings",
)  # fmt: skip
_POSITIVE_FLOAT_FIELDS = ("rope_theta", "rms_norm_eps")
_DTYPES = ("float32", "bfloat16", "float16")
_LLAMA3_ROPE_KEYS = {
    "rope_type",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
}

# Init scheme (see _weight_specs), tuned on greedy decoding of random weights: it should wander instead of
# looping on a token or two, with a top-1/top-2 logit gap far above float rounding (median ~1). Sharper
# attention (a larger QK_GAIN) wanders more but amplifies float32 kernel differences: at 3.0 engine and
# transformers logprobs differ by ~3e-4 at 720 tokens, at 1.5 by ~3e-5, inside the oracle test's 1e-4.
LOGIT_STD = 5.0  # std of the logits
QK_GAIN = 1.5  # q and k std multiplier: attention scores have std ~QK_GAIN**2
RESIDUAL_WRITE_GAIN = 3.0  # o_proj and down_proj std multiplier: layers outweigh the (tied) input embedding
FINAL_NORM_GAIN = (
    4.0  # model.norm.weight scale; the output embedding is that much smaller (see _weight_specs)
)
NORM_NOISE_STD = 0.1  # RMSNorm weights are gain * (1 + N(0, NORM_NOISE_STD))


# ---------------------------------------------------------------------------------------------- config


def _tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER_PATH))


def _validate_rope_scaling(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or value.get("rope_type") != "llama3" or set(value) != _LLAMA3_ROPE_KEYS:
        raise InvalidArgument(
            f"rope_scaling must be null or {{'rope_type': 'llama3', 'factor', 'low_freq_factor', "
            f"'high_freq_factor', 'original_max_position_embeddings'}}, got {value!r}"
        )
    for key in _LLAMA3_ROPE_KEYS - {"rope_type"}:
        number = value[key]
        if isinstance(number, bool) or not isinstance(number, int | float) or number <= 0:
            raise InvalidArgument(f"rope_scaling.{key} must be a positive number, got {number!r}")
    if value["high_freq_factor"] <= value["low_freq_factor"]:
        raise InvalidArgument("rope_scaling.high_freq_factor must be greater than low_freq_factor")


def _validate_fields(cfg: dict[str, Any]) -> None:
    for key in _POSITIVE_INT_FIELDS:
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], int) or cfg[key] < 1:
            raise InvalidArgument(f"{key} must be a positive integer, got {cfg[key]!r}")
    for key in _POSITIVE_FLOAT_FIELDS:
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], int | float) or cfg[key] <= 0:
            raise InvalidArgument(f"{key} must be a positive number, got {cfg[key]!r}")
    if not isinstance(cfg["tie_word_embeddings"], bool):
        raise InvalidArgument(
            f"tie_word_embeddings must be true or false, got {cfg['tie_word_embeddings']!r}"
        )
    if cfg["torch_dtype"] not in _DTYPES:
        raise InvalidArgument(f"torch_dtype must be one of {sorted(_DTYPES)}, got {cfg['torch_dtype']!r}")
    _validate_rope_scaling(cfg["rope_scaling"])
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise InvalidArgument(
            f"num_attention_heads ({cfg['num_attention_heads']}) must be a multiple of "
            f"num_key_value_heads ({cfg['num_key_value_heads']})"
        )
    if cfg["head_dim"] % 2:
        raise InvalidArgument(f"head_dim must be even for rotary embeddings, got {cfg['head_dim']}")
    tokenizer_vocab = _tokenizer().get_vocab_size()
    if cfg["vocab_size"] < tokenizer_vocab:
        raise InvalidArgument(
            f"vocab_size must be at least the tokenizer's {tokenizer_vocab}, got {cfg['vocab_size']}"
        )


def resolve_config(preset: str = "tiny", overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The preset's fields with ``overrides`` applied, validated. Raises InvalidArgument naming the fix."""
    if preset not in PRESETS:
        raise InvalidArgument(f"unknown preset {preset!r}; valid presets: {', '.join(sorted(PRESETS))}")
    if overrides is not None and not isinstance(overrides, dict):
        raise InvalidArgument(f"overrides must be a dict of config fields, got {type(overrides).__name__}")
    cfg = json.loads(json.dumps(PRESETS[preset]))  # deep copy; presets stay untouched
    unknown = sorted(set(overrides or {}) - set(cfg))
    if unknown:
        raise InvalidArgument(f"unknown override field(s) {unknown}; valid fields: {', '.join(sorted(cfg))}")
    cfg.update(json.loads(json.dumps(overrides or {})))
    _validate_fields(cfg)
    return cfg


def hf_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` contents for a resolved preset config."""
    tok = _tokenizer()
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "bos_token_id": tok.token_to_id(BOS_TOKEN),
        "eos_token_id": tok.token_to_id(EOS_TOKEN),
        "pad_token_id": tok.token_to_id(PAD_TOKEN),
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        **cfg,
    }


# ---------------------------------------------------------------------------------------------- weights


def _weight_specs(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...], float, float]]:
    """``(name, shape, mean, std)`` for every tensor, in Hugging Face module order.

    Init scheme (all approximately normal, see :func:`_approx_normal`): v, gate and up have std
    ``1/sqrt(fan_in)``, keeping unit variance per channel; q and k ``QK_GAIN/sqrt(fan_in)``; o and down,
    which write the residual stream, ``RESIDUAL_WRITE_GAIN/sqrt(fan_in)``. Layer RMSNorm weights are
    ``1 + N(0, NORM_NOISE_STD)``; the final one is ``FINAL_NORM_GAIN`` times that, and the output embedding
    has std ``LOGIT_STD/(FINAL_NORM_GAIN*sqrt(hidden))``, so logits have std ~LOGIT_STD. When tied, the output
    embedding is also the input embedding: keeping it small next to what the layers add is what stops the
    current token from predicting itself (token X's logit includes ``e_X . e_X``). Untied input embeddings
    have std 1.
    """
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q_dim = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_dim = cfg["num_key_value_heads"] * cfg["head_dim"]
    out_std = LOGIT_STD / (FINAL_NORM_GAIN * math.sqrt(h))
    qk_std, write_std = QK_GAIN / math.sqrt(h), RESIDUAL_WRITE_GAIN / math.sqrt(q_dim)
    tied = cfg["tie_word_embeddings"]
    specs = [("model.embed_tokens.weight", (v, h), 0.0, out_std if tied else 1.0)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [
            (p + "self_attn.q_proj.weight", (q_dim, h), 0.0, qk_std),
            (p + "self_attn.k_proj.weight", (kv_dim, h), 0.0, qk_std),
            (p + "self_attn.v_proj.weight", (kv_dim, h), 0.0, h**-0.5),
            (p + "self_attn.o_proj.weight", (h, q_dim), 0.0, write_std),
            (p + "mlp.gate_proj.weight", (inter, h), 0.0, h**-0.5),
            (p + "mlp.up_proj.weight", (inter, h), 0.0, h**-0.5),
            (p + "mlp.down_proj.weight", (h, inter), 0.0, RESIDUAL_WRITE_GAIN / math.sqrt(inter)),
            (p + "input_layernorm.weight", (h,), 1.0, NORM_NOISE_STD),
            (p + "post_attention_layernorm.weight", (h,), 1.0, NORM_NOISE_STD),
        ]
    specs.append(("model.norm.weight", (h,), FINAL_NORM_GAIN, FINAL_NORM_GAIN * NORM_NOISE_STD))
    if not tied:
        specs.append(("lm_head.weight", (v, h), 0.0, out_std))
    return specs


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"seawall-builtin-v{BUILTIN_VERSION}:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _approx_normal(
    shape: tuple[int, ...], mean: float, std: float, generator: torch.Generator
) -> torch.Tensor:
    """Float64 samples with the given mean and std, bit-identical on every CPU.

    ``torch.randn`` takes ISA-specific vectorised paths (its log/cos differ in the last bits between AVX2,
    AVX-512 and ARM), so it is not used. Instead: the sum of 4 uniform integers in [0, 2**50) (Irwin-Hall,
    bell-shaped, bounded at +-3.46 std) is exact in int64, its conversion to float64 is exact, and the one
    multiply and add after it are correctly rounded IEEE operations.
    """
    import torch

    n = math.prod(shape)
    draws = torch.randint(0, 2**50, (4, n), generator=generator, dtype=torch.int64)
    centred = draws.sum(dim=0) - 2 * 2**50  # exact: |value| < 2**51
    # Sum of 4 U(0, 1) has variance 1/3, so scale by sqrt(3) to get unit variance.
    scale = std * math.sqrt(3.0) / 2**50
    return (centred.to(torch.float64) * scale + mean).reshape(shape)


def generate_weights(cfg: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint, in module order, in ``cfg['torch_dtype']``."""
    import torch  # here, not at the top: the scheduler finds the built-in model without torch

    dtype = getattr(torch, cfg["torch_dtype"])
    weights = {}
    for name, shape, mean, std in _weight_specs(cfg):
        generator = torch.Generator(device="cpu").manual_seed(_tensor_seed(seed, name))
        weights[name] = _approx_normal(shape, mean, std, generator).to(dtype).contiguous()
    return weights


def _shard_bounds(sizes: list[int], num_shards: int) -> list[int]:
    """Start index of each shard: contiguous, non-empty, about equal in bytes."""
    total, starts, cum = sum(sizes), [0], 0
    for i, size in enumerate(sizes):
        k = len(starts)
        if k == num_shards:
            break
        # Cut before tensor i once the bytes so far reach k/num_shards, or when the rest is just enough.
        if i > starts[-1] and (cum * num_shards >= k * total or len(sizes) - i == num_shards - k):
            starts.append(i)
        cum += size
    assert len(starts) == num_shards and starts == sorted(set(starts)), starts
    return starts


# ---------------------------------------------------------------------------------------------- files


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_json(path: Path, obj: Any) -> None:
    _write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def _tokenizer_config(model_max_length: int) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_checkpoint(directory: Path, cfg: dict[str, Any], seed: int, num_shards: int) -> None:
    from safetensors.torch import save as safetensors_save

    config = hf_config(cfg)
    weights = generate_weights(cfg, seed)
    metadata = {"format": "pt"}
    if num_shards == 1:
        _write_bytes(directory / "model.safetensors", safetensors_save(weights, metadata=metadata))
    else:
        names = list(weights)
        sizes = [weights[n].numel() * weights[n].element_size() for n in names]
        starts = [*_shard_bounds(sizes, num_shards), len(names)]
        weight_map = {}
        for k in range(num_shards):
            filename = f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors"
            shard = {n: weights[n] for n in names[starts[k] : starts[k + 1]]}
            _write_bytes(directory / filename, safetensors_save(shard, metadata=metadata))
            weight_map.update(dict.fromkeys(shard, filename))
        index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
        _write_json(directory / "model.safetensors.index.json", index)
    _write_json(directory / "config.json", config)
    _write_bytes(directory / "tokenizer.json", TOKENIZER_PATH.read_bytes())
    _write_json(directory / "tokenizer_config.json", _tokenizer_config(cfg["max_position_embeddings"]))
    generation = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": [config["eos_token_id"], _tokenizer().token_to_id(EOT_TOKEN)],
        "pad_token_id": config["pad_token_id"],
        "do_sample": False,
    }
    _write_json(directory / "generation_config.json", generation)


def is_complete(directory: Path) -> bool:
    """True if ``directory`` holds every file of a checkpoint written by :func:`init_model`."""
    directory = Path(directory)
    if not all((directory / f).is_file() for f in ("config.json", "tokenizer.json", "tokenizer_config.json")):
        return False
    if (directory / "model.safetensors").is_file():
        return True
    index_path = directory / "model.safetensors.index.json"
    if not index_path.is_file():
        return False
    try:
        shards = set(json.loads(index_path.read_text())["weight_map"].values())
    except (ValueError, KeyError, TypeError):
        return False
    return all((directory / s).is_file() for s in shards)


def _is_non_empty_dir(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _build_beside(out: Path, cfg: dict[str, Any], seed: int, num_shards: int) -> Path:
    """Write the checkpoint into a fresh temp dir next to ``out`` (same filesystem, so rename is atomic)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the published model should be readable like any dir
        _write_checkpoint(tmp, cfg, seed, num_shards)
        dir_fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _rename_into_place(tmp: Path, out: Path) -> bool:
    """Atomically rename ``tmp`` to ``out``; False (and ``tmp`` removed) if ``out`` is a non-empty dir."""
    try:
        os.rename(tmp, out)  # replaces ``out`` only if it is missing or an empty directory
        return True
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) or isinstance(exc, FileExistsError):
            return False
        raise


def _move_aside_and_delete(path: Path) -> None:
    trash = path.with_name(f".{path.name}.old-{uuid.uuid4().hex}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return  # someone else moved it first
    shutil.rmtree(trash, ignore_errors=True)


def init_model(
    out_dir: str | os.PathLike[str],
    preset: str = "tiny",
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    num_shards: int = 1,
    *,
    overwrite: bool = False,
) -> Path:
    """Write a random-weight Llama checkpoint to ``out_dir`` and return its absolute path.

    ``out_dir`` may be missing or an empty directory. With ``overwrite=True`` an existing checkpoint
    directory (one holding ``config.json``) is replaced; any other non-empty directory is refused, so a
    mistyped path never deletes unrelated files. Raises InvalidArgument for a bad preset, override, seed,
    shard count or target directory.
    """
    cfg = resolve_config(preset, overrides)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidArgument(f"seed must be a non-negative integer, got {seed!r}")
    num_tensors = len(_weight_specs(cfg))
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or not 1 <= num_shards <= num_tensors:
        raise InvalidArgument(
            f"num_shards must be an integer from 1 to {num_tensors} (the tensor count), got {num_shards!r}"
        )
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"{out} exists and is not a directory")
    replace = _is_non_empty_dir(out)
    if replace and not overwrite:
        raise InvalidArgument(
            f"{out} already exists and is not empty; choose another directory or overwrite it"
        )
    if replace and not (out / "config.json").is_file():
        raise InvalidArgument(
            f"refusing to overwrite {out}: it is not empty and holds no config.json (not a model)"
        )

    tmp = _build_beside(out, cfg, seed, num_shards)
    if replace:
        _move_aside_and_delete(out)
    if not _rename_into_place(tmp, out):
        raise InvalidArgument(f"{out} was filled by another process while this one was writing it")
    return out


def default_cache_dir() -> Path:
    """``$SEAWALL_CACHE_DIR``, else ``~/.cache/seawall``."""
    env = os.environ.get("SEAWALL_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "seawall"


def default_model_dir(preset: str = "tiny") -> Path:
    """Where the built-in model of ``preset`` is cached: ``<cache>/models/builtin-<preset>-v<version>``."""
    if preset not in PRESETS:
        raise InvalidArgument(f"unknown preset {preset!r}; valid presets: {', '.join(sorted(PRESETS))}")
    return (default_cache_dir() / "models" / f"builtin-{preset}-v{BUILTIN_VERSION}").absolute()


def ensure_default_model(preset: str = "tiny") -> Path:
    """Create the built-in model (seed 0) in the cache once and return its directory.

    Idempotent and safe to race: every caller builds in its own temp dir and renames it into place; the
    first rename wins and the others discard their copy. A directory left incomplete by hand is replaced.
    """
    out = default_model_dir(preset)
    if is_complete(out):
        return out
    cfg = resolve_config(preset)
    if _is_non_empty_dir(out) and not is_complete(out):
        _move_aside_and_delete(out)
    tmp = _build_beside(out, cfg, seed=0, num_shards=1)
    _rename_into_place(tmp, out)  # False means another process won; its copy is identical
    if not is_complete(out):
        raise ModelLoadError(
            f"built-in model at {out} is incomplete after initialisation; delete it and retry"
        )
    return out


def without_attention_output(src: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """A copy of single-file checkpoint ``src`` in ``out`` with every attention output projection (o_proj)
    zero: each token's successor then depends on that token alone, so greedy output soon runs in a loop.
    Random weights never copy their context the way real outputs do (code edits, extraction); this stand-in
    makes speculative decoding's n-gram drafts right, for its tests and bench/speculative.py."""
    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copyfile(f, out / f.name)
    weights = load_file(src / "model.safetensors")
    save_file({k: v * 0 if k.endswith("o_proj.weight") else v for k, v in weights.items()},
              out / "model.safetensors", metadata={"format": "pt"})
    return out


def with_sliding_window(src: str | os.PathLike[str], out: str | os.PathLike[str], window: int,
                        max_position_embeddings: int | None = None) -> Path:
    """A copy of checkpoint ``src`` in ``out`` as a Mistral checkpoint whose every layer attends within
    ``window`` keys (the same tensor names; transformers then masks as Mistral 7B v0.1 does): the built-in
    model as a sliding-window model, for tests and bench/sliding_window.py."""
    src, out = Path(src), Path(out)
    shutil.copytree(src, out)
    config = json.loads((out / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=window)
    if max_position_embeddings is not None:
        config["max_position_embeddings"] = max_position_embeddings
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
