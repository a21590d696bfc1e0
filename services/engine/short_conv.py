"""The short causal convolution in front of a linear-attention layer (Gated DeltaNet, Mamba-2), per sequence of a
step's flat batch, after the inputs its recurrent state kept (recurrent_state.py), whose last ``kernel - 1`` it
then keeps. SiLU after it, as both architectures have; computed with torch's grouped conv1d, as transformers
computes it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.engine.recurrent_state import RecurrentBatch


def causal_conv(x: torch.Tensor, rb: RecurrentBatch, state_index: int, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` ``[T, channels]`` → SiLU(conv) ``[T, channels]``; ``weight`` ``[channels, 1, kernel]``; updates the
    convolution states of layer ``state_index`` for the batch's sequences."""
    conv = rb.states.conv[state_index]
    channels = weight.shape[0]
    out = torch.empty_like(x)
    d = rb.num_decodes
    if d:
        window = torch.cat([conv.index_select(0, rb.decode_slots), x[:d, :, None]], dim=-1).to(weight.dtype)
        conv.index_copy_(0, rb.decode_slots, window[:, :, 1:])
        out[:d] = F.silu(F.conv1d(window, weight, bias, groups=channels))[:, :, 0].to(x.dtype)
    for start, n, slot in rb.chunks:
        window = torch.cat([conv[slot], x[start:start + n].t()], dim=-1)[None].to(weight.dtype)
        conv[slot] = window[0, :, -conv.shape[-1]:]
        out[start:start + n] = F.silu(F.conv1d(window, weight, bias, groups=channels))[0].t().to(x.dtype)
    return out
