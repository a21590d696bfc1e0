"""Integer weights in compressed-tensors' ``pack-quantized`` format (llm-compressor's W4A16 and W8A16
checkpoints, the "-quantized.w4a16" releases, Kimi K2 Thinking's INT4 experts), dequantized while they load.

A quantized ``X.weight`` is stored as ``X.weight_packed`` (int32 words, each holding 32 / bits values of one
row, the first in the lowest bits, as unsigned numbers offset by 2^(bits-1)), ``X.weight_scale`` (one scale
per output row, or per ``group_size`` consecutive inputs of a row) and ``X.weight_shape`` (the unpacked
shape), and for asymmetric schemes ``X.weight_zero_point`` (one per scale, packed the same way down the
rows). The real weight is each value, less its zero point, times its scale, multiplied in the scale's dtype as compressed-tensors
does (bf16 products of 4-bit values round), so outputs match transformers loading the same files. The model
then holds the weights in its dtype (bf16: four times an int4 checkpoint's memory); integer matmuls are not
done yet. Modules the checkpoint left unquantized (its ``ignore`` list) load as stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

PARTS = ("weight_packed", "weight_scale", "weight_shape")
ZERO_POINT = "weight_zero_point"


def dequantize_packed(weights: Iterable[tuple[str, torch.Tensor]], bits: int, zero_points: bool = False
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each packed weight's parts (with ``zero_points``, its zero points too)
    replaced by the dequantized weight; others pass unchanged. Raises ``KeyError`` naming a weight whose parts
    are not all there."""
    names = (*PARTS, ZERO_POINT) if zero_points else PARTS
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        module, _, part = name.rpartition(".")
        if part not in names:
            yield name, tensor
            continue
        parts = waiting.setdefault(module, {})
        parts[part] = tensor
        if len(parts) == len(names):  # shards keep a module's parts together: a few tensors wait at most
            del waiting[module]
            yield f"{module}.weight", unpack(f"{module}.weight", parts, bits)
    for module, parts in waiting.items():
        missing = ", ".join(f"{module}.{p}" for p in names if p not in parts)
        raise KeyError(f"packed weight {module}.weight lacks {missing}")


def unpack(name: str, parts: dict[str, torch.Tensor], bits: int) -> torch.Tensor:
    """One weight from its packed values, scales, shape and (asymmetric) zero points."""
    packed, scale = parts["weight_packed"], parts["weight_scale"]
    shape = [int(s) for s in parts["weight_shape"].flatten().tolist()]
    if packed.dtype != torch.int32 or len(shape) != 2 or packed.ndim != 2 or packed.shape[0] != shape[0] \
            or packed.shape[1] * 32 // bits < shape[1]:
        raise KeyError(f"{name}: packed values {tuple(packed.shape)} {packed.dtype} cannot hold a weight of shape "
                       f"{shape} at {bits} bits (int32 words, 32 / {bits} values each)")
    rows, cols = shape
    values = _unpack_rows(packed, bits, cols)
    if not (scale.ndim == 2 and scale.shape[0] == rows and scale.shape[1] >= 1 and cols % scale.shape[1] == 0):
        raise KeyError(f"{name}: scales of shape {tuple(scale.shape)} fit neither one per row ({rows}, 1) nor "
                       f"groups of a {rows}x{cols} weight")
    group = cols // scale.shape[1]  # one group: per row
    weight = values.to(scale.dtype)
    if ZERO_POINT in parts:  # packed down the rows: each column of it is one group's zero points
        zero = parts[ZERO_POINT]
        if zero.dtype != torch.int32 or zero.ndim != 2 or zero.shape[1] != scale.shape[1] \
                or zero.shape[0] * 32 // bits < rows:
            raise KeyError(f"{name}: zero points {tuple(zero.shape)} {zero.dtype} do not fit {tuple(scale.shape)} "
                           "scales")
        weight = weight - _unpack_rows(zero.T, bits, rows).T.to(scale.dtype).repeat_interleave(group, dim=1)
    return weight * scale.repeat_interleave(group, dim=1)


def _unpack_rows(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Each row's first ``count`` values, signed (the stored numbers less 2^(bits-1))."""
    raw = packed.contiguous().view(torch.uint8)  # a word's bytes, lowest first (little-endian hosts)
    if bits == 4:
        raw = torch.stack((raw & 0xF, raw >> 4), dim=-1).view(packed.shape[0], -1)
    return raw[:, :count].to(torch.int16) - (1 << (bits - 1))
