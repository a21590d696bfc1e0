"""Ai2's OLMo Hybrid (``OlmoHybridForCausalLM``): what sets it apart from OLMo 2, which it runs as, read from its
config as transformers reads it. No torch at import (the scheduler reads configs).

* Its attention layers are OLMo 3's without windows: norms on each sublayer's output (post-norms), q and k
  RMS-normed over their whole projections, then RoPE (its config class fills in a base where none is named).
* Its linear layers (every layer but each fourth, by default) are pre-norm blocks (``pre_norm_layers``) around
  Qwen3.5's Gated DeltaNet stored as separate q/k/v/g/a/b projections and q/k/v convolutions (q, k and v loaded
  into the fused ``in_proj_qkv`` (model._FUSED), their convolutions joined into ``conv1d`` as they stream by:
  ``checkpoint_weights``; the gate ``g_proj`` is Qwen's ``z``), with beta doubled (``linear_allow_neg_eigval``: the
  delta rule's eigenvalues may be negative) and the output's gated norm at epsilon 1e-5.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import FULL_ATTENTION, LINEAR_ATTENTION, linear_attention_fields

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "OlmoHybridForCausalLM"
DEFAULTS = {"vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 30, "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
            "eos_token_id": 100257, "pad_token_id": 100277, "tie_word_embeddings": False,
            "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True}
IGNORED = ("attention_bias", "mlp_bias", "head_dim", "sliding_window")
# Its checkpoints' names (transformers renames them so as it loads).
RENAMES = ((".attention_layer_norm.", ".input_layernorm."), (".feedforward_layer_norm.", ".post_attention_layernorm."),
           (".linear_attn.g_proj.", ".linear_attn.in_proj_z."), (".linear_attn.a_proj.", ".linear_attn.in_proj_a."),
           (".linear_attn.b_proj.", ".linear_attn.in_proj_b."), (".linear_attn.o_proj.", ".linear_attn.out_proj."),
           (".linear_attn.o_norm.", ".linear_attn.norm."))
NORM_EPS = 1e-5  # the gated output norm's, whatever rms_norm_eps says


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """transformers' defaults where the config leaves them out: a full-attention layer every fourth (the last
    one at least), linear heads and widths from the attention's."""
    layers, heads = int(raw["num_hidden_layers"]), int(raw["num_attention_heads"])
    types = raw.get("layer_types")
    if types is None:
        types = [FULL_ATTENTION if i % 4 == 3 else LINEAR_ATTENTION for i in range(layers)]
        if FULL_ATTENTION not in types:
            types[-1] = FULL_ATTENTION
    if LINEAR_ATTENTION not in types or FULL_ATTENTION not in types:
        raise ModelLoadError("config.json: OLMo Hybrid's layer_types must hold linear_attention and full_attention "
                             "layers both")
    key_heads = int(raw.get("linear_num_key_heads") or heads)
    key_dim = int(raw.get("linear_key_head_dim") or int(0.75 * int(raw["hidden_size"]) / key_heads))
    return {**raw, "layer_types": types, "linear_num_key_heads": key_heads,
            "linear_num_value_heads": int(raw.get("linear_num_value_heads") or heads), "linear_key_head_dim": key_dim,
            "linear_value_head_dim": int(raw.get("linear_value_head_dim") or 2 * key_dim),
            "num_key_value_heads": int(raw.get("num_key_value_heads") or heads)}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    linear = linear_attention_fields(raw, grouped_projections=False)
    beta = 2.0 if raw["linear_allow_neg_eigval"] else 1.0
    shape = dataclasses.replace(linear["linear_attention"], beta_scale=beta, norm_eps=NORM_EPS, separate_qkv=True)
    return {**linear, "linear_attention": shape,
            "pre_norm_layers": linear["linear_layers"], "sliding_window": None, "sliding_layers": None,
            "architecture": ARCH}


_CONVS = ("q_conv1d", "k_conv1d", "v_conv1d")


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Each linear layer's q, k and v convolutions joined in that order into the fused ``conv1d`` (transformers
    joins them so; a checkpoint it saved splits the joined weight into equal thirds, which join back the same)."""
    import torch

    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        module, _, part = name.rpartition(".")
        layer, _, conv = module.rpartition(".")
        if part != "weight" or conv not in _CONVS or not layer.endswith(".linear_attn"):
            yield name, tensor
            continue
        parts = waiting.setdefault(layer, {})
        parts[conv] = tensor
        if len(parts) == len(_CONVS):
            del waiting[layer]
            joined = torch.cat([parts[c] for c in _CONVS])
            if joined.shape[0] != config.linear_attention.conv_dim:
                raise ModelLoadError(f"{layer}'s q, k and v convolutions have {joined.shape[0]} channels; its "
                                     f"projections need {config.linear_attention.conv_dim}")
            yield f"{layer}.conv1d.weight", joined
    for layer, parts in waiting.items():
        raise KeyError(f"{layer} lacks {', '.join(f'{c}.weight' for c in _CONVS if c not in parts)}")
