"""Kimi Delta Attention (KDA, Kimi Linear's linear layers; arXiv 2510.26692), over the recurrent states of a step's
sequences (recurrent_state.py).

Gated DeltaNet's delta rule (gated_delta_net.py) with a decay per key channel rather than per head: per token, q,
k and v (``heads x head_dim`` each) from three projections through one short causal convolution (SiLU), a
decay ``g`` per head and channel (``-exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)``) and a write strength
``beta`` per head; each head's state S ``[head_dim (keys), head_dim (values)]``::

    S = diag(exp(g)) S;  S = S + k ⊗ (beta * (v - Sᵀk));  out = Sᵀq

q and k are L2-normed first, q scaled by head_dim ** -0.5. A decode takes that step as written; a prompt chunk
takes the chunked form (blocks of 64 tokens, within a block a triangular system solved row by row, across
blocks the state), from the state its previous chunks left. Both follow transformers' torch kernels op for op
(the oracle), one block at a time (a block's per-channel decays are ``64 x 64 x head_dim`` floats a head). On
the CPU in fp32 a fused kernel (cpu_kernels/recurrent.c) takes every token, a prompt's too, as the recurrent
step, on the states in place in their slots: the same recurrence to fp32 rounding.
The output is RMS-normed per head (the weight in fp32), gated by a sigmoid of a low-rank projection of the
input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.attention import AttentionBatch
from services.engine.cpu_kernels import MAX_HEAD_DIM
from services.engine.gated_delta_net import by_groups
from services.engine.gated_norm import GatedRMSNorm
from services.engine.lora import LoraBatch, adapted
from services.engine.model_config import ModelConfig
from services.engine.recurrent_state import RecurrentBatch
from services.engine.short_conv import causal_conv

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels

_CHUNK = 64  # transformers' (and FLA's) block of the chunked form
_L2_EPS = 1e-6


class KimiDeltaAttention(nn.Module):
    """One KDA layer; ``forward`` takes Attention's arguments and reads ``batch.recurrent``. Its tensors have the
    names of Kimi Linear's checkpoints, but for q, k and v's projections and convolutions, which kimi_linear.py
    joins as they load."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        s = config.linear_attention
        self.shape = s
        self.state_index = config.linear_layers.index(layer)
        self.layer = layer  # its adapters'
        hidden, width = config.hidden_size, s.num_heads * s.head_dim
        self.qkv_proj = nn.Linear(hidden, 3 * width, bias=False)  # q, k, v: joined as they load
        self.conv1d = nn.Conv1d(s.conv_dim, s.conv_dim, s.conv_kernel, groups=s.conv_dim, bias=False)
        self.f_a_proj = nn.Linear(hidden, s.head_dim, bias=False)
        self.f_b_proj = nn.Linear(s.head_dim, width, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(width))
        self.A_log = nn.Parameter(torch.zeros(s.num_heads))
        self.b_proj = nn.Linear(hidden, s.num_heads, bias=False)
        self.g_a_proj = nn.Linear(hidden, s.head_dim, bias=False)
        self.g_b_proj = nn.Linear(s.head_dim, width, bias=False)
        self.o_norm = GatedRMSNorm(s.head_dim, config.rms_norm_eps, weight_in_fp32=True, act=torch.sigmoid)
        self.o_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos, sin, batch: AttentionBatch, kv, lora, q_mult=None) -> torch.Tensor:
        s, t, rb = self.shape, x.shape[0], batch.recurrent
        qkv = self.qkv_proj(x)
        if lora is not None:  # q's, k's and v's adapters, each into its third
            for third, part in zip(qkv.chunk(3, dim=-1), "qkv", strict=True):
                lora.add(third, x, self.layer, f"self_attn.{part}_proj")
        mixed = causal_conv(qkv, rb, self.state_index, self.conv1d.weight, None, kernels=batch.kernels)
        q, k, v = mixed.view(t, 3, s.num_heads, s.head_dim).unbind(1)
        g, beta = self._decay(x, lora), torch.sigmoid(self._linear("b_proj", x, lora))
        if batch.kernels is not None and s.head_dim <= MAX_HEAD_DIM:
            out = self._fused_delta_rule(batch.kernels, q, k, v, g, beta, rb)
        else:
            out = self._delta_rule(q, k, v, g, beta, rb).to(x.dtype)
        gate = self._linear("g_b_proj", self._linear("g_a_proj", x, lora), lora)
        out = self.o_norm(out, gate.view(t, s.num_heads, s.head_dim))
        return self._linear("o_proj", out.reshape(t, -1), lora)

    def _linear(self, name: str, x: torch.Tensor, lora: LoraBatch | None) -> torch.Tensor:
        return adapted(getattr(self, name), x, lora, self.layer, f"self_attn.{name}")

    def _decay(self, x: torch.Tensor, lora: LoraBatch | None) -> torch.Tensor:
        """``g`` ``[T, heads, head_dim]`` (fp32), with transformers' softplus (x itself past 20)."""
        s = self.shape
        f = self._linear("f_b_proj", self._linear("f_a_proj", x, lora), lora)
        g = (f.float() + self.dt_bias.float()).view(-1, s.num_heads, s.head_dim)
        return -self.A_log.float().exp()[:, None] * torch.where(g > 20.0, g, torch.log(1.0 + torch.exp(g)))

    def _delta_rule(self, q, k, v, g, beta, rb: RecurrentBatch) -> torch.Tensor:
        """``[T, heads, head_dim]`` in fp32 (gated_delta_net.by_groups)."""
        return by_groups(rb, self.state_index, recurrent_step, chunked_delta_rule, q, k, v, g, beta)

    def _fused_delta_rule(self, kernels: CpuKernels, q, k, v, g, beta, rb: RecurrentBatch) -> torch.Tensor:
        """``_delta_rule`` by the fused CPU kernel (fp32): each group's states updated in place in their slots, one
        token at a time, prompt chunks too."""
        ssm = rb.states.ssm[self.state_index]
        out = torch.empty(v.shape, dtype=torch.float32)
        for grp in rb.groups:
            span = grp.tokens
            kernels.kda_(out[span], q[span], k[span], v[span], g[span], beta[span], ssm, grp.slots, grp.length,
                         _L2_EPS)
            rb.save(ssm, grp)
        return out


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """FLA's L2 norm as transformers' KDA computes it: over the root of the sum plus eps (not F.normalize)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + _L2_EPS)


def recurrent_step(q, k, v, g, beta, state):
    """One token of each of B sequences: q, k, v, g ``[B, H, D]``, beta ``[B, H]``, state ``[B, H, D, D]`` (fp32).
    Returns (out ``[B, H, D]``, new state), in transformers' recurrent KDA's order of ops."""
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    q, k = l2norm(q), l2norm(k)
    q = q * (1 / (q.shape[-1] ** 0.5))
    state = state * g.exp()[..., None]
    kv_mem = (state * k[..., None]).sum(dim=-2)
    delta = (v - kv_mem) * beta[..., None]
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (state * q.unsqueeze(-1)).sum(dim=-2), state


def chunked_delta_rule(q, k, v, g, beta, state):
    """n tokens of each of B sequences after their ``state``: q, k, v, g ``[B, n, H, D]``, beta ``[B, n, H]``,
    state ``[B, H, D, D]`` (fp32). Returns (out ``[B, n, H, D]``, new state) as transformers' chunked KDA
    computes them, one block of 64 at a time (its blocks are independent but for the state)."""
    batch, n = q.shape[:2]
    q, k, v, beta, g = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                        for x in (q, k, v, beta, g))  # heads before tokens
    q, k = l2norm(q), l2norm(k)
    pad = (_CHUNK - n % _CHUNK) % _CHUNK
    q = F.pad(q, (0, 0, 0, pad)) * (1 / (q.shape[-1] ** 0.5))
    k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (k, v, g))
    beta = F.pad(beta, (0, pad))
    v_beta, k_beta = v * beta.unsqueeze(-1), k * beta.unsqueeze(-1)
    heads, blocks = q.shape[1], (n + pad) // _CHUNK
    q, k, v, g, k_beta, v_beta = (x.reshape(batch, heads, blocks, _CHUNK, x.shape[-1])
                                  for x in (q, k, v, g, k_beta, v_beta))
    g = g.cumsum(dim=-2)
    not_below = torch.ones(_CHUNK, _CHUNK, dtype=torch.bool, device=q.device).triu(0)
    above = torch.ones(_CHUNK, _CHUNK, dtype=torch.bool, device=q.device).triu(1)
    eye = torch.eye(_CHUNK, dtype=torch.float32, device=q.device)
    state = state.to(torch.float32)
    out = torch.empty_like(v)
    for i in range(blocks):
        gi, ki, kbi = g[:, :, i], k[:, :, i], k_beta[:, :, i]
        decay = (gi.unsqueeze(-2) - gi.unsqueeze(-3)).masked_fill(above[..., None], float("-inf")).exp()
        system = -(kbi.unsqueeze(-2) * ki.unsqueeze(-3) * decay).sum(dim=-1).masked_fill(not_below, 0)
        for r in range(1, _CHUNK):  # forward substitution, row by row, as transformers solves it
            row, sub = system[..., r, :r].clone(), system[..., :r, :r].clone()
            system[..., r, :r] = row + (row.unsqueeze(-1) * sub).sum(-2)
        system = system + eye
        values = system @ v_beta[:, :, i]
        k_cumdecay = system @ (kbi * gi.exp())
        inter = (q[:, :, i] * gi.exp()) @ state
        intra = (q[:, :, i].unsqueeze(-2) * ki.unsqueeze(-3) * decay).sum(dim=-1).masked_fill(above, 0)
        v_new = values - k_cumdecay @ state
        out[:, :, i] = inter + intra @ v_new
        state = state * gi[:, :, -1].exp().unsqueeze(-1) + (ki * (gi[:, :, -1:] - gi).exp()).transpose(-1, -2) @ v_new
    return out.reshape(batch, heads, -1, out.shape[-1])[:, :, :n].transpose(1, 2), state
