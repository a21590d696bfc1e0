"""Mamba-2 (arXiv 2405.21060): the mixer of Granite 4.0-H's Mamba layers, over the recurrent states of a step's
sequences (recurrent_state.py).

Per token: x (``heads x head_dim``), B and C (``state_size`` each, shared by a group of heads) from a projection
through a short causal convolution (SiLU), a step ``dt`` per head (softplus, plus a learned bias) and a decay
``A = -exp(A_log)`` per head. Each head's state S ``[head_dim, state_size]``::

    S = exp(dt * A) * S + dt * x ⊗ B;  y = S C + D * x

A decode takes that step as written; a prompt chunk takes the state space dual form in blocks of ``chunk_size``
tokens (within a block a masked product like attention's, across blocks the state), starting from the state its
previous chunks left. Both follow transformers' torch kernels op for op (the oracle). On the CPU in fp32 a fused
kernel (cpu_kernels/recurrent.c) takes every token, a prompt's too, as the recurrent step, on the states in
place in their slots: the same recurrence to fp32 rounding. The output is gated by SiLU of a third projection,
then normed in groups (Falcon-H1: normed then gated, or gated alone; ``Mamba2Shape.gated_norm``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.attention import AttentionBatch
from services.engine.cpu_kernels import MAX_STATE_SIZE
from services.engine.gated_norm import GatedRMSNorm
from services.engine.lora import adapted
from services.engine.model_config import ModelConfig
from services.engine.recurrent_state import RecurrentBatch
from services.engine.short_conv import causal_conv

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels


def silu_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * SiLU(gate) without a norm (Falcon-H1 without mamba_rms_norm)."""
    return x * F.silu(gate)


class Mamba2Mixer(nn.Module):
    """One Mamba-2 layer; ``forward`` takes Attention's arguments and reads ``batch.recurrent``."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        s = config.linear_attention
        self.shape = s
        self.state_index = config.linear_layers.index(layer)
        self.layer = layer  # its adapters'
        self.in_proj = nn.Linear(config.hidden_size, s.intermediate + s.conv_dim + s.num_heads, bias=s.proj_bias)
        self.conv1d = nn.Conv1d(s.conv_dim, s.conv_dim, s.conv_kernel, groups=s.conv_dim, bias=s.conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(s.num_heads))
        self.A_log = nn.Parameter(torch.zeros(s.num_heads))
        self.D = nn.Parameter(torch.ones(s.num_heads))
        # Falcon-H1 without mamba_rms_norm gates the scan's output with no norm (and has no norm weight).
        eps = config.rms_norm_eps if s.norm_eps is None else s.norm_eps
        self.norm = silu_gate if s.gated_norm == "gate" else GatedRMSNorm(
            s.intermediate, eps, s.n_groups, norm_first=s.gated_norm == "norm_then_gate",
            weight_in_fp32=s.norm_weight_in_fp32)
        self.out_proj = nn.Linear(s.intermediate, config.hidden_size, bias=s.out_bias)

    def forward(self, x: torch.Tensor, cos, sin, batch: AttentionBatch, kv, lora, q_mult=None) -> torch.Tensor:
        s, rb = self.shape, batch.recurrent
        gate, xbc, dt = adapted(self.in_proj, x, lora, self.layer, "mamba.in_proj").split(
            [s.intermediate, s.conv_dim, s.num_heads], dim=-1)
        xbc = causal_conv(xbc, rb, self.state_index, self.conv1d.weight, self.conv1d.bias, kernels=batch.kernels)
        h, b, c = xbc.split([s.intermediate, s.n_groups * s.state_size, s.n_groups * s.state_size], dim=-1)
        y = self._scan(h, b, c, dt, rb, batch.kernels)
        if y.dtype == x.dtype:
            return adapted(self.out_proj, self.norm(y, gate).to(x.dtype), lora, self.layer, "mamba.out_proj")
        # In low precision a prompt chunk's output reaches the gated norm in fp32 (transformers' chunked scan
        # returns fp32, and its norm keeps that dtype), a decode's in the model's dtype: normed group by group.
        normed = torch.empty_like(gate)
        for grp in rb.groups:
            span = grp.tokens
            normed[span] = self.norm(y[span] if grp.prefill else y[span].to(x.dtype), gate[span]).to(x.dtype)
        return adapted(self.out_proj, normed, lora, self.layer, "mamba.out_proj")

    def _scan(self, h, b, c, dt, rb: RecurrentBatch, kernels: CpuKernels | None) -> torch.Tensor:
        """``[T, intermediate]``: the decodes in one recurrent step, each group of prompt chunks of one length in
        the dual form, as one batch; with ``kernels`` (fp32 on the CPU) every token a recurrent step, on the states
        in place (cpu_kernels/recurrent.c)."""
        s = self.shape
        ssm = rb.states.ssm[self.state_index]
        a = -torch.exp(self.A_log.float())
        t = h.shape[0]
        h = h.view(t, s.num_heads, s.head_dim)
        b = b.view(t, s.n_groups, s.state_size)
        c = c.view(t, s.n_groups, s.state_size)
        # fp32 (prompt chunks' outputs stay fp32 until the norm, decodes' are rounded to the model's dtype).
        out = torch.empty(t, s.intermediate, dtype=torch.float32, device=h.device)
        if kernels is not None and s.state_size <= MAX_STATE_SIZE:
            y = out.view(t, s.num_heads, s.head_dim)
            for grp in rb.groups:  # a prompt chunk's dt is clamped to the limit, as transformers' chunked scan does
                span = grp.tokens
                kernels.mamba2_scan_(y[span], h[span], b[span], c[span], dt[span], a, self.D, self.dt_bias, ssm,
                                     grp.slots, grp.length, s.time_step_limit if grp.prefill else None)
                rb.save(ssm, grp)
            return out
        for grp in rb.groups:
            span, state = grp.tokens, ssm.index_select(0, grp.slots)
            if not grp.prefill:
                y, state = recurrent_step(h[span], b[span], c[span], dt[span], a, self.D, self.dt_bias, state)
            else:
                y, state = chunk_scan(*(x[span].unflatten(0, (grp.count, grp.length)) for x in (h, b, c, dt)), a,
                                      self.D, self.dt_bias, state, s.chunk_size, s.time_step_limit)
            y = y.reshape(-1, s.intermediate)
            out[span] = y if grp.prefill else y.to(h.dtype)
            rb.keep(ssm, grp, state)
        return out


def recurrent_step(x, b, c, dt, a, d_skip, dt_bias, state):
    """One token of each of B sequences: x ``[B, H, P]``, b, c ``[B, G, N]``, dt ``[B, H]``, a ``[H]`` (fp32),
    state ``[B, H, P, N]`` (fp32). Returns (y ``[B, H, P]``, new state), as transformers' selective state update
    computes them (softplus of dt + bias; no clamp of dt, as there)."""
    batch, heads, head_dim = x.shape
    groups, size = b.shape[1:]
    dt = F.softplus(dt[:, :, None].expand(-1, -1, head_dim) + dt_bias[:, None].to(dt.dtype))[..., None]
    da = torch.exp(dt.float() * a[:, None, None].float())
    per_head = heads // groups
    b = b[:, :, None, :].expand(batch, groups, per_head, size).reshape(batch, heads, 1, size)
    c = c[:, :, None, :].expand(batch, groups, per_head, size).reshape(batch, heads, size)
    state = state * da + (dt * b) * x[..., None]
    y = torch.bmm(state.to(c.dtype).view(batch * heads, head_dim, size), c.reshape(batch * heads, size, 1))
    y = y.view(batch, heads, head_dim)
    return (y + x * d_skip[:, None].to(x.dtype)).to(y.dtype), state


def _segment_sum(x: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j] = sum(x[..., j+1 : i+1])`` below the diagonal, 0 on it, -inf above (transformers' stable
    form: masked cumulative sums, not differences)."""
    n = x.size(-1)
    x = x[..., None].expand(*x.size(), n)
    x = x.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=-1), 0)
    x = torch.cumsum(x, dim=-2)
    return x.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=0), -torch.inf)


def chunk_scan(x, b, c, dt, a, d_skip, dt_bias, state, chunk: int, dt_limit: tuple[float, float]):
    """n tokens of each of B sequences after their ``state``: x ``[B, n, H, P]``, b, c ``[B, n, G, N]``, dt ``[B, n,
    H]``, state ``[B, H, P, N]`` (fp32). Returns (y ``[B, n, H, P]`` fp32, new state), in transformers' chunked
    scan's order of ops."""
    batch, n, heads, head_dim = x.shape
    groups = b.shape[2]
    dt = torch.clamp(F.softplus(dt + dt_bias.to(dt.dtype)), min=dt_limit[0], max=dt_limit[1])
    x = x.float()
    b = b.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    c = c.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    pad = (chunk - n % chunk) % chunk
    d_residual = d_skip[..., None] * F.pad(x, (0, 0, 0, 0, 0, pad))
    x = x * dt[..., None].float()
    a = a.to(x.dtype) * dt.float()

    def blocks(t: torch.Tensor) -> torch.Tensor:  # [B, n, ...] -> [B, blocks, chunk, ...]
        t = F.pad(t, (0, 0, 0, 0, 0, pad)) if t.dim() == 4 else F.pad(t, (0, 0, 0, pad))
        return t.reshape(batch, -1, chunk, *t.shape[2:])

    x, a, b, c = (blocks(t) for t in (x, a, b, c))
    a = a.permute(0, 3, 1, 2)
    a_cumsum = torch.cumsum(a, dim=-1)
    decay = torch.exp(_segment_sum(a))
    scores = torch.einsum("bclhn,bcshn->bclsh", c, b) * decay.permute(0, 2, 3, 4, 1)
    y_diag = torch.einsum("bclsh,bcshp->bclhp", scores, x)
    b_decay = b * torch.exp(a_cumsum[:, :, :, -1:] - a_cumsum).permute(0, -2, -1, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", b_decay, x)
    states = torch.cat([state[:, None].to(states.dtype), states], dim=1)
    decay_chunk = torch.exp(_segment_sum(F.pad(a_cumsum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final = new_states[:, :-1], new_states[:, -1]
    y_off = torch.einsum("bclhn,bchpn->bclhp", c, states) * torch.exp(a_cumsum).permute(0, 2, 3, 1)[..., None]
    y = (y_diag + y_off).contiguous().reshape(batch, -1, heads, head_dim) + d_residual
    return y[:, :n], final
