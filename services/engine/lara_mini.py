"""Lara Mini (``LaraMiniForCausalLM``): Qwen3.5-MoE's Gated DeltaNet layers beside Qwen3's attention, with what
sets it apart, read from its config as transformers reads it. No torch at import (the scheduler reads configs).

* Layers by ``layer_types``: Gated DeltaNet (``linear_attention``), attention over a window (``sliding_attention``,
  the only layers that rotate) or over every key without positions (``full_attention``); by default the pattern
  linear, sliding, linear, full, sliding, repeated. Attention has Qwen3's q/k norms and no output gate.
* Plain RMSNorms (a scale of w, not Gemma's 1 + w); every layer routes: the top k of an fp32 softmax,
  renormalized, beside an ungated shared expert.
* Released with each linear layer's q, k, v, z, b and a projections in one ``in_proj`` (split as it loads, a LoRA
  adapter's B too) and its gated norm named ``out_norm``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine.layer_types import window_where_sliding
from services.engine.linear_attention_config import FULL_ATTENTION, LINEAR_ATTENTION, linear_attention_fields

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "LaraMiniForCausalLM"
SLIDING = "sliding_attention"
_PATTERN = (LINEAR_ATTENTION, SLIDING, LINEAR_ATTENTION, FULL_ATTENTION, SLIDING)
# transformers' LaraMiniConfig defaults where Qwen3.5-MoE's differ.
DEFAULTS = {"vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 34, "num_attention_heads": 16,
            "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "sliding_window": 512, "num_experts": 128, "num_experts_per_tok": 4,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "tie_word_embeddings": True,
            "linear_num_key_heads": 8, "linear_num_value_heads": 16, "eos_token_id": 151643}
RENAMES = ((".linear_attn.out_norm.", ".linear_attn.norm."),)


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types as transformers lays them out by default; every layer routes."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or [_PATTERN[i % len(_PATTERN)] for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or set(types) - {*_PATTERN}:
        raise ModelLoadError(f"config.json: layer_types must name each of the {layers} layers linear_attention, "
                             f"sliding_attention or full_attention, got {types!r}")
    return {**raw, "layer_types": types, "qkv_bias": bool(raw.get("attention_bias")), "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "intermediate_size": raw["moe_intermediate_size"]}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Lara Mini sets (``rewrite`` has run)."""
    types = raw["layer_types"]
    sliding = tuple(i for i, t in enumerate(types) if t == SLIDING)
    window = window_where_sliding(raw, sliding)
    attends = [t for t in types if t != LINEAR_ATTENTION]
    return {"architecture": ARCH, "qk_norm": True, "o_proj_bias": bool(raw.get("attention_bias")),
            "partial_rotary_factor": raw["partial_rotary_aside"], "shared_expert_gated": False,
            "sliding_window": window,
            "sliding_layers": sliding if 0 < len(sliding) < len(attends) else None,
            "nope_layers": tuple(i for i, t in enumerate(types) if t == FULL_ATTENTION),
            **linear_attention_fields({**raw, "layer_types": [t if t == LINEAR_ATTENTION else FULL_ATTENTION
                                                              for t in types]}, grouped_projections=False)}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Each linear layer's ``in_proj`` (rows q, k, v, then z, b, a) as Qwen3.5's four projections."""
    s = config.linear_attention
    sizes = {"in_proj_qkv": s.conv_dim, "in_proj_z": s.value_dim, "in_proj_b": s.num_value_heads,
             "in_proj_a": s.num_value_heads}
    for name, tensor in weights:
        if ".linear_attn.in_proj." not in name:
            yield name, tensor
            continue
        if tensor.shape[0] != sum(sizes.values()):
            raise ModelLoadError(f"{name} has {tensor.shape[0]} rows; q, k, v, z, b and a need {sum(sizes.values())}")
        for (part, _), rows in zip(sizes.items(), tensor.split(list(sizes.values())), strict=True):
            yield name.replace(".in_proj.", f".{part}."), rows.contiguous()
