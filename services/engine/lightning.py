"""MiniMax's lightning attention (MiniMax-Text-01, MiniMax-M1's linear layers), over the recurrent states of a
step's sequences (recurrent_state.py).

Linear attention with a decay per head and no normalizer: q, k and v (``heads x head_dim`` each, one projection
laid out per head, SiLU'd), each head's state S ``[head_dim (keys), head_dim (values)]``::

    S = exp(-slope) S + k ⊗ v;  out = Sᵀq

where the head's slope falls geometrically with the head and linearly with the layer's depth (transformers'
``get_slope_rate``). A decode takes that step; a prompt chunk takes transformers' block form (blocks of
``block_size``: within a block the decayed q·kᵀ against v, across blocks the state), from the state its
previous chunks left. The output is RMS-normed over all heads, scaled by the sigmoid of a projection of the
input (``output_gate``), and projected out.
"""

from __future__ import annotations

import torch
from torch import nn

from services.engine.activations import ACTIVATIONS
from services.engine.attention import AttentionBatch
from services.engine.gated_delta_net import by_groups
from services.engine.lora import adapted
from services.engine.model_config import ModelConfig


class LightningAttention(nn.Module):
    """One lightning-attention layer; ``forward`` takes Attention's arguments and reads ``batch.recurrent``."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        from services.engine.model import RMSNorm

        s = config.linear_attention
        self.heads, self.head_dim, self.block = s.num_heads, s.head_dim, s.block_size
        self.state_index = config.linear_layers.index(layer)
        self.layer = layer  # its adapters'
        width = s.num_heads * s.head_dim
        self.act = ACTIVATIONS[config.hidden_act]
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * width, bias=False)
        self.output_gate = nn.Linear(config.hidden_size, width, bias=False)
        self.out_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.norm = RMSNorm(width, 1e-6)  # transformers' MiniMaxRMSNorm default, not rms_norm_eps
        self.slope = slopes(s.num_heads, layer, config.num_hidden_layers)  # [H, 1, 1] fp32

    def forward(self, x: torch.Tensor, cos, sin, batch: AttentionBatch, kv, lora, q_mult=None) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.act(adapted(self.qkv_proj, x, lora, self.layer, "self_attn.qkv_proj"))
        q, k, v = qkv.view(t, self.heads, 3 * self.head_dim).split(self.head_dim, dim=-1)
        if self.slope.device != x.device:  # made on the CPU with the module; moved once
            self.slope = self.slope.to(x.device)
        slope = self.slope
        out = by_groups(batch.recurrent, self.state_index, lambda *a: _step(*a, slope),
                        lambda *a: _blocks(*a, slope, self.block), q, k, v).to(x.dtype)
        out = self.norm._norm(out.reshape(t, -1))
        out = torch.sigmoid(adapted(self.output_gate, x, lora, self.layer, "self_attn.output_gate")) * out
        return adapted(self.out_proj, out, lora, self.layer, "self_attn.out_proj")


def slopes(heads: int, layer: int, layers: int) -> torch.Tensor:
    """Each head's decay rate ``[heads, 1, 1]`` as transformers' ``get_slope_rate`` computes it (fp32)."""
    with torch.device("cpu"):
        base = 1 / (2 ** (8 / heads))
        rate = base ** (torch.arange(heads) + 1)
        return (rate * (1 - layer / (layers - 1 + 1e-5) + 1e-5))[:, None, None]


def _step(q, k, v, state, slope):
    """One token of each of B sequences: q, k, v ``[B, H, D]``, state ``[B, H, D, D]`` (fp32). Returns (out
    ``[B, H, D]``, new state), as transformers' decoding loop computes them."""
    q, k, v = (x.float().unsqueeze(-2) for x in (q, k, v))  # [B, H, 1, D]
    state = torch.exp(-slope) * state + k.transpose(-1, -2) @ v
    return (q @ state).squeeze(-2), state


def _blocks(q, k, v, state, slope, block: int):
    """n tokens of each of B sequences after their ``state``: q, k, v ``[B, n, H, D]`` (fp32 state ``[B, H, D,
    D]``). Returns (out ``[B, n, H, D]``, new state), in transformers' blocks of ``block`` tokens."""
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))  # [B, H, n, D]
    n = q.shape[2]
    steps = torch.arange(block, device=q.device) + 1
    query_decay = torch.exp(-slope * steps[:, None])  # [H, block, 1]
    key_decay = torch.exp(-slope * (block - steps[:, None]))
    out = []
    for start in range(0, n, block):
        end = min(start + block, n)
        c = end - start
        qb, kb, vb = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        offsets = (steps[:c, None] - steps[None, :c])[None, None]
        diagonal = torch.exp(torch.where(slope * offsets >= 0, -(slope * offsets), float("-inf")))
        intra = (qb @ kb.transpose(-1, -2) * diagonal) @ vb
        inter = (qb * query_decay[:, :c]) @ state
        out.append(inter + intra)
        state = state * torch.exp(-slope * c) + (kb * key_decay[:, -c:]).transpose(-1, -2) @ vb
    return torch.cat(out, dim=2).transpose(1, 2), state
