"""Moonshot's Kimi Linear (Kimi-Linear-48B-A3B: ``KimiLinearForCausalLM``): DeepSeek-V3's latent attention and
routing with what sets it apart, read from its config as transformers reads it. No torch at import (the
scheduler reads configs).

* Three layers of four (``linear_attn_config``'s ``kda_layers``, 1-based, or ``layer_types``) are Kimi Delta
  Attention (kda.py); the rest latent attention without positions (no layer rotates: the cache's rotated block
  is a plain part of the key).
* Experts route as DeepSeek-V3's do (sigmoid scores plus a correction bias, in groups, renormalized with
  ``moe_renormalize``), beside ``num_shared_experts`` experts' worth of an ungated shared MLP, from layer
  ``first_k_dense_replace`` (or as ``mlp_layer_types`` says).
* Its checkpoints keep the experts under ``block_sparse_moe`` and each KDA layer's q, k and v convolutions apart;
  ``checkpoint_names`` gives the model's names and joins the convolutions (transformers' own names too).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import FULL_ATTENTION, LINEAR_ATTENTION, KdaShape

if TYPE_CHECKING:
    import torch

ARCH = "KimiLinearForCausalLM"
# Its fields under DeepSeek-V3's names (transformers' attribute_map).
NAMES = {"model_max_length": "max_position_embeddings", "moe_renormalize": "norm_topk_prob",
         "num_expert_group": "n_group", "num_experts": "n_routed_experts", "num_local_experts": "n_routed_experts",
         "num_experts_per_token": "num_experts_per_tok", "num_shared_experts": "n_shared_experts"}
DEFAULTS = {"vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
            "num_hidden_layers": 27, "num_attention_heads": 32, "n_shared_experts": 1, "routed_scaling_factor": 2.446,
            "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8, "norm_topk_prob": True,
            "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5, "bos_token_id": 163584,
            "eos_token_id": 163586, "tie_word_embeddings": False, "n_routed_experts": 256}
# Fields transformers' Kimi Linear does not read: no RoPE, its routing fixed (its remote code's switches), the
# KV heads and head width latent attention sets.
IGNORED = ("rope_theta", "rope_scaling", "rope_parameters", "mla_use_nope", "moe_router_activation_func",
           "use_grouped_topk", "moe_layer_freq", "topk_method", "scoring_func", "head_dim", "num_key_value_heads",
           "num_nextn_predict_layers")
RENAMES = ((".block_sparse_moe.", ".mlp."), (".self_attn.forget_gate.", ".self_attn."))
# What KDA layers hold joined (rows in this order), from the checkpoints' parts.
_JOINS = {"conv1d": ("q_conv1d", "k_conv1d", "v_conv1d"), "qkv_proj": ("q_proj", "k_proj", "v_proj")}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(\w+)\.weight$")


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types and KDA shape from ``linear_attn_config`` where the checkpoint nests them, as
    transformers reads them; its rotated block stored as it is used (nothing rotates)."""
    layers, nested = int(raw["num_hidden_layers"]), raw.get("linear_attn_config") or {}
    types = raw.get("layer_types")
    if types is None and "kda_layers" in nested and "full_attn_layers" in nested:
        types = [None] * layers
        for key, kind in (("full_attn_layers", FULL_ATTENTION), ("kda_layers", LINEAR_ATTENTION)):
            for one_based in nested[key]:
                if not isinstance(one_based, int) or not 1 <= one_based <= layers:
                    raise ModelLoadError(f"config.json: linear_attn_config's {key} must list layers 1 to {layers}, "
                                         f"got {one_based!r}")
                types[one_based - 1] = kind
    if types is None:
        types = [FULL_ATTENTION if i and i % 4 == 0 else LINEAR_ATTENTION for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {FULL_ATTENTION, LINEAR_ATTENTION}:
        raise ModelLoadError(f"config.json: Kimi Linear's layers must each be {FULL_ATTENTION} or "
                             f"{LINEAR_ATTENTION} ({layers} of them), got {types!r}")
    return {**raw, "layer_types": types, "rope_interleave": False,
            "linear_head_dim": nested.get("head_dim", raw.get("linear_head_dim", 128)),
            "linear_num_heads": nested.get("num_heads", raw.get("linear_num_heads", 32)),
            "linear_conv_kernel_dim": nested.get("short_conv_kernel_size", raw.get("linear_conv_kernel_dim", 4))}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Kimi Linear sets (``rewrite`` has run)."""
    shape = KdaShape(int(raw["linear_num_heads"]), int(raw["linear_head_dim"]), int(raw["linear_conv_kernel_dim"]))
    if min(shape.num_heads, shape.head_dim) < 1 or shape.conv_kernel < 2:
        raise ModelLoadError(f"config.json: Kimi Delta Attention needs positive heads and widths and a convolution of "
                             f"at least 2, got {shape}")
    layers = int(raw["num_hidden_layers"])
    return {"linear_layers": tuple(i for i, t in enumerate(raw["layer_types"]) if t == LINEAR_ATTENTION),
            "linear_attention": shape, "nope_layers": tuple(range(layers)), "architecture": ARCH}


def checkpoint_names(weights: Iterator[tuple[str, torch.Tensor]], kda_layers: tuple[int, ...],
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """Its tensors under the model's names: experts and the shared MLP under ``mlp``, the forget gate's tensors
    on the layer (``A_log`` as one number a head), and each KDA layer's q, k and v projections joined into one
    ``qkv_proj`` (one GEMM a step instead of three and a concatenation) and its three convolutions into one
    ``conv1d``; each part held until the layer's others arrive."""
    import torch

    parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}  # (layer prefix, joined name) -> part -> tensor
    for name, tensor in weights:
        for old, new in RENAMES:
            name = name.replace(old, new)
        if name.endswith(".self_attn.A_log"):
            tensor = tensor.reshape(-1)
        joined = _joined(name, kda_layers)
        if joined is None:
            yield name, tensor
            continue
        prefix, target, part = joined
        held = parts.setdefault((prefix, target), {})
        held[part] = tensor
        if len(held) == len(_JOINS[target]):
            del parts[(prefix, target)]
            yield f"{prefix}{target}.weight", torch.cat([held[p] for p in _JOINS[target]], dim=0)
    if parts:
        raise KeyError(f"{', '.join(sorted(p + t for p, t in parts))}: a KDA layer lacks some of its q, k and v "
                       "parts")


def joined_part(name: str, kda_layers: tuple[int, ...]) -> bool:
    """Whether ``name`` is a part of a KDA layer's joined tensors (its q, k or v projection or convolution)."""
    return _joined(name, kda_layers) is not None


def _joined(name: str, kda_layers: tuple[int, ...]) -> tuple[str, str, str] | None:
    """(layer prefix, joined tensor, part) for a part of one of a KDA layer's joined tensors, else None (latent
    attention's q_proj is its own)."""
    m = _LAYER.match(name)
    target = next((t for t, parts in _JOINS.items() if m[2] in parts), None) if m else None
    if target is None or int(m[1]) not in kda_layers:
        return None
    return f"model.layers.{m[1]}.self_attn.", target, m[2]
