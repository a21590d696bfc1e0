"""The oracle of a float8 KV cache: transformers with a cache that rounds every key and value it stores to float8
(saturated, scale 1), written here from the definition rather than from Seawall's code."""

from __future__ import annotations

import torch
import transformers

FLOAT8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def rounding_cache(kv_cache_dtype: str, scales: dict[int, tuple[float, float]] | None = None):
    """``make()`` of a ``DynamicCache`` whose stored keys and values (and so those attention reads, the new
    token's own too) are rounded to the float8 ``kv_cache_dtype`` names and widened back; with ``scales`` (layer
    -> (key scale, value scale), a checkpoint's calibrated ones), divided by them before and times them after."""
    dtype = FLOAT8[kv_cache_dtype]
    limit = torch.finfo(dtype).max

    def rounded(x: torch.Tensor, scale: float | None) -> torch.Tensor:
        if scale is None:
            return x.clamp(-limit, limit).to(dtype).to(x.dtype)
        return (x / scale).clamp(-limit, limit).to(dtype).to(x.dtype) * scale

    class RoundingCache(transformers.DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            k_scale, v_scale = scales[layer_idx] if scales else (None, None)
            return super().update(rounded(key_states, k_scale), rounded(value_states, v_scale), layer_idx, *args,
                                  **kwargs)

    return RoundingCache
