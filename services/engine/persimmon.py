"""Adept's Persimmon (``PersimmonForCausalLM``: Persimmon-8B, and Fuyu's language model): what sets it apart from
Llama, which it runs as, read from its config as transformers reads it. No torch at import (the scheduler reads
configs).

* GPT-NeoX's pre-norm block (gpt_neox.py without ``use_parallel_residual``): torch's LayerNorms with biases,
  biases on every projection, one ``query_key_value`` laid out per head (split as it loads), an ungated MLP
  (``dense_h_to_4h``, ``dense_4h_to_h``) of squared ReLUs, RoPE over the first half of each head.
* With ``qk_layernorm`` (the default) each head of q and of k goes through a LayerNorm with a bias, one weight
  shared by the heads, before RoPE.
* The output head is its own (``lm_head``); the final norm is ``final_layernorm``.
"""

from __future__ import annotations

from typing import Any

ARCH = "PersimmonForCausalLM"
NAMES = {"layer_norm_eps": "rms_norm_eps"}
DEFAULTS = {"vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 36,
            "num_attention_heads": 64, "hidden_act": "relu2", "max_position_embeddings": 16384,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2,
            "tie_word_embeddings": False, "qk_layernorm": True}
IGNORED = ("hidden_dropout", "attention_dropout", "num_key_value_heads", "attention_bias", "mlp_bias", "head_dim")
RENAMES = ((".self_attn.dense.", ".self_attn.o_proj."), (".self_attn.q_layernorm.", ".self_attn.q_norm."),
           (".self_attn.k_layernorm.", ".self_attn.k_norm."), (".mlp.dense_h_to_4h.", ".mlp.up_proj."),
           (".mlp.dense_4h_to_h.", ".mlp.down_proj."), ("model.final_layernorm.", "model.norm."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """One key/value head per query head, each hidden_size / heads wide, whatever stray fields say (transformers'
    Persimmon reads neither)."""
    return {**raw, "num_key_value_heads": raw["num_attention_heads"],
            "head_dim": int(raw["hidden_size"]) // int(raw["num_attention_heads"])}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    return {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": True, "attention_bias": True,
            "o_proj_bias": True, "qk_norm": bool(raw["qk_layernorm"]),
            "partial_rotary_factor": raw["partial_rotary_aside"], "qkv_layout": "per_head", "architecture": ARCH}
