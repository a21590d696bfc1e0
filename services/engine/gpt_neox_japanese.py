"""ABEJA's GPT-NeoX Japanese (``GPTNeoXJapaneseForCausalLM``: gpt-neox-japanese-2.7b): what sets it apart from
Llama, which it runs as, read from its config as transformers reads it. No torch at import (the scheduler reads
configs).

* GPT-NeoX's pre-norm block (gpt_neox.py without ``use_parallel_residual``): torch's LayerNorms with biases, one
  ``query_key_value`` laid out per head (split as it loads), no grouped queries, RoPE over the first
  ``rotary_pct`` of each head (all of it by default), and an ungated MLP ``intermediate_multiple_size`` times
  the hidden size wide; no biases on the projections...
* ...but the last layer's attention output, which adds ``dense_bias``: the other layers' o_proj take biases of
  zeros as they load, which add nothing.
* The output head ``embed_out`` is tied to ``embed_in`` by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "GPTNeoXJapaneseForCausalLM"
NAMES = {"layer_norm_eps": "rms_norm_eps", "rotary_emb_base": "rope_theta"}
DEFAULTS = {"vocab_size": 32000, "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
            "intermediate_multiple_size": 4, "hidden_act": "gelu", "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "bos_token_id": 31996, "eos_token_id": 31999, "tie_word_embeddings": True}
IGNORED = ("hidden_dropout", "attention_dropout", "num_key_value_heads", "intermediate_size", "attention_bias",
           "mlp_bias", "head_dim")
PREFIX = "gpt_neox_japanese."
RENAMES = ((f"{PREFIX}embed_in.", "model.embed_tokens."), (f"{PREFIX}layers.", "model.layers."),
           (f"{PREFIX}final_layer_norm.", "model.norm."), ("embed_out.", "lm_head."),
           (".attention.dense_bias", ".self_attn.o_proj.bias"), (".attention.dense.", ".self_attn.o_proj."),
           (".attention.", ".self_attn."), (".mlp.dense_h_to_4h.", ".mlp.up_proj."),
           (".mlp.dense_4h_to_h.", ".mlp.down_proj."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its MLP's width and its one key/value head per query head, as transformers derives them; ``rotary_pct``
    under the name Llama's reader takes."""
    heads = int(raw["num_attention_heads"])
    partial = raw.get("rotary_pct") or raw.get("partial_rotary_factor")
    return {**{k: v for k, v in raw.items() if k != "rotary_pct"},
            "intermediate_size": int(int(raw["hidden_size"]) * raw["intermediate_multiple_size"]),
            "num_key_value_heads": heads, "head_dim": int(raw["hidden_size"]) // heads,
            **({"partial_rotary_factor": float(partial)} if partial else {})}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    return {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": False, "attention_bias": False,
            "o_proj_bias": True, "partial_rotary_factor": raw["partial_rotary_aside"], "qkv_layout": "per_head",
            "architecture": ARCH}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors, with a bias of zeros for each layer's attention output but the last's (the one
    that has one), and less the causal-mask buffers older checkpoints saved."""
    import torch

    for name, tensor in weights:
        if not name.endswith((".attention.bias", ".attention.masked_bias")):
            yield name, tensor
    for layer in range(config.num_hidden_layers - 1):
        yield f"{PREFIX}layers.{layer}.attention.dense_bias", torch.zeros(config.hidden_size)
