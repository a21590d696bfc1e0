"""Meta's XGLM (``XGLMForCausalLM``: 564M to 7.5B, multilingual): OPT's block (opt.py) under its own names with
sinusoidal positions, read from its config as transformers reads it. No torch at import (the scheduler reads
configs).

* Fixed sinusoidal positions (tensor2tensor's: sines then cosines, not interleaved) indexed from 2, as OPT's
  learned ones, added to the token embeddings scaled by sqrt(d_model) with ``scale_embedding``. The table is not in
  the checkpoint: ``position_table`` computes it as transformers does (in fp32, the row ``pad_token_id``
  zeroed, cast to the model's dtype as it loads) and the model holds it as OPT's learned table.
* torch's LayerNorms with biases (their default epsilon: the config has none) before attention and the MLP, and at
  the end; biases on every projection; an ungated GELU MLP (``fc1``, ``fc2``); the output head tied to the
  embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.engine import biogpt, opt

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "XGLMForCausalLM"
NAMES = {"d_model": "hidden_size", "ffn_dim": "intermediate_size", "num_layers": "num_hidden_layers",
         "attention_heads": "num_attention_heads", "activation_function": "hidden_act"}
DEFAULTS = {"vocab_size": 256008, "max_position_embeddings": 2048, "hidden_size": 1024, "intermediate_size": 4096,
            "num_hidden_layers": 24, "num_attention_heads": 16, "hidden_act": "gelu", "scale_embedding": True,
            "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": True}
IGNORED = ("dropout", "attention_dropout", "activation_dropout", "layerdrop", "init_std", "decoder_start_token_id",
           "add_cross_attention", "num_key_value_heads", "attention_bias", "mlp_bias", "rms_norm_eps",
           "layer_norm_eps", "rope_theta", "rope_scaling", "rope_parameters")
RENAMES = (("model.layer_norm.", "model.norm."), *opt.RENAMES[4:])


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its norms' epsilon is torch's LayerNorm default, as BioGPT's: transformers' XGLM reads none."""
    return biogpt.rewrite(raw)


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """BioGPT's (OPT's block, scaled embeddings, positions from index 2), its positions' table sinusoidal."""
    return {**biogpt.fields(raw), "architecture": ARCH,
            "sinusoidal_padding_row": None if raw.get("pad_token_id") is None else int(raw["pad_token_id"])}


def sinusoidal_positions(rows: int, dim: int, padding_row: int | None) -> torch.Tensor:
    """transformers' ``XGLMSinusoidalPositionalEmbedding.get_embedding``: ``[rows, dim]`` fp32, row p the sines
    then the cosines of p times dim // 2 frequencies from 1 down to 1/10000, a zero column where dim is odd, the
    row ``padding_row`` zeroed."""
    import torch

    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))
    angles = torch.arange(rows, dtype=torch.int64).float().unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    if padding_row is not None:
        table[padding_row] = 0
    return table


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Its tensors less any position buffer an old checkpoint saved (transformers leaves it out too)."""
    return ((name, tensor) for name, tensor in weights if ".embed_positions." not in name)


def position_table(config: ModelConfig) -> tuple[str, torch.Tensor]:
    """The position table as the model holds OPT's learned one (its name and rows): the loader adds it to the
    checkpoint's tensors, which never hold it."""
    return "model.embed_positions.weight", sinusoidal_positions(
        config.max_position_embeddings + opt.POSITION_OFFSET, config.hidden_size, config.sinusoidal_padding_row)
