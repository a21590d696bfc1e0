"""The gated RMS norms on linear-attention layers' outputs, one module for their variants: Gated DeltaNet's
(normed per head, then times SiLU of a gate), Mamba-2's (gated, then normed in groups: Granite 4.0-H, Bamba,
Nemotron-H; Falcon-H1 either way round) and Kimi Delta Attention's (a sigmoid gate), each in transformers'
order of casts, so that bf16 rounds as the oracle does too."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class GatedRMSNorm(nn.Module):
    """RMSNorm within each of ``groups`` groups of channels, in fp32, and a gate: ``act(gate)`` multiplies the
    normed output (``norm_first``) or the input before the norm. The weight (as stored, not 1 + w) multiplies
    after the cast back to the input's dtype, or in fp32 with ``weight_in_fp32`` (Falcon-H1's, KDA's)."""

    def __init__(self, size: int, eps: float, groups: int = 1, norm_first: bool = True, weight_in_fp32: bool = False,
                 act: Callable[[torch.Tensor], torch.Tensor] = F.silu) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps, self.groups, self.norm_first, self.weight_in_fp32, self.act = (
            eps, groups, norm_first, weight_in_fp32, act)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float() if self.norm_first else x.float() * self.act(gate.float())
        grouped = h.view(*h.shape[:-1], self.groups, -1)
        h = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)).view(h.shape)
        h = self.weight * h if self.weight_in_fp32 else self.weight * h.to(dtype)
        return (h.float() * self.act(gate.float()) if self.norm_first else h).to(dtype)
