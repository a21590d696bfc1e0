"""Microsoft's BioGPT (``BioGptForCausalLM``: BioGPT, BioGPT-Large): OPT's block (opt.py) under its own names, read
from its config as transformers reads it. No torch at import (the scheduler reads configs).

* Learned absolute positions indexed from 2, as OPT's; the token embeddings scaled by sqrt(hidden_size) with
  ``scale_embedding``; torch's LayerNorms with biases (their default epsilon: ``layer_norm_eps`` is not read)
  before attention and the MLP, and at the end; biases on every projection; an ungated GELU MLP (``fc1``, ``fc2``); the output head (``output_projection``)
  tied to the embeddings.
"""

from __future__ import annotations

import math
from typing import Any

from services.engine import opt

ARCH = "BioGptForCausalLM"
NAMES: dict[str, str] = {}
DEFAULTS = {"vocab_size": 42384, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
            "intermediate_size": 4096, "hidden_act": "gelu", "max_position_embeddings": 1024,
            "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": True, "scale_embedding": True}
IGNORED = ("hidden_dropout_prob", "attention_probs_dropout_prob", "activation_dropout", "layerdrop", "num_key_value_heads",
           "attention_bias", "mlp_bias", "rope_theta", "rope_scaling", "rope_parameters", "layer_norm_eps", "rms_norm_eps")
RENAMES = (("biogpt.embed_tokens.", "model.embed_tokens."), ("biogpt.embed_positions.", "model.embed_positions."),
           ("biogpt.layer_norm.", "model.norm."), ("biogpt.layers.", "model.layers."),
           ("output_projection.", "lm_head."), *opt.RENAMES[4:])


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its norms' epsilon is torch's LayerNorm default: transformers' BioGPT reads no layer_norm_eps."""
    return {**raw, "num_key_value_heads": raw["num_attention_heads"], "rms_norm_eps": 1e-5}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    return {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": True, "attention_bias": True,
            "o_proj_bias": True, "learned_positions": opt.POSITION_OFFSET,
            "nope_layers": tuple(range(int(raw["num_hidden_layers"]))), "architecture": ARCH,
            "embed_scale": math.sqrt(int(raw["hidden_size"])) if raw["scale_embedding"] else 1.0}
