"""JetBrains' Mellum 2 (``MellumForCausalLM``): Qwen3-MoE's attention (q/k norms) and experts (the top k of a
softmax, renormalized with ``norm_topk_prob``, no shared expert), with what sets it apart, read from its config as
transformers reads it. No torch (the scheduler reads configs).

* Layers are ``full_attention`` or ``sliding_attention`` (a window of ``sliding_window``) by ``layer_types``,
  each type with RoPE at a base of its own (``rope_parameters`` per type).
* ``mlp_layer_types`` says which layers route ("sparse") and which keep a dense MLP of ``intermediate_size``.
* Its multi-token-prediction layer (``mtp.*``) is skipped, as transformers skips it (``load_weights`` skips any).
"""

from __future__ import annotations

from typing import Any

from services.engine.layer_types import FULL as _FULL
from services.engine.layer_types import SLIDING as _SLIDING
from services.engine.layer_types import attention_types, mlp_types, rope_by_type, window_where_sliding

ARCH = "MellumForCausalLM"
# transformers' MellumConfig defaults where Qwen3-MoE's differ (its expert count saved as num_local_experts).
DEFAULTS = {"vocab_size": 98304, "hidden_size": 2304, "intermediate_size": 7168, "num_hidden_layers": 28,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6, "sliding_window": 1024, "num_local_experts": 64, "num_experts_per_tok": 8,
            "moe_intermediate_size": 896, "norm_topk_prob": True, "tie_word_embeddings": False}
# Qwen3-MoE's layout fields, which Mellum does not read (its layer_types and mlp_layer_types say it all).
IGNORED = ("use_sliding_window", "max_window_layers", "decoder_sparse_step", "mlp_only_layers")
_ROPE = {_FULL: {"rope_type": "default", "rope_theta": 500000.0},
         _SLIDING: {"rope_type": "default", "rope_theta": 10000.0}}


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer and MLP types and per-type RoPE with transformers' defaults, as Qwen3-MoE's fields: a window
    where some layer slides, the dense layers as ``mlp_only_layers``."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or [_FULL] * layers
    mlp = raw.get("mlp_layer_types") or ["sparse"] * layers
    attention_types(types, layers)
    mlp_types(mlp, layers)
    rope = rope_by_type(raw, _ROPE, "Mellum", same_share=True)
    return {**raw, "layer_types": types, "rope_parameters": rope, "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i, kind in enumerate(mlp) if kind == "dense"]}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Mellum sets (``rewrite`` has run): its window where layers slide (set here:
    Qwen3-MoE's own config is served without one)."""
    sliding = tuple(i for i, t in enumerate(raw["layer_types"]) if t == _SLIDING)
    window = window_where_sliding(raw, sliding)
    return {"architecture": ARCH, "sliding_window": window,
            "sliding_layers": sliding if 0 < len(sliding) < len(raw["layer_types"]) else None,
            "local_rope_theta": float(raw["rope_parameters"][_SLIDING].get("rope_theta") or 10000.0) if sliding
            else None}
