"""A float8 KV cache (vLLM's ``--kv-cache-dtype fp8``): one byte per key or value element instead of two (bf16)
or four (fp32), so the same KV memory holds two or four times the tokens — the sequences a burst can keep
resident before the scheduler preempts, and half or a quarter of the bytes each KV transfer moves.

Keys and values are rounded to float8 as they are written (saturated at its largest finite value; over a scale
that is 1, vLLM's default, unless the checkpoint calibrated one per layer: a kv_cache_scheme) and widened back to
the model's dtype (times that scale) where attention reads them.
Every query attends the rounded values, its own token's too (a prompt chunk's keys are rounded before it attends
them), so what a step computes does not depend on whether a key was written by this step or an earlier one:
chunked prefill of any size, prefix-cache hits, swaps and transfers give the same tokens as one pass — those of
transformers with a cache that rounds every key and value it stores the same way (the tests' oracle).

The rounding makes the forward pass chaotic in the last bit: a key computed one ulp apart in fp32 (as the fused
CPU kernels' norms and RoPE compute it, against torch's ops) may sit at a float8 midpoint and round to the next
float8, 6% away, and the difference grows through the layers (the built-in model: one key element of 1,088 in
the first layer, a different first token by the fourth). So with a float8 pool the CPU runs the torch ops, as a
GPU does, which round as transformers' do: the tokens stay those of the oracle.
"""

from __future__ import annotations

import functools

import torch

from services.engine.fp8 import FP8_DTYPES

# vLLM's names (EngineConfig.kv_cache_dtype): "fp8" is e4m3, more precision (what vLLM picks on current GPUs);
# e5m2 has more range.
_FLOAT8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def kv_cache_torch_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's element type for ``EngineConfig.kv_cache_dtype``: the model's for ``auto``, else the float8."""
    return model_dtype if name == "auto" else _FLOAT8[name]


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A float8 tensor as the uint8 view that indexing ops take (a view: no copy). torch's float8 support in
    indexing differs by version and device ("index_cuda" / "index_select_cuda" / "index_copy_cpu" not
    implemented for Float8 were each reported), bytes are moved the same everywhere; other dtypes as they are."""
    return t.view(torch.uint8) if t.dtype in FP8_DTYPES else t


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: float | None = None) -> torch.Tensor:
    """``x`` (over ``scale``, a checkpoint's calibrated one) rounded to ``dtype`` (a float8), saturated at its
    largest finite value: a cast alone may turn an out-of-range value into NaN (e4m3fn has no infinity), which
    would then spread through every softmax."""
    info = torch.finfo(dtype)
    if scale is not None:
        x = x / scale
    return x.clamp(info.min, info.max).to(dtype)


def widen(x: torch.Tensor, dtype: torch.dtype, scale: float | None = None) -> torch.Tensor:
    """``x`` (float8: a pool's gathered rows, a step's rounded keys) in ``dtype``, times ``scale`` where the
    checkpoint calibrated one. On the CPU an e4m3 tensor is looked up in a table of its 256 values: torch's own
    conversion runs ~3x slower here (2.6M elements: 5.7 ms against 1.9; e5m2's, a truncated float16, is as fast
    as a copy)."""
    if x.dtype == torch.float8_e4m3fn and x.device.type == "cpu":
        wide = _table(dtype).index_select(0, x.view(torch.uint8).flatten().int()).view(x.shape)
    else:
        wide = x.to(dtype)
    return wide if scale is None else wide * scale


@functools.cache
def _table(dtype: torch.dtype) -> torch.Tensor:
    """Every e4m3 byte's value in ``dtype`` (a constant)."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(dtype)
