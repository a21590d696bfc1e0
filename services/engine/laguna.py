"""Poolside's Laguna (``LagunaForCausalLM``: Laguna XS.2): GLM-4.5's routing beside a shared expert under AFMoE's
attention, with what sets it apart, read from its config as transformers reads it. No torch (the scheduler reads
configs).

* Each layer has query heads of its own (``num_attention_heads_per_layer``; the KV heads are the model's), q and k
  RMS-normed per head, and attention's output gated by the softplus of a projection of the layer's input
  (``g_proj``): one gate per head (``gating`` true or "per-head"), else one per feature.
* Layers are ``full_attention`` or ``sliding_attention`` (``sliding_window``) by ``layer_types``, each type with
  RoPE of its own (``rope_parameters`` per type: a base and a share of each head; the full layers' may be scaled).
* ``mlp_layer_types`` says which layers route ("sparse"); a router's fp32 logits are soft-capped
  (``moe_router_logit_softcapping``) before their sigmoids, the top k chosen by score plus a correction bias,
  weighed by their scores renormalized, times ``moe_routed_scaling_factor``; an ungated shared expert
  (``shared_expert_intermediate_size`` wide) added.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError
from services.engine.layer_types import FULL as _FULL
from services.engine.layer_types import SLIDING as _SLIDING
from services.engine.layer_types import attention_types, mlp_types, rope_by_type, window_where_sliding

ARCH = "LagunaForCausalLM"
NAMES = {"num_experts": "n_routed_experts", "moe_routed_scaling_factor": "routed_scaling_factor"}
# transformers' LagunaConfig defaults (Laguna XS.2's shape), under GLM-4.5's names.
DEFAULTS = {"vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
            "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": 512, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "n_routed_experts": 256,
            "routed_scaling_factor": 1.0, "attention_bias": False, "gating": True,
            "moe_router_logit_softcapping": 0.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
            "n_shared_experts": 1}
# GLM-4.5's fields Laguna does not read (its own say it all).
IGNORED = ("first_k_dense_replace", "partial_rotary_factor", "use_qk_norm", "output_router_logits",
           "router_aux_loss_coef", "decoder_sparse_step", "mlp_only_layers", "qkv_bias", "use_sliding_window",
           "max_window_layers")
RENAMES = ((".self_attn.g_proj.", ".self_attn.gate_proj."),
           (".mlp.experts.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"))
_ROPE = {_FULL: {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
         _SLIDING: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types, MLP types and per-type RoPE with transformers' defaults (the first layer dense); GLM-4.5's
    q/k norms, groups and renormalization as Laguna always has them; refused: router weights applied to the
    experts' inputs, which transformers refuses too."""
    if raw.get("moe_apply_router_weight_on_input"):
        raise ModelLoadError("config.json: moe_apply_router_weight_on_input is not supported (nor by transformers)")
    layers = int(raw["num_hidden_layers"])
    attention_types(raw.get("layer_types") or [_FULL] * layers, layers)
    mlp_types(raw.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1), layers)
    rope = rope_by_type(raw, _ROPE, "Laguna")
    return {**raw, "layer_types": raw.get("layer_types") or [_FULL] * layers,
            "mlp_layer_types": raw.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1),
            "rope_parameters": rope, "use_qk_norm": True, "n_group": 1, "topk_group": 1, "norm_topk_prob": True}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Laguna sets (``rewrite`` has run)."""
    layers = int(raw["num_hidden_layers"])
    heads = raw.get("num_attention_heads_per_layer") or [int(raw["num_attention_heads"])] * layers
    if not isinstance(heads, list) or len(heads) != layers:
        raise ModelLoadError(f"config.json: num_attention_heads_per_layer must give each of the {layers} layers its "
                             f"query heads, got {heads!r}")
    sliding = tuple(i for i, t in enumerate(raw["layer_types"]) if t == _SLIDING)
    window = window_where_sliding(raw, sliding)
    gating = raw["gating"]
    if gating not in (True, False, "per-head", "per-element"):
        raise ModelLoadError(f"config.json: gating must be true, 'per-head' or 'per-element', got {gating!r}")
    local = raw["rope_parameters"][_SLIDING]
    cap = float(raw["moe_router_logit_softcapping"] or 0.0)
    width = int(raw["shared_expert_intermediate_size"] or 0)
    biased = bool(raw["attention_bias"])
    return {"architecture": ARCH, "layer_query_heads": tuple(int(h) for h in heads),
            # transformers gates per head with gating true or "per-head"; otherwise (false too) per feature
            "attn_output_gate": "per_head" if gating in (True, "per-head") else "own", "attn_gate_softplus": True,
            "attention_bias": biased, "o_proj_bias": biased,
            "sliding_window": window,
            "sliding_layers": sliding if 0 < len(sliding) < layers else None,
            "local_rope_theta": float(local.get("rope_theta") or 10000.0) if sliding else None,
            "local_partial_rotary_factor": float(local.get("partial_rotary_factor") or 1.0) if sliding else None,
            "router_softcap": cap if cap > 0 else None,
            "shared_expert_intermediate_size": width}
