"""Grouped GEMMs: rows grouped by expert, each group times its own matrix, in one call where torch has one (the
experts' projections in moe.py, their LoRA adapters in lora.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_mm(rows: torch.Tensor, weights: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``rows`` ``[n, K]`` grouped by ``offsets`` (each group's end), group g times ``weights[g]`` ``[K, N]``."""
    try:  # torch >= 2.10 names it; 2.9 has the private op (on CPUs, and on GPUs from SM80)
        grouped = getattr(F, "grouped_mm", None) or torch._grouped_mm
        return grouped(rows, weights, offs=offsets)
    except (AttributeError, NotImplementedError, RuntimeError):  # older torch, older GPUs
        return looped_mm(rows, weights, offsets)


def looped_mm(rows: torch.Tensor, weights: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``grouped_mm`` as one matmul per group (one device-to-host sync for the offsets)."""
    out = rows.new_empty(rows.shape[0], weights.shape[2])
    start = 0
    for group, end in enumerate(offsets.tolist()):
        if end > start:
            torch.mm(rows[start:end], weights[group], out=out[start:end])
        start = end
    return out
