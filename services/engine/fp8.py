"""FP8 checkpoints, dequantized while they load: block-wise ``quant_method: fp8`` (Qwen3-*-FP8, DeepSeek) and
compressed-tensors' ``float-quantized`` format (the "-FP8", "-FP8-dynamic" and "-FP8-block" checkpoints that
llm-compressor writes).

Each quantized ``*.weight`` is float8 (e4m3) beside its scales, ``*.weight_scale_inv`` (fp8) or
``*.weight_scale`` (compressed-tensors; float, or a ue8m0 exponent byte): one per tile of ``block`` (a grid of ceil(rows / bm) x ceil(cols / bn)),
or, without a block, one per output row (``[rows, 1]``) or one for the whole weight; the real weight is the
fp8 value times its scale. That product is computed in fp32 and the model casts it to its dtype, as
transformers does when it dequantizes such a checkpoint, so outputs match transformers loading the same files.
The weights then take the model dtype's memory (bf16: twice the checkpoint's); FP8 matmuls on GPUs that have
them are not done yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

# What a checkpoint's FP8 tensors are stored as.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def dequantize(weights: Iterable[tuple[str, torch.Tensor]], scale_name: str, block: tuple[int, int] | None
               ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each fp8 weight and its scales replaced by the dequantized weight (fp32);
    others pass unchanged. Raises ``KeyError`` naming a weight without its scales, or scales without a weight."""
    suffix = scale_name.removeprefix("weight")
    weights_waiting: dict[str, torch.Tensor] = {}
    scales_waiting: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name.endswith(suffix) and name.removesuffix(suffix).endswith(".weight"):
            weight_name = name[: -len(suffix)]
            if weight_name in weights_waiting:
                yield weight_name, _dequantize_one(weight_name, weights_waiting.pop(weight_name), tensor, block)
            else:
                scales_waiting[weight_name] = tensor
        elif tensor.dtype in FP8_DTYPES:
            if name in scales_waiting:
                yield name, _dequantize_one(name, tensor, scales_waiting.pop(name), block)
            else:  # shards keep a weight and its scales together, so this waits for the next tensor or two
                weights_waiting[name] = tensor
        else:
            yield name, tensor
    for name in weights_waiting:
        raise KeyError(f"FP8 weight {name!r} has no {name + suffix!r} beside it")
    for name in scales_waiting:
        raise KeyError(f"{name + suffix!r} has no FP8 weight {name!r} beside it")


def _dequantize_one(name: str, weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int] | None
                    ) -> torch.Tensor:
    rows, cols = weight.shape
    # ue8m0 scales saved as bytes (MXFP8 checkpoints): each the exponent of a power of two, 2 ** (byte - 127).
    s = (scales.view(torch.float8_e8m0fnu) if scales.dtype == torch.uint8 else scales).float()
    if block is not None:
        grid = (-(-rows // block[0]), -(-cols // block[1]))
        if tuple(s.shape) != grid:
            raise KeyError(f"the scales of {name} have shape {tuple(s.shape)}; a {rows}x{cols} weight in "
                           f"{block[0]}x{block[1]} blocks needs {grid}")
        return weight.float() * s.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    if s.numel() == 1:  # one scale for the whole weight
        return weight.float() * s.reshape(())
    if tuple(s.shape) in ((rows, 1), (rows,)):  # one per output channel
        return weight.float() * s.reshape(rows, 1)
    raise KeyError(f"the scales of {name} have shape {tuple(s.shape)}; a {rows}x{cols} weight needs one scale, "
                   f"or one per row ({rows}, 1)")
