"""Gated DeltaNet (arXiv 2412.06464): the linear attention of Qwen3-Next's and Qwen3.5's linear layers, over the
recurrent states of a step's sequences (recurrent_state.py).

Per token: q, k, v from a projection through a short causal convolution (SiLU), a decay ``g`` and a write
strength ``beta``; each value head's state matrix S ``[key dim, value dim]`` decays, then has what it predicts
for k corrected towards v (the delta rule)::

    S = S * exp(g);  S = S + k ⊗ (beta * (v - Sᵀk));  out = Sᵀq

A decode (one token) takes that step as written. A prompt chunk takes the same recurrence in blocks of 64
tokens (the chunked form: within a block, triangular solves; across blocks, the state), starting from the
state its previous chunks left, so a prompt split into chunks of any size reaches the state a whole prompt
would. Both follow transformers' torch kernels op for op (the oracle); outputs are normed per head and gated
by a SiLU of a projection of the input (``z``). On the CPU in fp32 a fused kernel (cpu_kernels/recurrent.c)
takes every token, a prompt's too, as a recurrent step, on the states in place in their slots: the same
recurrence to fp32 rounding, without the chunked form's triangular solves or gathering the states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.attention import AttentionBatch
from services.engine.cpu_kernels import MAX_HEAD_DIM
from services.engine.gated_norm import GatedRMSNorm
from services.engine.lora import LoraBatch, adapted
from services.engine.model_config import ModelConfig
from services.engine.recurrent_state import RecurrentBatch
from services.engine.short_conv import causal_conv

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels

_CHUNK = 64  # transformers' (and FLA's) block of the chunked form
_L2_EPS = 1e-6


class GatedDeltaNet(nn.Module):
    """One linear-attention layer; ``forward`` takes Attention's arguments and reads ``batch.recurrent``."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        s = config.linear_attention
        self.shape = s
        self.state_index = config.linear_layers.index(layer)  # its row of the state pool's lists
        self.layer = layer  # its adapters'
        self.grouped = s.grouped_projections
        hidden = config.hidden_size
        if self.grouped:  # Qwen3-Next: [q k v z] and [b a] grouped by key head
            self.in_proj_qkvz = nn.Linear(hidden, 2 * s.key_dim + 2 * s.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(hidden, 2 * s.num_value_heads, bias=False)
        else:  # Qwen3.5
            self.in_proj_qkv = nn.Linear(hidden, s.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(hidden, s.value_dim, bias=False)
            self.in_proj_b = nn.Linear(hidden, s.num_value_heads, bias=False)
            self.in_proj_a = nn.Linear(hidden, s.num_value_heads, bias=False)
        self.conv1d = nn.Conv1d(s.conv_dim, s.conv_dim, s.conv_kernel, groups=s.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(s.num_value_heads))
        self.A_log = nn.Parameter(torch.zeros(s.num_value_heads))
        self.norm = GatedRMSNorm(s.value_head_dim, s.norm_eps or config.rms_norm_eps)
        self.out_proj = nn.Linear(s.value_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos, sin, batch: AttentionBatch, kv, lora, q_mult=None) -> torch.Tensor:
        s, t = self.shape, x.shape[0]
        rb = batch.recurrent
        mixed, z, b, a = self._project(x, lora)
        mixed = causal_conv(mixed, rb, self.state_index, self.conv1d.weight, None, kernels=batch.kernels)
        q, k, v = mixed.split([s.key_dim, s.key_dim, s.value_dim], dim=-1)
        q = q.reshape(t, s.num_key_heads, s.key_head_dim)
        k = k.reshape(t, s.num_key_heads, s.key_head_dim)
        v = v.reshape(t, s.num_value_heads, s.value_head_dim)
        beta = b.sigmoid() if s.beta_scale == 1.0 else b.sigmoid() * s.beta_scale
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        if batch.kernels is not None and max(s.key_head_dim, s.value_head_dim) <= MAX_HEAD_DIM:
            out = self._fused_delta_rule(batch.kernels, q, k, v, g, beta, rb)
        else:
            if s.num_value_heads != s.num_key_heads:  # each q/k head serves that many consecutive value heads
                r = s.num_value_heads // s.num_key_heads
                q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
            out = self._delta_rule(q, k, v, g, beta, rb).to(x.dtype)
        out = self.norm(out.reshape(-1, s.value_head_dim), z.reshape(-1, s.value_head_dim))
        return self._linear("out_proj", out.reshape(t, s.value_dim), lora)

    def _linear(self, name: str, x: torch.Tensor, lora: LoraBatch | None) -> torch.Tensor:
        return adapted(getattr(self, name), x, lora, self.layer, f"linear_attn.{name}")

    def _project(self, x: torch.Tensor, lora: LoraBatch | None) -> tuple[torch.Tensor, ...]:
        """(q|k|v ``[T, conv_dim]``, z ``[T, value heads, value dim]``, b, a ``[T, value heads]``)."""
        s, t = self.shape, x.shape[0]
        if not self.grouped:
            qkv = self._linear("in_proj_qkv", x, lora)
            if lora is not None and s.separate_qkv:  # OLMo Hybrid's adapters, one per part of the fused projection
                for part, cols in zip("qkv", qkv.split(s.qkv_widths, dim=-1), strict=True):
                    lora.add(cols, x, self.layer, f"linear_attn.{part}_proj")
            return (qkv,
                    self._linear("in_proj_z", x, lora).view(t, s.num_value_heads, s.value_head_dim),
                    self._linear("in_proj_b", x, lora), self._linear("in_proj_a", x, lora))
        r = s.num_value_heads // s.num_key_heads
        qkvz = self._linear("in_proj_qkvz", x, lora).view(t, s.num_key_heads,
                                                          2 * s.key_head_dim + 2 * r * s.value_head_dim)
        q, k, v, z = qkvz.split([s.key_head_dim, s.key_head_dim, r * s.value_head_dim, r * s.value_head_dim], dim=2)
        b, a = self._linear("in_proj_ba", x, lora).view(t, s.num_key_heads, 2 * r).split([r, r], dim=2)
        mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        return (mixed, z.reshape(t, s.num_value_heads, s.value_head_dim), b.reshape(t, s.num_value_heads),
                a.reshape(t, s.num_value_heads))

    def _delta_rule(self, q, k, v, g, beta, rb: RecurrentBatch) -> torch.Tensor:
        """``[T, value heads, value dim]`` in fp32 (``by_groups``)."""
        return by_groups(rb, self.state_index, recurrent_step, chunked_delta_rule, q, k, v, g, beta)

    def _fused_delta_rule(self, kernels: CpuKernels, q, k, v, g, beta, rb: RecurrentBatch) -> torch.Tensor:
        """``_delta_rule`` by the fused CPU kernel (fp32): each group's states updated in place in their slots,
        one token at a time, prompt chunks too; q and k per key head (the kernel maps value heads to them)."""
        ssm = rb.states.ssm[self.state_index]
        out = torch.empty(v.shape, dtype=torch.float32)
        for grp in rb.groups:
            span = grp.tokens
            kernels.gated_delta_(out[span], q[span], k[span], v[span], g[span], beta[span], ssm, grp.slots,
                                 grp.length, _L2_EPS)
            rb.save(ssm, grp)
        return out


def by_groups(rb: RecurrentBatch, state_index: int, step, chunked, q, k, v, *rest) -> torch.Tensor:
    """A delta rule over a step's groups, ``[T, heads, value dim]`` in fp32: the decodes in one recurrent
    ``step``, each group of prompt chunks of one length in the ``chunked`` form, as one batch; the states of
    layer ``state_index`` gathered and kept back. Gated DeltaNet's and KDA's alike (their forms differ)."""
    ssm, inputs = rb.states.ssm[state_index], (q, k, v, *rest)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for grp in rb.groups:
        span, state = grp.tokens, ssm.index_select(0, grp.slots)
        if not grp.prefill:
            out[span], state = step(*(t[span] for t in inputs), state)
        else:
            o, state = chunked(*(t[span].unflatten(0, (grp.count, grp.length)) for t in inputs), state)
            out[span] = o.flatten(0, 1)
        rb.keep(ssm, grp, state)
    return out


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + _L2_EPS)


def recurrent_step(q, k, v, g, beta, state):
    """One token of each of B sequences: q, k ``[B, H, Dk]``, v ``[B, H, Dv]``, g, beta ``[B, H]``, state ``[B, H,
    Dk, Dv]`` (fp32). Returns (out ``[B, H, Dv]``, new state), in transformers' recurrent kernel's order of ops."""
    q, k, v, beta, g = (x.float() for x in (q, k, v, beta, g))
    q, k = l2_normalize(q), l2_normalize(k)
    q = q / (q.shape[-1] ** 0.5)
    state = state * g.exp()[..., None, None]
    kv_mem = (state * k.unsqueeze(-1)).sum(dim=-2)
    delta = (v - kv_mem) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (state * q.unsqueeze(-1)).sum(dim=-2), state


def chunked_delta_rule(q, k, v, g, beta, state):
    """n tokens of each of B sequences after their ``state``: q, k ``[B, n, H, Dk]``, v ``[B, n, H, Dv]``, g, beta
    ``[B, n, H]``, state ``[B, H, Dk, Dv]`` (fp32). Returns (out ``[B, n, H, Dv]``, new state), as transformers'
    chunked kernel computes them."""
    batch, n = q.shape[:2]
    q, k, v, beta, g = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                        for x in (q, k, v, beta, g))  # heads before tokens
    q, k = l2_normalize(q), l2_normalize(k)
    q = q * q.shape[-1] ** -0.5
    pad = (_CHUNK - n % _CHUNK) % _CHUNK
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    heads, blocks = q.shape[1], (n + pad) // _CHUNK
    v_beta, k_beta = v * beta.unsqueeze(-1), k * beta.unsqueeze(-1)
    q, k, k_beta, v_beta = (x.reshape(batch, heads, blocks, _CHUNK, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    cum = g.reshape(batch, heads, blocks, _CHUNK).cumsum(dim=-1)
    upper = torch.ones(_CHUNK, _CHUNK, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * decay
    intra = (q @ k.transpose(-1, -2)) * decay
    values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(system, k_beta * cum.exp().unsqueeze(-1), upper=False, unitriangular=True)
    state = state.to(values)
    out = torch.zeros_like(values)
    q = q * cum.exp().unsqueeze(-1)
    k = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    block_decay = cum[..., -1].exp()[..., None, None]
    for i in range(blocks):
        v_new = values[:, :, i] - k_cum[:, :, i] @ state
        out[:, :, i] = q[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * block_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    return out.reshape(batch, heads, -1, out.shape[-1])[:, :, :n].transpose(1, 2), state
