"""Zyphra's Zamba2 (Zamba2-1.2B, -2.7B, -7B and their instruct models: ``Zamba2ForCausalLM``): what sets it apart,
read from its config as transformers reads it. No torch (the scheduler reads configs); the layers are in
zamba2_layer.py.

* Every layer is a pre-norm Mamba-2 mixer added to the stream, with no MLP (mamba2.py; gated, then normed in
  ``mamba_ngroups`` groups; a prompt's ``dt`` at least ``time_step_min``, a decode's not: transformers clamps it
  in its chunked scan only).
* Before the mixer, each "hybrid" layer runs a shared transformer block: attention and a GELU-gated MLP, on the
  stream concatenated with the token embeddings (``2 * hidden_size`` wide, so ``2 * hidden_size / heads`` per
  head, scores scaled by ``(head_dim / 2) ** -0.5``), RoPE only with ``use_mem_rope``. There are
  ``num_mem_blocks`` such blocks (hybrid layer k runs block k mod ``num_mem_blocks``), so their weights are
  shared, but each hybrid layer keeps its own KV and has its own low-rank adapters: on the MLP's gate/up
  projection, and with ``use_shared_attention_adapter`` on q, k and v. The block's output goes through the
  layer's own ``linear`` and is added to the mixer's input, not to the stream.
* Checkpoints hold a block's weights once, under the first hybrid layer that runs it, and each layer's adapters
  there as ``*_adapter_list.K`` (K: the hybrid layer's rank); ``checkpoint_names`` gives each tensor the name
  the model holds it by.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import mamba2_fields

if TYPE_CHECKING:
    import torch

ARCH = "Zamba2ForCausalLM"
_HYBRID, _MAMBA = "hybrid", "linear_attention"
_LEGACY = {"mamba": _MAMBA}
# Its Mamba-2 fields under the names mamba2_fields reads.
NAMES = {"n_mamba_heads": "mamba_n_heads", "mamba_ngroups": "mamba_n_groups", "chunk_size": "mamba_chunk_size",
         "use_conv_bias": "zamba_use_conv_bias", "add_bias_linear": "mamba_proj_bias"}
# transformers' Zamba2Config defaults (Zamba2-2.7B's shape).
DEFAULTS = {"vocab_size": 32000, "hidden_size": 2560, "num_hidden_layers": 54, "num_attention_heads": 32,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "hidden_act": "gelu", "mamba_d_state": 64,
            "mamba_d_conv": 4, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 8, "mamba_chunk_size": 256,
            "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# Derived fields its config also stores (recomputed from the others, as transformers does) and what it does not
# read for inference.
IGNORED = ("attention_hidden_size", "attention_head_dim", "head_dim", "mamba_headdim", "kv_channels",
           "num_query_groups", "hybrid_layer_ids", "ffn_hidden_size", "use_mamba_kernels", "use_mem_eff_path",
           "num_logits_to_keep", "time_step_max", "time_step_floor", "time_step_limit", "attention_bias",
           "mlp_bias", "layer_types", "use_shared_mlp_adapter")


@dataclass(frozen=True)
class SharedBlocks:
    """Zamba2's shared transformer blocks: where they run and the adapters each of those layers has."""

    layers: tuple[int, ...]  # the hybrid layers, in order; hybrid layer k runs block k % num_blocks
    num_blocks: int
    adapter_rank: int
    attention_adapters: bool  # q, k and v adapters too (the MLP's gate/up one is always there)
    use_rope: bool

    def block_of(self, layer: int) -> int:
        return self.layers.index(layer) % self.num_blocks

    def first_of_block(self, layer: int) -> int:
        """The first hybrid layer that runs ``layer``'s block: where a checkpoint holds the block's weights."""
        return self.layers[self.block_of(layer)]


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types as transformers reads them (the legacy "mamba" as "linear_attention"; its default 54-layer
    pattern when unset), which also sets the layer count; the MLP's width (default 4 x hidden); and the
    context of ``use_long_context``."""
    types = raw.get("layers_block_type")
    if types is None:
        types = [_MAMBA] + ([_MAMBA] * 5 + [_HYBRID]) * 7 + [_MAMBA] * 4 + [_HYBRID] + [_MAMBA] * 3 + [_HYBRID] \
            + [_MAMBA] * 2
    if not isinstance(types, list) or not types:
        raise ModelLoadError(f"config.json: layers_block_type must be a list of layer types, got {types!r}")
    types = [_LEGACY.get(t, t) for t in types]
    unknown = sorted({str(t) for t in types if t not in (_MAMBA, _HYBRID)})
    if unknown:
        raise ModelLoadError(f"config.json: layers_block_type holds {', '.join(unknown)}; each Zamba2 layer is "
                             f"mamba ({_MAMBA}) or {_HYBRID}")
    out = {**raw, "layers_block_type": types, "num_hidden_layers": len(types),
           "intermediate_size": raw.get("intermediate_size") or 4 * int(raw["hidden_size"])}
    if raw.get("use_long_context"):
        out["max_position_embeddings"] = 16384
    return out


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Zamba2 sets (``rewrite`` has run): a Mamba-2 mixer in every layer, the
    shared blocks' layers and adapters, attention over twice the hidden width."""
    types, hidden, heads = raw["layers_block_type"], int(raw["hidden_size"]), int(raw["num_attention_heads"])
    if raw.get("hidden_act", "gelu") != "gelu":
        raise ModelLoadError(f"config.json: hidden_act {raw['hidden_act']!r}; Zamba2's MLP gates through gelu")
    if (2 * hidden) % heads:
        raise ModelLoadError(f"config.json: num_attention_heads ({heads}) must divide 2 * hidden_size ({2 * hidden}): "
                             "Zamba2 attends over the stream and the embeddings side by side")
    hybrid = tuple(i for i, t in enumerate(types) if t == _HYBRID)
    blocks = SharedBlocks(hybrid, int(raw.get("num_mem_blocks") or 1), int(raw.get("adapter_rank") or 128),
                          bool(raw.get("use_shared_attention_adapter")), bool(raw.get("use_mem_rope")))
    if blocks.num_blocks < 1 or blocks.adapter_rank < 1:
        raise ModelLoadError(f"config.json: num_mem_blocks and adapter_rank must be >= 1, got {blocks.num_blocks} "
                             f"and {blocks.adapter_rank}")
    if blocks.attention_adapters and int(raw.get("num_key_value_heads") or heads) != heads:
        raise ModelLoadError("config.json: use_shared_attention_adapter needs num_key_value_heads equal to "
                             "num_attention_heads (each adapter is as wide as the queries, as transformers builds it)")
    head_dim = 2 * hidden // heads
    limit = (float(raw.get("time_step_min", 0.001)), float("inf"))
    # Its mixers' convolutions always have a bias (transformers does not read use_conv_bias), and their gated
    # norms a fixed epsilon.
    mamba = mamba2_fields({**raw, "layer_types": types, "time_step_limit": limit, "mamba_conv_bias": True},
                          (_MAMBA, _HYBRID), norm_eps=1e-5)
    return {**mamba, "shared_blocks": blocks, "head_dim": head_dim, "attn_scale": (head_dim / 2) ** -0.5,
            "nope_layers": () if blocks.use_rope else hybrid, "mlp_bias": bool(raw.get("mamba_proj_bias")),
            "architecture": ARCH}


_ADAPTER = re.compile(r"model\.layers\.(\d+)\.shared_transformer\.(self_attn|feed_forward)\."
                      r"(linear_[qkv]_adapter|gate_up_proj_adapter)_list\.(\d+)\.([01])\.weight")


def checkpoint_names(weights: Iterator[tuple[str, torch.Tensor]],
                     blocks: SharedBlocks) -> Iterator[tuple[str, torch.Tensor]]:
    """Its tensors under the names the model holds them by: a hybrid layer's ``mamba_decoder.*`` as the layer's
    own, each adapter under the hybrid layer it adapts, ``final_layernorm`` as ``norm``. A shared block's weights
    keep the first layer's name (its later layers hold the same tensors)."""
    for name, tensor in weights:
        name = name.replace(".mamba_decoder.", ".").replace("model.final_layernorm.", "model.norm.")
        m = _ADAPTER.fullmatch(name)
        if m is not None:
            rank = int(m[4])
            if rank >= len(blocks.layers):
                raise ModelLoadError(f"{name}: adapter {rank} of a model with {len(blocks.layers)} hybrid layers")
            layer = blocks.layers[rank]
            if blocks.first_of_block(layer) != int(m[1]):
                continue  # a slot of another block's layer: transformers holds an identity there, with no weight
            part = m[3].removeprefix("linear_").removesuffix("_proj_adapter").removesuffix("_adapter")
            name = f"model.layers.{layer}.shared_transformer.{m[2]}.{part}_adapter.{m[5]}.weight"
        yield name, tensor
