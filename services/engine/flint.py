"""RecursiveSI's Flint (``FlintForCausalLM``): Qwen3-MoE's attention (q/k norms) and experts with what sets it
apart, read from its config as transformers reads it. No torch (the scheduler reads configs).

* Layers are ``full_attention`` (the first two, every fourth from the second, the last: transformers' default
  layout) or ``sliding_attention`` (``sliding_window``) by ``layer_types``; only the sliding layers rotate, the
  full ones attend without positions.
* Every layer has a learned sink per head (GPT-OSS's: one more logit in each softmax; released as
  ``softmax_offset``), the scores and the sinks' softmax in fp32.
* Routed from past ``mlp_only_layers`` (default the first two): the top k of the fp32 router's sigmoids,
  renormalized with ``norm_topk_prob``, beside an ungated shared expert ``shared_expert_intermediate_size`` wide;
  RMSNorms apply their weight before the cast back (GPT-OSS's order).
"""

from __future__ import annotations

from typing import Any

from services.engine.layer_types import FULL as _FULL
from services.engine.layer_types import SLIDING as _SLIDING
from services.engine.layer_types import attention_types, window_where_sliding

ARCH = "FlintForCausalLM"
# transformers' FlintConfig defaults where Qwen3-MoE's differ (Flint's shape).
DEFAULTS = {"vocab_size": 150144, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 49,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": 513, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 1024, "num_experts_per_tok": 6, "num_experts": 256,
            "norm_topk_prob": True, "mlp_only_layers": [0, 1], "decoder_sparse_step": 1, "tie_word_embeddings": False,
            "attention_bias": False}
# Qwen3-MoE's window fields, which Flint does not read (its layer_types say it all).
IGNORED = ("use_sliding_window", "max_window_layers")
RENAMES = ((".self_attn.softmax_offset", ".self_attn.sinks"),)


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types as transformers lays them out by default."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or [_FULL if i < 2 or i % 4 == 1 or i == layers - 1 else _SLIDING
                                       for i in range(layers)]
    return {**raw, "layer_types": attention_types(types, layers), "mlp_only_layers": raw.get("mlp_only_layers") or []}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Flint sets (``rewrite`` has run)."""
    types = raw["layer_types"]
    sliding = tuple(i for i, t in enumerate(types) if t == _SLIDING)
    window = window_where_sliding(raw, sliding)
    return {"architecture": ARCH, "attention_sinks": True, "sliding_window": window,
            "sliding_layers": sliding if 0 < len(sliding) < len(types) else None,
            "nope_layers": tuple(i for i, t in enumerate(types) if t == _FULL),
            "moe_routing": "topk_sigmoid", "router_fp32": True, "shared_expert_gated": False,
            "shared_expert_intermediate_size": int(raw.get("shared_expert_intermediate_size") or 0)}
