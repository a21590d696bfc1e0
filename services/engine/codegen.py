"""Salesforce's CodeGen (``CodeGenForCausalLM``: codegen-350M to 16B, mono, multi and nl): GPT-J's block
(gptj.py) with q, k and v in one ``qkv_proj``, laid out as the four model-parallel shards it was trained on: each
shard's queries, then its values, then its keys. Split into GPT-J's three projections as it loads. No torch at
import (the scheduler reads configs)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.engine import gptj

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "CodeGenForCausalLM"
NAMES, DEFAULTS, IGNORED, RENAMES, rewrite = gptj.NAMES, gptj.DEFAULTS, gptj.IGNORED, gptj.RENAMES, gptj.rewrite
_SHARDS = 4  # transformers' CodeGenAttention.mp_num


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    return {**gptj.fields(raw), "architecture": ARCH}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig | None = None,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Its tensors as GPT-J's (``gptj.checkpoint_weights``): ``qkv_proj`` split into q, k and v (each shard's
    ``[q | v | k]`` rows, the shards' parts joined in order), the causal-mask buffer older code saved left out."""

    def split(named: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named:
            if name.endswith(".attn.causal_mask"):
                continue
            if ".attn.qkv_proj." not in name:
                yield name, tensor
                continue
            shards = tensor.reshape(_SHARDS, 3, -1, *tensor.shape[1:])
            for part, rows in zip(("q_proj", "v_proj", "k_proj"), shards.unbind(1), strict=True):
                yield name.replace(".qkv_proj.", f".{part}."), rows.reshape(-1, *tensor.shape[1:]).contiguous()

    return gptj.checkpoint_weights(split(weights), config)
