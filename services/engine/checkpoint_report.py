"""What Seawall makes of a checkpoint directory before anything loads (``seawall model check``): whether it is
served and as what, its shape, attention and positions, the KV cache one token takes, its parameters from the
safetensors headers, its tokenizer and what it outputs. Reads config.json, the safetensors headers and the
tokenizer files only: no torch, no weights, so a user learns in a second whether a download will run, and why
not when it will not (the reason ModelConfig gives)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from services.common.errors import SeawallError
from services.engine.linear_attention_config import (
    KdaShape,
    LightningShape,
    Mamba1Shape,
    Mamba2Shape,
    RgLruShape,
    ShortConvShape,
)
from services.engine.model_config import ModelConfig
from services.engine.pooling import has_lm_head, read_pooling
from services.engine.safetensors_headers import read_json, tensors, weight_files
from services.engine.tiktoken_vocab import RANKS_FILE
from services.engine.xglm import ARCH as XGLM

# Bytes of one element of each dtype the KV cache may use.
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}
# Bytes per element of the dtypes safetensors headers name.
_TENSOR_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                 "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1}


def report(model_dir: str | Path, max_model_len: int | None = None) -> dict[str, Any]:
    """The checkpoint's facts as plain data; ``served`` False with ``reason`` where it is refused."""
    path = Path(model_dir).expanduser()
    raw = read_json(path / "config.json") if (path / "config.json").exists() else {}
    named = ((raw.get("architectures") if isinstance(raw, dict) else None) or ["(none named)"])[0]
    out: dict[str, Any] = {"path": str(path), "architecture": named}
    try:
        config = ModelConfig.from_dir(path).with_max_model_len(max_model_len)
    except SeawallError as exc:
        return {**out, "served": False, "reason": str(exc)}
    out.update(served=True, served_as=config.architecture, **_shape(config), **_attention(config),
               kv_cache_bytes_per_token={dtype: kv_bytes_per_token(config, dtype) for dtype in _kv_dtypes(config)},
               weights=_weights(path), tokenizer=_tokenizer(path), quantization=_quantization(config))
    if config.recurrent:
        out["recurrent_state_bytes_per_sequence"] = {dtype: state_bytes_per_sequence(config, dtype)
                                                     for dtype in ("bfloat16", "float32")}
    out["output"] = (f"classes ({config.num_labels} labels)" if config.num_labels
                     else "text" if has_lm_head(path, config.tie_word_embeddings) else "embeddings only")
    pooling = read_pooling(path, config.num_labels)
    out["embeddings"] = "refused: " + pooling.refused if pooling.refused else (
        "last token, normalized" if pooling.normalize else "last token")
    return out


def _kv_dtypes(config: ModelConfig) -> tuple[str, ...]:
    """The KV dtypes it may be served with: ``--kv-cache-dtype fp8`` too, except with none at all (an
    attention-free model keeps no KV)."""
    return ("bfloat16", "float32", "fp8") if config.kv_layers else ("bfloat16", "float32")


def kv_bytes_per_token(config: ModelConfig, dtype: str) -> int:
    """What one token's keys and values take in every layer that keeps them (latent attention: its one
    latent; linear-attention layers keep none)."""
    parts = 1 if config.mla else 2
    heads, head_dim = config.kv_slot
    return config.kv_slots * parts * heads * head_dim * _BYTES[dtype]


def state_bytes_per_sequence(config: ModelConfig, dtype: str) -> int:
    """What one sequence's recurrent states take in the linear-attention layers, whatever its length: the
    convolution's window in ``dtype``, the state matrix in fp32 (recurrent_state.py)."""
    s = config.linear_attention
    conv = s.conv_dim * (s.conv_kernel - 1) * _BYTES[dtype]
    return len(config.linear_layers) * (conv + math.prod(s.state_shape) * 4)


def _shape(config: ModelConfig) -> dict[str, Any]:
    shape = {"layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
             "query_heads": list(config.layer_query_heads) if config.layer_query_heads else config.num_attention_heads,
             "kv_heads": config.num_key_value_heads,
             "head_dim": config.head_dim, "mlp": f"{'gated ' if config.mlp_gated else ''}{config.hidden_act}, "
                                                 f"{config.intermediate_size} wide",
             "context": config.max_model_len, "vocab_size": config.vocab_size}
    if config.attention_free:  # no attention to have heads, and the MLP only where a layer holds one
        del shape["query_heads"], shape["kv_heads"], shape["head_dim"]
    if not any(config.has_mlp(i) for i in range(config.num_hidden_layers)):
        shape["mlp"] = "none"
    if config.num_experts:
        routed = [i for i in range(config.num_hidden_layers) if config.is_moe(i)]
        shape["experts"] = (f"{config.num_experts} routed ({config.num_experts_per_tok} a token, "
                            f"{config.moe_intermediate_size} wide, {config.moe_routing} routing) in "
                            f"{len(routed)} of {config.num_hidden_layers} layers"
                            + (f", a shared MLP {config.shared_expert_intermediate_size} wide"
                               if config.shared_expert_intermediate_size else "")
                            + (f"; the experts on a {config.moe_latent_size}-wide latent" if config.moe_latent_size
                               else ""))
    if config.sublayers:
        mixers = sum(config.has_mixer(i) for i in range(config.num_hidden_layers))
        shape["sublayers"] = (f"one a layer: a mixer in {mixers}, an MLP in {config.num_hidden_layers - mixers} "
                              f"of {config.num_hidden_layers}")
    return shape


def _attention(config: ModelConfig) -> dict[str, Any]:
    if config.mla:
        kind = f"latent (MLA): one {config.head_dim}-wide latent a token and layer"
        if config.index_topk:  # DeepSeek-V3.2's sparse attention (dsa.py)
            kind += (f" (with its indexer's {config.index_head_dim}-wide key); each query attends the "
                     f"{config.index_topk} keys its indexer ranks highest")
    elif config.sliding_window is not None:
        sliding = sum(config.slides(i) for i in range(config.num_hidden_layers))
        kind = f"window of {config.sliding_window} in {sliding} of {config.num_hidden_layers} layers, full in the rest"
    else:
        kind = "full"
    if config.linear_layers:
        s = config.linear_attention
        mixer = (f"Mamba-2 ({s.num_heads} heads of {s.head_dim}, a {s.state_size}-wide state per channel"
                 if isinstance(s, Mamba2Shape) else
                 f"Mamba ({s.intermediate} channels, a {s.state_size}-wide state each" if isinstance(s, Mamba1Shape) else
                 f"gated short convolution ({s.conv_kernel} tokens wide" if isinstance(s, ShortConvShape) else
                 f"Kimi Delta Attention ({s.num_heads} heads of {s.head_dim}" if isinstance(s, KdaShape) else
                 f"lightning attention ({s.num_heads} heads of {s.head_dim}" if isinstance(s, LightningShape) else
                 f"Griffin's RG-LRU ({s.width} channels" if isinstance(s, RgLruShape) else
                 f"Gated DeltaNet linear attention ({s.num_value_heads} value heads on {s.num_key_heads} key heads")
        rest = "beside it in every layer" if config.parallel_mixers else "in the rest" if not config.sublayers \
            else f"in {len(config.linear_layers)}"
        kind = (f"none; {mixer}, a recurrent state per sequence) in every layer" if config.attention_free else
                kind + f" in {len(config.kv_layers)} of {config.num_hidden_layers} layers; {mixer}, a recurrent state "
                       f"per sequence) {rest}")
    share = (f"a {config.rotary_dim}-wide block of each head" if config.mla
             else f"{config.rotary_dim} of each head's {config.head_dim} features")
    rope = f"RoPE ({config.rope_type}, base {config.rope_theta:g}) over {share}"
    if config.learned_positions is not None:
        made = "sinusoidal" if config.architecture == XGLM else "learned"
        rope = f"{made}, absolute: a table of {config.max_position_embeddings} added to the embeddings"
    elif config.alibi_bias_max is not None:
        rope = f"ALiBi: each head's scores biased by distance (slopes 2^-({config.alibi_bias_max:g}i/n))" + (
            ", rounded to bf16 as transformers' Falcon rounds them" if config.alibi_bf16 else "")
    elif len(config.nope_layers) == config.num_hidden_layers:
        rope = "none: no layer rotates (attention without positions)"
    elif config.nope_layers:
        rope += f"; {len(config.nope_layers)} layers without positions"
    if config.gemma4 is not None:  # the full-attention layers' heads, RoPE and the layers that keep no KV
        g, full = config.gemma4, config.full_attention
        heads = full.num_key_value_heads
        kind += (f"; the full layers' {heads} KV head{'s' * (heads > 1)} of {full.head_dim}"
                 + (", values their keys' projection" if g.k_eq_v else "")
                 + (f"; the last {config.num_hidden_layers - len(config.kv_layers)} layers read earlier layers' KV"
                    if len(config.kv_layers) < config.num_hidden_layers else ""))
        share = float((config.rope_scaling or {}).get("partial_rotary_factor", 1.0))
        rope = (f"RoPE: sliding layers' base {config.local_rope_theta:g} over all {config.head_dim} features; full "
                f"layers' {config.rope_type} (base {config.rope_theta:g}) over {int(share * full.head_dim)} of their "
                f"{full.head_dim}")
    return {"attention": kind, "positions": rope}


def _quantization(config: ModelConfig) -> str:
    kv = "calibrated FP8 KV scales (used with --kv-cache-dtype fp8)"
    if config.mxfp4:
        weights = "MXFP4 experts, dequantized as they load"
    elif config.packed_int_bits:
        weights = f"INT{config.packed_int_bits} weights, dequantized as they load"
    elif config.fp8_scales:
        weights = "FP8 weights, dequantized as they load"
    elif config.ternary_weights:
        weights = (f"BitNet ternary weights ({config.ternary_weights}), dequantized as they load; each projection's "
                   "input rounded to 8 bits per token")
    else:
        return kv if config.kv_scales else "none"
    return f"{weights}; {kv}" if config.kv_scales else weights


def _weights(path: Path) -> dict[str, Any]:
    """Parameters and bytes from the safetensors headers."""
    params, size, dtypes = 0, 0, set()
    for _, info in tensors(path):
        n = math.prod(info["shape"])
        params += n
        size += n * _TENSOR_BYTES.get(info["dtype"], 0)
        dtypes.add(info["dtype"])
    return {"files": len(weight_files(path)), "parameters": params, "bytes": size, "dtypes": sorted(dtypes)}


def _tokenizer(path: Path) -> str:
    found = "tokenizer.json" if (path / "tokenizer.json").exists() else RANKS_FILE if (path / RANKS_FILE).exists() \
        else None
    if found is None:
        return "missing: a tokenizer.json (or tiktoken ranks) is required"
    config = read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").exists() else {}
    template = (isinstance(config, dict) and bool(config.get("chat_template"))) or (path / "chat_template.jinja").exists()
    return f"{found}, {'with' if template else 'without'} a chat template"


def render(facts: dict[str, Any]) -> str:
    """The report as aligned lines for a terminal."""
    if not facts["served"]:
        return f"{facts['path']}: not served ({facts['architecture']})\n  {facts['reason']}\n"
    weights = facts["weights"]
    named = facts["architecture"]
    rows = [
        ("architecture", named if named == facts["served_as"] else f"{named}, served as {facts['served_as']}"),
        ("layers", f"{facts['layers']} x hidden {facts['hidden_size']}, {facts['query_heads']} query / "
                   f"{facts['kv_heads']} KV heads of {facts['head_dim']}"),
        ("mlp", facts["mlp"]), *([("experts", facts["experts"])] if "experts" in facts else []),
        *([("sublayers", facts["sublayers"])] if "sublayers" in facts else []),
        ("attention", facts["attention"]), ("positions", facts["positions"]),
        ("context", f"{facts['context']} tokens"),
        ("KV cache", ", ".join(f"{_size(n)} a token in {d}" for d, n in facts["kv_cache_bytes_per_token"].items())),
        *([("state", ", ".join(f"{_size(n)} a sequence in {d}"
                               for d, n in facts["recurrent_state_bytes_per_sequence"].items()))]
          if "recurrent_state_bytes_per_sequence" in facts else []),
        ("weights", f"{_count(weights['parameters'])} parameters, {_size(weights['bytes'])} in "
                    f"{weights['files']} file(s) ({', '.join(weights['dtypes']) or 'none found'})"
         if weights["files"] else "no safetensors files"),
        ("quantization", facts["quantization"]), ("tokenizer", facts["tokenizer"]),
        ("output", facts["output"]), ("embeddings", facts["embeddings"]),
    ]
    return f"{facts['path']}: served\n" + "".join(f"  {k:<13} {v}\n" for k, v in rows)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
