"""Xiaomi's MiMo-V2-Flash (``MiMoV2FlashForCausalLM``): what sets it apart from GLM-4.5, whose routing it shares
(DeepSeek-V3's sigmoid scores with a correction bias, in groups; the first layer's MLP dense), read from its
config as transformers reads it. No torch (the scheduler reads configs).

* Sliding-window layers (``layer_types``: all but the first and every sixth) with twice the model's KV heads and
  a learned sink per head (GPT-OSS's), each type with a RoPE base of its own over a third of each head.
* Values narrower than queries and keys (``v_head_dim``, 128 of 192) and scaled by ``attention_value_scale``:
  the KV pool holds them padded to ``head_dim`` with zeros, which add nothing to attention's output.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError
from services.engine.layer_types import FULL as _FULL
from services.engine.layer_types import SLIDING as _SLIDING
from services.engine.layer_types import attention_types, rope_by_type

ARCH = "MiMoV2FlashForCausalLM"
# transformers' MiMoV2FlashConfig defaults (MiMo-V2-Flash's shape); no shared experts.
DEFAULTS = {"vocab_size": 152576, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 48,
            "num_attention_heads": 64, "num_key_value_heads": 4, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "moe_intermediate_size": 2048,
            "num_experts_per_tok": 8, "n_routed_experts": 256, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
            "bos_token_id": 1, "head_dim": 192, "sliding_window": 129, "n_shared_experts": 0}
_ROPE = {_FULL: {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
         _SLIDING: {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334}}


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types (full in the first and every sixth layer), per-type RoPE and window as transformers
    defaults and reads them (``sliding_window_size``: the keys before the query, one fewer than the window)."""
    layers = int(raw["num_hidden_layers"])
    types = attention_types(
        raw.get("layer_types") or [_FULL if i == 0 or not (i + 1) % 6 else _SLIDING for i in range(layers)], layers)
    rope = rope_by_type(raw, _ROPE, "MiMo-V2-Flash", same_share=True)
    if rope[_FULL].get("rope_type", "default") != "default":
        raise ModelLoadError(f"config.json: MiMo-V2-Flash is served with default RoPE only, got {rope[_FULL]!r}")
    out = {**raw, "layer_types": types, "rope_parameters": rope,
           "routed_scaling_factor": raw.get("routed_scaling_factor") or 1.0}  # the hub's config says null
    if raw.get("sliding_window_size") is not None:
        out["sliding_window"] = int(raw["sliding_window_size"]) + 1
    return out


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only MiMo-V2-Flash sets (``rewrite`` has run)."""
    types = raw["layer_types"]
    sliding = tuple(i for i, t in enumerate(types) if t == _SLIDING)
    head_dim = int(raw["head_dim"])
    value_dim = int(raw.get("v_head_dim") or 128)
    if not 0 < value_dim <= head_dim:
        raise ModelLoadError(f"config.json: v_head_dim must be in 1..head_dim ({head_dim}), got {value_dim}: values "
                             "are cached padded to the keys' width")
    kv_heads = int(raw.get("num_key_value_heads") or raw["num_attention_heads"])
    if int(raw["num_attention_heads"]) % (2 * kv_heads) and sliding:
        raise ModelLoadError(f"config.json: the sliding layers' {2 * kv_heads} KV heads (twice num_key_value_heads) "
                             f"must divide num_attention_heads ({raw['num_attention_heads']})")
    scale = raw.get("attention_value_scale", 0.707)
    return {"architecture": ARCH, "attention_sinks": bool(sliding), "sink_layers": sliding,
            "sliding_layer_heads": (2 * kv_heads, head_dim) if sliding else None,
            "value_head_dim": value_dim if value_dim < head_dim else None,
            "value_scale": 1.0 if scale is None else float(scale),
            "local_rope_theta": float(raw["rope_parameters"][_SLIDING].get("rope_theta") or 10000.0)}
