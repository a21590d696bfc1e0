"""Activations by the names configs give them (``hidden_act``), for MLPs and experts alike, and the RMSNorm
every mixer and layer shares (mixers cannot import it from model.py, which imports them)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation written out as transformers' gelu_new computes it (Phi-2): op by op, so bf16 rounds
    as there (torch's fused tanh GELU is the same function, rounded once)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def bloom_gelu(x: torch.Tensor) -> torch.Tensor:
    """BLOOM's tanh approximation, with its constants and order (transformers' ``bloom_gelu_forward``)."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu_new": gelu_new,
               "relu2": lambda x: torch.square(F.relu(x)), "gelu": F.gelu, "relu": F.relu, "bloom_gelu": bloom_gelu}


def weightless_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension without a weight, in fp32 and cast back (Llama 4's q/k norm, Falcon Mamba's
    dt/B/C norms), as transformers computes it."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, scale_in_fp32: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension, as transformers computes it."""
    if x.dtype == torch.float32:  # the fused op is bit-identical to the steps below in fp32, and one op
        return F.rms_norm(x, weight.shape, weight, eps)
    # Computed in fp32 and cast back, as transformers does, so bf16 runs round the same way.
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * weight.float()).to(dtype) if scale_in_fp32 else weight * h.to(dtype)
