"""Reflection's Beam (``BeamForCausalLM``: Beam-1.0-501B-A23B): GLM-4.5's grouped sigmoid routing under Qwen3-MoE's
attention, with what sets it apart, read from its config as transformers reads it. No torch (the scheduler reads
configs).

* Sandwich norms (each sublayer's input and output RMS-normed, OLMo 3's norms) joined to the stream by
  depth-scaled adds: the stream after sublayer add ``n`` (``2(l + 1)`` for layer l's attention, one more for its
  MLP) is ``out / sqrt(n) + stream * sqrt((n - 1) / n)`` (``depth_scaled_residuals``).
* ``sliding_attention`` layers (``sliding_window``) rotate; ``full_attention`` layers do not (their
  ``rope_parameters`` entry is null) and scale their queries by ``exp(0.1 * log1p((p + 1) / 2048))``, in fp32
  (``nope_query_power``), so that attention stays sharp over a long context.
* Attention's output gated per feature by the sigmoid of a projection of the layer's input plus a bias per head
  (``gate_proj``, ``gate_bias``: ``attn_gate_head_bias``); q and k RMS-normed per head, RoPE over all of each head.
* ``mlp_layer_types`` says which layers route (three dense ones first by default); no shared expert; the experts'
  sum times ``routed_scaling_factor``; logits soft-capped at ``final_logit_softcapping``.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError
from services.engine.layer_types import FULL, SLIDING, attention_types, mlp_types, window_where_sliding

ARCH = "BeamForCausalLM"
NAMES = {"num_experts": "n_routed_experts"}
# transformers' BeamConfig defaults, under GLM-4.5's names.
DEFAULTS = {"vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 20480, "num_hidden_layers": 52,
            "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": 512, "moe_intermediate_size": 2560,
            "n_routed_experts": 256, "num_experts_per_tok": 8, "norm_topk_prob": True, "n_group": 8, "topk_group": 4,
            "routed_scaling_factor": 2.5, "final_logit_softcapping": 30.0, "attention_bias": False}
# GLM-4.5's fields Beam does not read (its own say it all).
IGNORED = ("first_k_dense_replace", "partial_rotary_factor", "use_qk_norm", "output_router_logits",
           "router_aux_loss_coef", "decoder_sparse_step", "mlp_only_layers", "use_sliding_window", "max_window_layers",
           "n_shared_experts")
NOPE_QUERY_POWER = (0.1, 2048.0)  # exp(0.1 * log1p((p + 1) / 2048))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer and MLP types with transformers' defaults (every sixth layer and the last full, three dense
    layers first), RoPE for the sliding layers alone; GLM-4.5's q/k norms, whole-head RoPE and no shared expert."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(layers)]
        types[-1] = FULL
    attention_types(types, layers)
    dense = min(3, layers)
    mlp = mlp_types(raw.get("mlp_layer_types") or ["dense"] * dense + ["sparse"] * (layers - dense), layers)
    rope = raw.get("rope_parameters") or {SLIDING: {"rope_type": "default", "rope_theta": 10000.0}, FULL: None}
    sliding = rope.get(SLIDING) if isinstance(rope, dict) else None
    if not isinstance(rope, dict) or rope.get(FULL) is not None or not isinstance(sliding, dict) \
            or sliding.get("rope_type", "default") != "default" or sliding.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelLoadError(f"config.json: Beam is served with default RoPE over whole heads in its sliding layers "
                             f"and none in its full layers (rope_parameters full_attention null), got {rope!r}")
    return {**raw, "layer_types": types, "mlp_layer_types": mlp, "use_qk_norm": True, "partial_rotary_factor": 1.0,
            "rope_parameters": None, "rope_scaling": None, "rope_theta": float(sliding.get("rope_theta") or 10000.0),
            "n_shared_experts": 0}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Beam sets (``rewrite`` has run)."""
    layers = int(raw["num_hidden_layers"])
    sliding = tuple(i for i, t in enumerate(raw["layer_types"]) if t == SLIDING)
    cap = raw.get("final_logit_softcapping")
    return {"architecture": ARCH, "sandwich_norms": True, "depth_scaled_residuals": True,
            "attn_output_gate": "own", "attn_gate_head_bias": True, "attention_bias": False, "o_proj_bias": False,
            "sliding_window": window_where_sliding(raw, sliding),
            "sliding_layers": sliding if 0 < len(sliding) < layers else None,
            "nope_layers": tuple(i for i in range(layers) if i not in sliding), "nope_query_power": NOPE_QUERY_POWER,
            "final_softcap": float(cap) if cap else None}
