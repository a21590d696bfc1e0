"""Zamba2's layers (zamba2.py has the architecture): a pre-norm Mamba-2 mixer each, and in the hybrid layers a
run of a shared transformer block whose output joins the mixer's input. Computed as transformers computes them,
op for op: the block's attention and MLP are this engine's (model.py) over twice the hidden width, plus the
layer's own adapters."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from services.engine.attention import AttentionBatch
from services.engine.kv_pool import PagedKVPool
from services.engine.mamba2 import Mamba2Mixer
from services.engine.model import MLP, Attention, RMSNorm
from services.engine.model_config import ModelConfig
from services.engine.zamba2 import SharedBlocks


def _adapter(width_in: int, rank: int, width_out: int) -> nn.Sequential:
    """transformers' un-tied adapter: a rank-``rank`` product, no bias (its names: ``0`` down, ``1`` up)."""
    return nn.Sequential(nn.Linear(width_in, rank, bias=False), nn.Linear(rank, width_out, bias=False))


class SharedBlock(nn.Module):
    """A hybrid layer's run of a shared transformer block: attention over ``[stream, embeddings]`` normed, then a
    GELU-gated MLP on the attention's output normed, with no residual of its own. Its weights are the block's
    (``tie_shared_blocks``); its adapters and its KV are the layer's."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        blocks, hidden, rank = config.shared_blocks, config.hidden_size, config.shared_blocks.adapter_rank
        wide = replace(config, hidden_size=2 * hidden)  # q, k and v read the stream and the embeddings side by side
        self.input_layernorm = RMSNorm(2 * hidden, config.rms_norm_eps)
        self.self_attn = Attention(wide, layer)
        self.self_attn.o_proj = nn.Linear(self.self_attn.q_size, hidden, bias=False)
        self.pre_ff_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.feed_forward = MLP(config, layer)
        self.feed_forward.gate_up_adapter = _adapter(hidden, rank, 2 * config.intermediate_size)
        self.attention_adapters = blocks.attention_adapters
        if self.attention_adapters:
            attn = self.self_attn
            attn.q_adapter = _adapter(2 * hidden, rank, attn.q_size)
            attn.k_adapter = _adapter(2 * hidden, rank, attn.kv_size)
            attn.v_adapter = _adapter(2 * hidden, rank, attn.kv_size)

    def forward(self, x: torch.Tensor, embeddings: torch.Tensor, cos, sin, batch: AttentionBatch,
                kv: PagedKVPool) -> torch.Tensor:
        h, _ = self.input_layernorm(torch.cat([x, embeddings], dim=-1))
        attn = self.self_attn
        qkv = attn.qkv_proj(h)
        if self.attention_adapters:  # each projection's output plus its adapter's, as transformers adds them
            qkv = qkv + torch.cat([attn.q_adapter(h), attn.k_adapter(h), attn.v_adapter(h)], dim=-1)
        h, _ = self.pre_ff_layernorm(attn.attend(qkv, h, cos, sin, batch, kv, None))
        mlp = self.feed_forward
        gate, up = (mlp.gate_up_proj(h) + mlp.gate_up_adapter(h)).split(mlp.intermediate, dim=-1)
        return mlp.down_proj(mlp.act(gate) * up)


class Zamba2Layer(nn.Module):
    """One layer: ``stream + mamba(norm(stream + linear(block(stream, embeddings))))`` in a hybrid layer, without
    the block's term in the others. Called as ``DecoderLayer`` is, with the token embeddings for the block; the
    residual add rides along with the next layer, as there."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mamba = Mamba2Mixer(config, layer)
        hybrid = layer in config.shared_blocks.layers
        self.shared_transformer = SharedBlock(config, layer) if hybrid else None
        self.linear = nn.Linear(config.hidden_size, config.hidden_size, bias=False) if hybrid else None

    def forward(self, x, residual, cos, sin, batch: AttentionBatch, kv: PagedKVPool,
                embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stream = x if residual is None else x + residual
        h = stream
        if self.shared_transformer is not None:
            h = stream + self.linear(self.shared_transformer(stream, embeddings, cos, sin, batch, kv))
        h, _ = self.input_layernorm(h)
        return self.mamba(h, None, None, batch, kv, None), stream


def tie_shared_blocks(layers: nn.ModuleList, blocks: SharedBlocks) -> None:
    """Makes each hybrid layer's block hold the weights of the first layer that runs the same block (adapters
    aside): one tensor per weight, which the checkpoint stores under that first layer's name."""
    for layer in blocks.layers:
        first = blocks.first_of_block(layer)
        if first == layer:
            continue
        source, target = layers[first].shared_transformer, layers[layer].shared_transformer
        for name, param in source.named_parameters():
            if "_adapter." in name:
                continue
            owner, _, attr = name.rpartition(".")
            setattr(target.get_submodule(owner), attr, param)
