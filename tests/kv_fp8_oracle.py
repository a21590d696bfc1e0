"""The oracle of a float8 KV cache: transformers with a cache that rounds every key and value it stores to float8
(saturated, scale 1), written here from the definition rather than from Seawall's code."""

from __future__ import annotations

import torch
import transformers

FLOAT8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def rounding_cache(kv_cache_dtype: str):
    """``make()`` of a ``DynamicCache`` whose stored keys and values (and so those attention reads, the new
    token's own too) are rounded to the float8 ``kv_cache_dtype`` names and widened back."""
    dtype = FLOAT8[kv_cache_dtype]
    limit = torch.finfo(dtype).max

    def rounded(x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-limit, limit).to(dtype).to(x.dtype)

    class RoundingCache(transformers.DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            return super().update(rounded(key_states), rounded(value_states), layer_idx, *args, **kwargs)

    return RoundingCache
