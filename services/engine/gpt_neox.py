"""EleutherAI's GPT-NeoX (``GPTNeoXForCausalLM``: Pythia, GPT-NeoX-20B, Dolly v2, RedPajama-INCITE, StableLM-Alpha):
what sets it apart from Llama, which it runs as, read from its config as transformers reads it. No torch at import
(the scheduler reads configs).

* torch's LayerNorms with biases; biases on every projection (``attention_bias``, default true) and on the
  ungated MLP (``dense_h_to_4h``, ``dense_4h_to_h``; exact GELU by default); untied ``embed_in`` / ``embed_out``.
* RoPE over the first ``rotary_pct`` of each head (a quarter by default), halves rotated as Llama's.
* With ``use_parallel_residual`` (the default) attention and the MLP read the same stream side by side, each
  through a norm of its own, and their outputs are summed before they join it; without, a pre-norm block.
* One ``query_key_value`` projection laid out per head, ``[q | k | v]`` rows of each head in turn (``qkv_layout``,
  split as it loads), and no grouped queries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "GPTNeoXForCausalLM"
NAMES = {"layer_norm_eps": "rms_norm_eps", "rotary_emb_base": "rope_theta", "rotary_pct": "partial_rotary_factor"}
DEFAULTS = {"vocab_size": 50432, "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 44,
            "num_attention_heads": 64, "hidden_act": "gelu", "rope_theta": 10000.0, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": False,
            "attention_bias": True, "use_parallel_residual": True}
IGNORED = ("hidden_dropout", "attention_dropout", "classifier_dropout", "mlp_bias")
RENAMES = (("gpt_neox.embed_in.", "model.embed_tokens."), ("gpt_neox.layers.", "model.layers."),
           ("gpt_neox.final_layer_norm.", "model.norm."), ("embed_out.", "lm_head."),
           (".attention.dense.", ".self_attn.o_proj."), (".attention.", ".self_attn."),
           (".mlp.dense_h_to_4h.", ".mlp.up_proj."), (".mlp.dense_4h_to_h.", ".mlp.down_proj."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """One key/value head per query head, whatever a stray ``num_key_value_heads`` says (transformers' GPT-NeoX
    has no grouped queries)."""
    return {**raw, "num_key_value_heads": raw["num_attention_heads"]}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    biased, parallel = bool(raw["attention_bias"]), bool(raw["use_parallel_residual"])
    return {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": True, "attention_bias": biased,
            "o_proj_bias": biased, "parallel_block": parallel, "parallel_mlp_norm": parallel,
            "partial_rotary_factor": raw["partial_rotary_aside"], "qkv_layout": "per_head", "architecture": ARCH}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors less the causal-mask buffers older checkpoints saved (``attention.bias``,
    ``attention.masked_bias``), which transformers leaves out too."""
    return ((name, tensor) for name, tensor in weights
            if not name.endswith((".attention.bias", ".attention.masked_bias")))
