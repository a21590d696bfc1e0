"""MXFP4 checkpoints (GPT-OSS's experts), unpacked while they load.

Each quantized tensor ``X`` is stored as ``X_blocks`` (uint8 ``[..., G, 16]``: 32 four-bit e2m1 floats per block,
two to a byte, the low nibble first) beside ``X_scales`` (uint8 ``[..., G]``: one power of two per block, its
exponent biased by 127, OCP MX's e8m0). A value is its e2m1 code's number times ``2 ** (scale - 127)``:
exact in bf16 and fp32, so the unpacked weights are the ones transformers dequantizes from the same files.
The weights then take bf16's memory; MXFP4 matmuls on GPUs that have them are not done yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch

# The number each 4-bit e2m1 code stands for (sign bit, 2 exponent bits, 1 mantissa bit).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


class Packed(NamedTuple):
    """One MXFP4 tensor as stored: ``blocks`` ``[..., G, 16]`` uint8 and ``scales`` ``[..., G]`` uint8."""

    blocks: torch.Tensor
    scales: torch.Tensor

    def unpack(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The values, ``[..., G * 32]``, in ``dtype``."""
        return unpack(self.blocks, self.scales, dtype)


def unpack(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``[..., G, 16]`` packed codes and ``[..., G]`` biased exponents → ``[..., G * 32]`` values."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape \
            or blocks.shape[-1] != 16:
        raise KeyError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales {tuple(scales.shape)} "
                       f"{scales.dtype}: expected uint8 [..., G, 16] and uint8 [..., G]")
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    values = torch.stack([lut[(blocks & 0x0F).int()], lut[(blocks >> 4).int()]], dim=-1)  # low nibble first
    values = torch.ldexp(values.flatten(-2), (scales.int() - 127).unsqueeze(-1).to(dtype))
    return values.flatten(-2)


def pair_packed(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor | Packed]]:
    """The checkpoint's tensors with each ``X_blocks`` and ``X_scales`` pair replaced by ``(X, Packed)``; others
    pass unchanged. Raises ``KeyError`` naming blocks without scales or scales without blocks."""
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        suffix = next((s for s in ("_blocks", "_scales") if name.endswith(s)), None)
        if suffix is None:
            yield name, tensor
            continue
        base = name.removesuffix(suffix)
        parts = waiting.setdefault(base, {})  # shards keep a pair together, so this waits a tensor or two
        parts[suffix] = tensor
        if len(parts) == 2:
            del waiting[base]
            yield base, Packed(parts["_blocks"], parts["_scales"])
    for base, parts in waiting.items():
        have, lacks = ("blocks", "scales") if "_blocks" in parts else ("scales", "blocks")
        raise KeyError(f"MXFP4 {base!r} has {have} but no {lacks} ({base}_{lacks}) in the checkpoint")
