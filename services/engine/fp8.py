"""Block-wise FP8 checkpoints (``quant_method: fp8``, as Qwen3-*-FP8 and DeepSeek publish them), dequantized
while they load.

Each quantized ``*.weight`` is float8 (e4m3) beside a ``*.weight_scale_inv``: one fp32 scale per
``weight_block_size`` tile of the weight (a grid of ceil(rows / bm) x ceil(cols / bn)); the real weight is the
fp8 value times its tile's scale. That product is computed in fp32 and the model casts it to its dtype, as
transformers does when it dequantizes such a checkpoint, so outputs match transformers loading the same files.
The weights then take the model dtype's memory (bf16: twice the checkpoint's); FP8 matmuls on GPUs that have
them are not done yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

SCALE_SUFFIX = "_scale_inv"


def dequantize(weights: Iterable[tuple[str, torch.Tensor]], block: tuple[int, int]
               ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each fp8 weight and its scales replaced by the dequantized weight (fp32);
    others pass unchanged. Raises ``KeyError`` naming a weight without its scales, or scales without a weight."""
    weights_waiting: dict[str, torch.Tensor] = {}
    scales_waiting: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name.endswith(SCALE_SUFFIX):
            weight_name = name[: -len(SCALE_SUFFIX)]
            if weight_name in weights_waiting:
                yield weight_name, _dequantize_one(weight_name, weights_waiting.pop(weight_name), tensor, block)
            else:
                scales_waiting[weight_name] = tensor
        elif tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            if name in scales_waiting:
                yield name, _dequantize_one(name, tensor, scales_waiting.pop(name), block)
            else:  # shards keep a weight and its scales together, so this waits for the next tensor or two
                weights_waiting[name] = tensor
        else:
            yield name, tensor
    for name in weights_waiting:
        raise KeyError(f"FP8 weight {name!r} has no {name + SCALE_SUFFIX!r} beside it")
    for name in scales_waiting:
        raise KeyError(f"{name + SCALE_SUFFIX!r} has no FP8 weight {name!r} beside it")


def _dequantize_one(name: str, weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    rows, cols = weight.shape
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    if tuple(scales.shape) != grid:
        raise KeyError(f"{name}{SCALE_SUFFIX} has shape {tuple(scales.shape)}; a {rows}x{cols} weight in "
                       f"{block[0]}x{block[1]} blocks needs {grid}")
    per_element = scales.float().repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return weight.float() * per_element
