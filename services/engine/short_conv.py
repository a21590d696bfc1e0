"""The short causal convolution in front of a linear-attention layer (Gated DeltaNet, Mamba-2), per sequence of a
step's flat batch, after the inputs its recurrent state kept (recurrent_state.py), whose last ``kernel - 1`` it
then keeps; SiLU after it, as both architectures have; computed with torch's grouped conv1d, as transformers
computes it, or on the CPU in fp32 by a fused kernel that updates the windows in place (cpu_kernels/recurrent.c).
And LFM2's conv layers, which are such a convolution between two gates."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.attention import AttentionBatch
from services.engine.cpu_kernels import MAX_CONV_KERNEL
from services.engine.lora import adapted
from services.engine.model_config import ModelConfig
from services.engine.recurrent_state import RecurrentBatch

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels


def causal_conv(x: torch.Tensor, rb: RecurrentBatch, state_index: int, weight: torch.Tensor,
                bias: torch.Tensor | None, silu: bool = True, kernels: CpuKernels | None = None) -> torch.Tensor:
    """``x`` ``[T, channels]`` → SiLU(conv) (``silu`` False: the conv alone) ``[T, channels]``; ``weight``
    ``[channels, 1, kernel]``; updates the convolution states of layer ``state_index`` for the batch's sequences.
    With ``kernels`` (fp32 on the CPU), each group's windows are updated in place by the fused kernel."""
    conv = rb.states.conv[state_index]
    channels, kept = weight.shape[0], conv.shape[-1]
    if kernels is not None and 2 <= kept + 1 <= MAX_CONV_KERNEL:  # the kernel's window holds 1 to 7 inputs
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        for g in rb.groups:
            kernels.causal_conv_(out[g.tokens], x[g.tokens], conv, g.slots, g.length, weight, bias, silu)
            rb.save(conv, g)
        return out
    act = F.silu if silu else _identity
    out = torch.empty_like(x)
    for g in rb.groups:  # each group at once: [count, channels, kept + length] windows
        h = x[g.tokens].view(g.count, g.length, channels).transpose(1, 2)
        window = torch.cat([conv.index_select(0, g.slots), h], dim=-1).to(weight.dtype)
        rb.keep(conv, g, window[:, :, -kept:])
        y = act(F.conv1d(window, weight, bias, groups=channels))
        out[g.tokens] = y.transpose(1, 2).reshape(g.count * g.length, channels).to(x.dtype)
    return out


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class GatedShortConv(nn.Module):
    """LFM2's conv layers: B, C and x from one projection; the convolution of B * x, gated by C, projected out. Its
    only state is the convolution's window. ``forward`` takes Attention's arguments and reads ``batch.recurrent``."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        s = config.linear_attention
        self.state_index = config.linear_layers.index(layer)
        self.layer = layer  # its adapters'
        self.in_proj = nn.Linear(s.hidden_size, 3 * s.hidden_size, bias=s.bias)
        self.conv = nn.Conv1d(s.hidden_size, s.hidden_size, s.conv_kernel, groups=s.hidden_size, bias=s.bias)
        self.out_proj = nn.Linear(s.hidden_size, s.hidden_size, bias=s.bias)

    def forward(self, x: torch.Tensor, cos, sin, batch: AttentionBatch, kv, lora, q_mult=None) -> torch.Tensor:
        b, c, h = adapted(self.in_proj, x, lora, self.layer, "conv.in_proj").chunk(3, dim=-1)
        h = causal_conv(b * h, batch.recurrent, self.state_index, self.conv.weight, self.conv.bias, silu=False,
                        kernels=batch.kernels)
        return adapted(self.out_proj, c * h, lora, self.layer, "conv.out_proj")
