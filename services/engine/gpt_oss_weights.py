"""GPT-OSS's checkpoint tensors under the names and layouts the model holds.

GPT-OSS stores each layer's experts stacked and transposed: ``mlp.experts.gate_up_proj`` ``[E, H, 2I]`` with
gate and up columns interleaved (gate, up, gate, up, ...), ``down_proj`` ``[E, I, H]``, their biases
``[E, 2I]`` (interleaved) and ``[E, H]``; or, in the released MXFP4 checkpoints, the two weights packed
(``*_blocks`` and ``*_scales``, mxfp4.py) as ``[E, 2I, H]`` and ``[E, H, I]``. The router is ``mlp.router``.

The model holds experts as the other mixtures do (moe.py: ``[E, 2I, H]``, each expert's gate rows then its up
rows). So each expert's gate, up and down weights are yielded one at a time, named as per-expert checkpoints
name them, and ``copy_expert`` copies them in: at most one expert of a packed layer is unpacked at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from services.engine.mxfp4 import Packed

_STACKED = re.compile(r"^(.*\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)$")


def gpt_oss_weights(weights: Iterable[tuple[str, torch.Tensor | Packed]]) -> Iterator[tuple[str, torch.Tensor]]:
    """GPT-OSS's tensors (MXFP4 ones paired by ``mxfp4.pair_packed``) as the model loads them. Raises
    ``KeyError`` on packed tensors other than the experts' weights."""
    for name, tensor in weights:
        name = name.replace(".mlp.router.", ".mlp.gate.")
        stacked = _STACKED.match(name)
        if stacked is not None:
            yield from _per_expert(stacked[1], stacked[2], tensor)
        elif isinstance(tensor, Packed):
            raise KeyError(f"{name!r} is MXFP4; only GPT-OSS's expert weights are read packed")
        elif name.endswith(".mlp.experts.gate_up_proj_bias"):
            yield name, gate_then_up(tensor, dim=-1)
        else:
            yield name, tensor


def gate_then_up(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """GPT-OSS's interleaved gate/up outputs (along ``dim``) as the model holds them: the gates, then the ups."""
    even, odd = tensor.unflatten(dim, (-1, 2)).unbind(dim if dim < 0 else dim + 1)
    return torch.cat([even, odd], dim=dim)


def _per_expert(prefix: str, which: str, tensor: torch.Tensor | Packed) -> Iterator[tuple[str, torch.Tensor]]:
    """Each expert's ``[out, in]`` weights: gate and up (the even and odd rows of gate_up), or down."""
    num_experts = (tensor.blocks if isinstance(tensor, Packed) else tensor).shape[0]
    for e in range(num_experts):
        # Packed tensors are stored [out, in]; unpacked ones [in, out] (a transposed view, copied once into place).
        w = Packed(tensor.blocks[e], tensor.scales[e]).unpack() if isinstance(tensor, Packed) else tensor[e].T
        if which == "down_proj":
            yield f"{prefix}{e}.down_proj.weight", w
        else:
            yield f"{prefix}{e}.gate_proj.weight", w[0::2]
            yield f"{prefix}{e}.up_proj.weight", w[1::2]
