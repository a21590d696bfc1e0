"""Cohere's Command A MoE (``Cohere2MoeForCausalLM``): what sets it apart from Cohere 2 (Command R7B, Command A),
whose parallel block, interleaved RoPE in the sliding layers only, tied embeddings and logit scale it keeps, read
from its config as transformers reads it. No torch (the scheduler reads configs).

* Its first ``first_k_dense_replace`` layers ("dense" in ``mlp_layer_types``) keep a dense MLP of
  ``prefix_dense_intermediate_size`` and their own window pattern (``prefix_dense_sliding_window_pattern``; the
  other layers count ``sliding_window_pattern`` from the first routed one); with a pattern of 1 those layers are
  all full attention, and rotate anyway (transformers' ``force_rope``).
* The other layers route: the top k logits of a bias-free router, weighed by their softmax (fp32, cast back)
  or, with ``expert_selection_fn`` "sigmoid", their sigmoids (renormalized with ``norm_topk_prob``), to experts
  as wide as ``intermediate_size``; beside ``num_shared_experts`` experts' worth of a shared MLP whose output is
  averaged with theirs (``shared_expert_combination_strategy`` "average") or added ("sum").
* With ``rms_norm_eps`` set its norms are RMSNorms; otherwise Cohere's LayerNorm without bias (``layer_norm_eps``).
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError
from services.engine.layer_types import FULL as _FULL
from services.engine.layer_types import SLIDING as _SLIDING
from services.engine.layer_types import attention_types, mlp_types

ARCH = "Cohere2MoeForCausalLM"
# transformers' Cohere2MoeConfig defaults where Cohere 2's differ.
DEFAULTS = {"vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
            "num_attention_heads": 64, "head_dim": 128, "max_position_embeddings": 8192, "bos_token_id": 5,
            "eos_token_id": 255001, "sliding_window": 4096, "sliding_window_pattern": 4}


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types and MLP types as transformers' config fills them in, the dense layers' width as the target's
    ``intermediate_size`` (the experts' is kept for ``fields``), and RMSNorm's epsilon where it has one."""
    layers = int(raw["num_hidden_layers"])
    dense = int(raw.get("first_k_dense_replace") or 0)
    types = raw.get("layer_types")
    if types is None:
        prefix, pattern = int(raw.get("prefix_dense_sliding_window_pattern") or 1), int(raw["sliding_window_pattern"])
        types = [_SLIDING if (i + 1) % prefix else _FULL for i in range(dense)] + [
            _SLIDING if (i + 1) % pattern else _FULL for i in range(layers - dense)]
    mlp = raw.get("mlp_layer_types") or ["dense" if i < dense else "sparse" for i in range(layers)]
    attention_types(types, layers)
    mlp_types(mlp, layers)
    out = {**raw, "layer_types": types, "mlp_layer_types": mlp, "expert_intermediate_size": raw["intermediate_size"],
           "intermediate_size": raw.get("prefix_dense_intermediate_size") or raw["intermediate_size"]}
    if raw.get("rms_norm_eps") is not None:
        out["layer_norm_eps"] = raw["rms_norm_eps"]
    return out


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Cohere2-MoE sets (``rewrite`` has run)."""
    routing, combine = raw.get("expert_selection_fn", "softmax"), raw.get("shared_expert_combination_strategy", "average")
    if routing not in ("softmax", "sigmoid"):
        raise ModelLoadError(f"config.json: expert_selection_fn must be softmax or sigmoid, got {routing!r}")
    if combine not in ("average", "sum"):
        raise ModelLoadError(f"config.json: shared_expert_combination_strategy must be average or sum, got {combine!r}")
    types, mlp = raw["layer_types"], raw["mlp_layer_types"]
    forced = raw.get("prefix_dense_sliding_window_pattern", 1) == 1  # the dense layers rotate, all full attention
    window = raw.get("sliding_window")
    rotated = {i for i, t in enumerate(types) if t == _SLIDING and window} | (
        {i for i, kind in enumerate(mlp) if kind == "dense"} if forced else set())
    width = int(raw["expert_intermediate_size"])
    return {"architecture": ARCH, "num_experts": int(raw.get("num_experts") or 8),
            "num_experts_per_tok": int(raw.get("num_experts_per_tok") or 2), "moe_intermediate_size": width,
            "norm_topk_prob": bool(raw.get("norm_topk_prob", True)),
            "moe_layers": tuple(i for i, kind in enumerate(mlp) if kind == "sparse"),
            "moe_routing": "topk_softmax" if routing == "softmax" else "topk_sigmoid",
            "router_fp32": routing == "softmax",  # its softmax in fp32, its sigmoid in the router's dtype
            "shared_expert_intermediate_size": width * int(raw.get("num_shared_experts") or 0),
            "shared_expert_gated": False,  # (averaged only with a shared expert, as transformers combines them)
            "shared_expert_averaged": combine == "average" and bool(raw.get("num_shared_experts")),
            "nope_layers": tuple(i for i in range(len(types)) if i not in rotated),
            "layer_norm": raw.get("rms_norm_eps") is None}
