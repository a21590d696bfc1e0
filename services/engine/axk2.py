"""SK Telecom's A.X K2 (``AXK2ForCausalLM``): DeepSeek-V3.2 (latent attention whose queries attend the keys their
indexer ranks highest: dsa.py) with what sets it apart, read from its config as transformers reads it. No torch
(the scheduler reads configs).

* ``q_b_proj`` reads the query bottleneck normed and not, side by side, and gives each head its query and a gate
  of ``v_head_dim`` whose sigmoid scales that head's output (``mla_query_gate``).
* Each layer's input norm, and its MLP's input norm where it routes, is an RMSNorm scaled by the sigmoid of a
  SiLU MLP of ``gated_norm_rank`` of its output (``self_gated_norm_rank``; released as ``W_down`` / ``W_up``).
* Routed from ``first_k_dense_replace`` on, every ``moe_layer_freq``-th layer (``mlp_layer_types`` where given);
  in groups only where ``n_group`` is set, the other groups' experts then scored 0.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError
from services.engine.layer_types import mlp_types

ARCH = "AXK2ForCausalLM"
# transformers' AXK2Config defaults (A.X K2's shape), under DeepSeek-V3's names.
DEFAULTS = {"vocab_size": 163840, "hidden_size": 2048, "intermediate_size": 5120, "moe_intermediate_size": 512,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 32, "n_shared_experts": 1,
            "n_routed_experts": 128, "routed_scaling_factor": 2.5, "kv_lora_rank": 128, "q_lora_rank": 384,
            "qk_rope_head_dim": 32, "v_head_dim": 64, "qk_nope_head_dim": 64, "num_experts_per_tok": 8,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "bos_token_id": 163691,
            "eos_token_id": 163691, "norm_topk_prob": True, "index_topk": 2048, "index_head_dim": 128,
            "index_n_heads": 16, "gated_norm_rank": 16, "tie_word_embeddings": False}
IGNORED = ("layer_types", "head_dim")
RENAMES = (("layernorm.W_down.", "layernorm.fc1."), ("layernorm.W_up.", "layernorm.fc2."),
           ("layernorm.mlp.fc1.", "layernorm.fc1."), ("layernorm.mlp.fc2.", "layernorm.fc2."),
           ("_layernorm.norm.weight", "_layernorm.weight"), (".self_attn.q_gate_proj.", ".self_attn.q_b_proj."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its MLP layout as transformers derives it, its rotated features interleaved (always, as DeepSeek-V3.2's)."""
    layers = int(raw["num_hidden_layers"])
    if not raw.get("q_lora_rank"):
        raise ModelLoadError("config.json: A.X K2 needs a q_lora_rank (its indexer and output gate read the query "
                             "bottleneck)")
    if (raw.get("n_group") is None) != (raw.get("topk_group") is None):
        raise ModelLoadError("config.json: n_group and topk_group must be set together (or neither)")
    first, freq = int(raw.get("first_k_dense_replace", 1) or 0), int(raw.get("moe_layer_freq", 1) or 1)
    types = raw.get("mlp_layer_types") or ["sparse" if i >= first and i % freq == 0 else "dense"
                                           for i in range(layers)]
    mlp_types(types, layers)
    # DeepSeek-V3's reading of the experts' fields wants the first routed layer; fields() says which route.
    return {**{k: v for k, v in raw.items() if k != "moe_layer_freq"}, "mlp_layer_types": types,
            "first_k_dense_replace": types.index("sparse") if "sparse" in types else layers, "rope_interleave": True}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only A.X K2 sets (``rewrite`` has run), beside DeepSeek-V3.2's."""
    rank = int(raw["gated_norm_rank"])
    if rank < 1:
        raise ModelLoadError(f"config.json: gated_norm_rank must be >= 1, got {rank}")
    return {"architecture": ARCH, "mla_query_gate": True, "self_gated_norm_rank": rank,
            "moe_layers": tuple(i for i, kind in enumerate(raw["mlp_layer_types"]) if kind == "sparse"),
            "moe_groups_masked_to_zero": True}
