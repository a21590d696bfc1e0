"""Loads a Hugging Face checkpoint directory: config, safetensors weights (single file or sharded with an
index), ``tokenizer.json`` and ``generation_config.json``. Every failure names the file and the fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

from services.common.errors import ModelLoadError, NotFound
from services.engine.model import LlamaForCausalLM
from services.engine.model_config import ModelConfig
from services.engine.rope import inverse_frequencies


@dataclass
class Checkpoint:
    """A loaded model directory."""

    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]  # from generation_config.json when present, else config.json
    generation_defaults: dict


def check_model_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir).expanduser()
    if not path.exists():
        raise NotFound(f"model directory {str(path)!r} does not exist; pass --model DIR of a Hugging Face checkpoint "
                       "or omit it to use the built-in model")
    if not path.is_dir():
        raise ModelLoadError(f"{str(path)!r} is not a directory; --model takes a checkpoint directory")
    return path


def load_checkpoint_meta(model_dir: str | Path, max_model_len: int | None = None) -> Checkpoint:
    """Everything but the weights (cheap: the scheduler and clients need only this); ``max_model_len`` caps the
    context served (--max-model-len)."""
    path = check_model_dir(model_dir)
    config = ModelConfig.from_dir(path).with_max_model_len(max_model_len)
    tok_path = path / "tokenizer.json"
    if not tok_path.exists():
        raise ModelLoadError(f"{path} has no tokenizer.json (a `tokenizers` file is required)")
    try:
        tokenizer = Tokenizer.from_file(str(tok_path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise ModelLoadError(f"{tok_path} cannot be read: {exc}") from exc
    gen = _read_json(path / "generation_config.json") if (path / "generation_config.json").exists() else {}
    eos = gen.get("eos_token_id", None)
    if eos is None:
        eos_ids = config.eos_token_ids
    else:
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    return Checkpoint(path, config, tokenizer, eos_ids, gen)


def iter_weights(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) from ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index} has no weight_map")
        files = sorted(set(weight_map.values()))
    elif (model_dir / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{model_dir} has no *.safetensors weights (pytorch .bin files are not supported)")
    for name in files:
        file = model_dir / name
        if not file.exists():
            raise ModelLoadError(f"shard {name} listed in the index is missing from {model_dir}")
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    yield key, f.get_tensor(key)
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{file} is not a readable safetensors file: {exc}") from exc


def load_model(ckpt: Checkpoint, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(ckpt.config)
    model = model.to_empty(device=device).to(dtype)
    # RoPE frequencies stay fp32 whatever the weights' dtype, as in transformers.
    model.rotary.inv_freq = inverse_frequencies(ckpt.config).to(device)
    if model.local_rotary is not None:
        model.local_rotary.inv_freq = inverse_frequencies(ckpt.config, local=True).to(device)
    if ckpt.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    try:
        model.load_weights(iter_weights(ckpt.path))
    except KeyError as exc:
        raise ModelLoadError(f"{ckpt.path}: {exc.args[0]}") from exc
    return model.eval()


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return data
