"""Mamba (arXiv 2312.00752): the mixer of Mamba's, Falcon Mamba's and Jamba's Mamba layers, over the recurrent
states of a step's sequences (recurrent_state.py).

Per token: x (``intermediate`` channels) through a short causal convolution (SiLU); from it a step ``dt`` per
channel (a ``dt_rank``-wide projection, projected up, plus a bias, softplus), and B and C (``state_size`` each);
dt, B and C RMS-normed first in Jamba (with weights) and Falcon Mamba (without; ``Mamba1Shape.bcdt_norms``).
Each channel's state ``s`` (``state_size``) with its decay ``A = -exp(A_log)``::

    s = exp(dt * A) * s + dt * B * x;  y = s · C + D * x

then gated by SiLU of a second projection. A decode takes that step as written; a prompt chunk takes it token by
token from the state its previous chunks left, as transformers' torch path loops (the oracle; a parallel scan
would round differently). Both follow transformers' ops and dtypes. On the CPU in fp32 a fused kernel
(cpu_kernels/recurrent.c) takes the same steps in C, on the states in place in their slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.activations import rms_norm, weightless_rms_norm
from services.engine.attention import AttentionBatch
from services.engine.cpu_kernels import MAX_STATE_SIZE
from services.engine.lora import adapted
from services.engine.model_config import ModelConfig
from services.engine.recurrent_state import RecurrentBatch
from services.engine.short_conv import causal_conv

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels


class Mamba1Mixer(nn.Module):
    """One Mamba layer; ``forward`` takes Attention's arguments and reads ``batch.recurrent``."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        s = config.linear_attention
        self.shape, self.eps = s, config.rms_norm_eps
        self.state_index = config.linear_layers.index(layer)
        self.layer = layer  # its adapters'
        self.in_proj = nn.Linear(config.hidden_size, 2 * s.intermediate, bias=s.proj_bias)
        self.conv1d = nn.Conv1d(s.intermediate, s.intermediate, s.conv_kernel, groups=s.intermediate, bias=s.conv_bias)
        self.x_proj = nn.Linear(s.intermediate, s.dt_rank + 2 * s.state_size, bias=False)
        self.dt_proj = nn.Linear(s.dt_rank, s.intermediate)
        self.A_log = nn.Parameter(torch.zeros(s.intermediate, s.state_size))
        self.D = nn.Parameter(torch.ones(s.intermediate))
        self.out_proj = nn.Linear(s.intermediate, config.hidden_size, bias=s.proj_bias)
        if s.bcdt_norms == "weighted":
            self.dt_layernorm = _NormWeight(s.dt_rank)
            self.b_layernorm = _NormWeight(s.state_size)
            self.c_layernorm = _NormWeight(s.state_size)
        elif s.bcdt_norms == "unweighted":
            self.eps = s.bcdt_norm_eps

    def forward(self, x: torch.Tensor, cos, sin, batch: AttentionBatch, kv, lora, q_mult=None) -> torch.Tensor:
        s, rb = self.shape, batch.recurrent
        h, gate = adapted(self.in_proj, x, lora, self.layer, "mamba.in_proj").chunk(2, dim=-1)
        h = causal_conv(h, rb, self.state_index, self.conv1d.weight, self.conv1d.bias, kernels=batch.kernels)
        dt, b, c = adapted(self.x_proj, h, lora, self.layer, "mamba.x_proj").split(
            [s.dt_rank, s.state_size, s.state_size], dim=-1)
        if s.bcdt_norms == "weighted":  # Jamba's RMSNorms on dt, B and C (Llama's: the weight after the cast back)
            dt = rms_norm(dt, self.dt_layernorm.weight, self.eps)
            b = rms_norm(b, self.b_layernorm.weight, self.eps)
            c = rms_norm(c, self.c_layernorm.weight, self.eps)
        elif s.bcdt_norms == "unweighted":  # Falcon Mamba's
            dt, b, c = (weightless_rms_norm(t, self.eps) for t in (dt, b, c))
        # dt_proj's bias joins in fp32 in the scan, as transformers adds it; its adapters are not applied (lora.py)
        dt = F.linear(dt, self.dt_proj.weight)
        y = self._scan(h, dt, b, c, gate, rb, batch.kernels).to(x.dtype)
        return adapted(self.out_proj, y, lora, self.layer, "mamba.out_proj")

    def _scan(self, h, dt, b, c, gate, rb: RecurrentBatch, kernels: CpuKernels | None) -> torch.Tensor:
        """``[T, intermediate]``: the decodes in one recurrent step, each group of prompt chunks of one length
        token by token, as one batch; with ``kernels`` (fp32 on the CPU) by the fused scan, on the states in
        place (cpu_kernels/recurrent.c)."""
        ssm = rb.states.ssm[self.state_index]
        a = -torch.exp(self.A_log.float())
        dt_bias = self.dt_proj.bias.float()
        out = torch.empty_like(h)
        if kernels is not None and self.shape.state_size <= MAX_STATE_SIZE:
            for grp in rb.groups:
                span = grp.tokens
                kernels.mamba1_scan_(out[span], h[span], dt[span], gate[span], b[span], c[span], a, self.D, dt_bias,
                                     ssm, grp.slots, grp.length)
                rb.save(ssm, grp)
            return out
        for grp in rb.groups:
            span, state = grp.tokens, ssm.index_select(0, grp.slots)
            if not grp.prefill:
                y, state = recurrent_step(h[span], dt[span], b[span], c[span], gate[span], a, self.D, dt_bias, state)
            else:
                y, state = sequential_scan(*(t[span].unflatten(0, (grp.count, grp.length)) for t in (h, dt, b, c, gate)),
                                           a, self.D, dt_bias, state)
            out[span] = y.reshape(-1, h.shape[-1]).to(h.dtype)
            rb.keep(ssm, grp, state)
        return out


class _NormWeight(nn.Module):
    """An RMSNorm's weight, under the name checkpoints give it (``dt_layernorm.weight``)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


def recurrent_step(x, dt, b, c, z, a, d_skip, dt_bias, state):
    """One token of each of B sequences: x, dt, z ``[B, I]``, b, c ``[B, N]``, a ``[I, N]`` (fp32), state ``[B, I,
    N]`` (fp32). Returns (y ``[B, I]``, new state), as transformers' selective state update computes them."""
    dt = F.softplus(dt + dt_bias.to(dt.dtype))
    da = torch.exp(dt.float()[..., None] * a)
    dbx = dt.float()[..., None] * b.float()[:, None, :] * x.float()[..., None]
    state = state.float() * da + dbx
    y = torch.matmul(state.to(c.dtype), c.unsqueeze(-1)).squeeze(-1)
    return ((y + x * d_skip) * F.silu(z)).to(x.dtype), state


def sequential_scan(x, dt, b, c, z, a, d_skip, dt_bias, state):
    """n tokens of each of B sequences after their ``state``: x, dt, z ``[B, n, I]``, b, c ``[B, n, N]``, state
    ``[B, I, N]`` (fp32). Returns (y ``[B, n, I]``, new state), in transformers' selective scan's order of ops."""
    dt = F.softplus(dt + dt_bias.to(dt.dtype))
    da = torch.exp(a * dt[..., None])
    dbu = dt[..., None] * b[:, :, None, :].float() * x[..., None].float()
    ys = []
    for i in range(x.shape[1]):
        state = da[:, i] * state + dbu[:, i]
        ys.append(torch.matmul(state.to(x.dtype), c[:, i, :, None])[..., 0])
    y = torch.stack(ys, dim=1)
    return (y + x * d_skip.float()) * F.silu(z), state
