"""The paged KV pool: fixed-size blocks on the device plus a host pool for swapped blocks.

Layout (block-major)::

    device_kv[num_blocks, num_layers, 2 (k|v), block_size, kv_heads, head_dim]

(with ``num_parts`` 1, one tensor per layer instead of two: DeepSeek-V3's latent, which serves as both; the
layer's K and V views are then the same view). Where layers' heads differ (Gemma 4's full-attention layers are
wider), the pool's "layers" are slots of the narrowest layer's width and each model layer takes as many
consecutive ones as its K and V fill, its K the first half of that region and its V the second, viewed in its own
``(kv_heads, head_dim)`` (``KVLayout.layer_shapes``): nothing is wasted, and to kvcache and a peer the pool is
one of more, equal layers.

One block — every layer's K and V for ``block_size`` tokens — is one contiguous region, so a swap, a copy or
a NIXL transfer of ``n`` blocks costs ``n`` descriptors rather than ``n * 2 * num_layers``. Attention reads a
layer as the strided view ``device_kv[:, layer, 0|1]`` shaped ``[num_blocks, block_size, kv_heads, head_dim]``;
gathering whole blocks from that view costs within ~10% of a layer-major tensor (bench/attention_impl.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.common.errors import InvalidArgument
from services.engine.kv_quant import as_bytes

# An attention-free model's pool (no layer keeps KV: its blocks hold no bytes and only count tokens, or key the
# states kvcache stores) has at most this many blocks, a million tokens: their owners keep a few objects per block.
ATTENTION_FREE_MAX_BLOCKS = 1 << 16


@dataclass(frozen=True)
class KVLayout:
    """Shape of one pool; ``bytes_per_block`` is what a transfer of one block moves."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    num_parts: int = 2  # keys and values, or 1 latent serving as both
    # Each model layer's (kv_heads, head_dim) where they differ, else None: ``num_layers`` then counts slots of
    # ``num_kv_heads x head_dim``, a layer taking ``heads * dim`` / that of them. A worker's own: kvcache and
    # transfers move whole blocks and never see it.
    layer_shapes: tuple[tuple[int, int], ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.layer_shapes is None:
            return
        slot = self.num_kv_heads * self.head_dim
        if self.num_parts != 2 or any(h * d % slot for h, d in self.layer_shapes) \
                or sum(h * d // slot for h, d in self.layer_shapes) != self.num_layers:
            raise ValueError(f"layers of {self.layer_shapes} (heads, dim) must fill {self.num_layers} slots of "
                             f"{self.num_kv_heads} x {self.head_dim} keys and values exactly")

    @property
    def block_shape(self) -> tuple[int, ...]:
        return (self.num_layers, self.num_parts, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def bytes_per_block(self) -> int:
        n = 1
        for d in self.block_shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()

    def blocks_for_budget(self, budget_bytes: int) -> int:
        return int(budget_bytes // self.bytes_per_block)


@dataclass(frozen=True)
class MemoryRegion:
    """A registrable region for NIXL: base address, length in bytes, device id, and "DRAM" or "VRAM"."""

    addr: int
    nbytes: int
    device_id: int
    mem_type: str


class PagedKVPool:
    """Device and host block pools of one layout. Block ids index the first dimension of each pool."""

    def __init__(self, layout: KVLayout, num_blocks: int, num_host_blocks: int, device: torch.device,
                 zeroed: bool = True) -> None:
        """``zeroed`` False: the device pool is left as allocated, for an owner that writes every block before it
        reads it (kvcache's DRAM tier: zeroing its gigabyte faulted in every page at once, seconds of a first
        store on a busy box). A worker's pool is zeroed: its torch attention gathers whole blocks and masks the
        slots past a sequence's end, and a NaN of uninitialised memory would survive the mask."""
        if num_blocks < 1:
            raise InvalidArgument(
                f"the KV budget holds no block ({layout.bytes_per_block} bytes each); raise --kv-cache-bytes"
            )
        self.layout = layout
        self.device = device
        alloc = torch.zeros if zeroed else torch.empty
        self.device_kv = alloc((num_blocks, *layout.block_shape), dtype=layout.dtype, device=device)
        pin = device.type == "cuda"
        self.host_kv = torch.zeros((num_host_blocks, *layout.block_shape), dtype=layout.dtype, pin_memory=pin)
        # Made once: a view costs a few microseconds, and every layer of every pass asks for its pair.
        last = layout.num_parts - 1  # a latent-only pool hands out its one view as K and as V
        self._layers = [(self.device_kv[:, i, 0], self.device_kv[:, i, last]) for i in range(layout.num_layers)] \
            if layout.layer_shapes is None else self._packed_layers()

    def _packed_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each model layer's K and V over its run of slots, in its own shape: contiguous inside each block, as
        attention's kernels and gathers read them."""
        layout, pairs, start = self.layout, [], 0
        for heads, dim in layout.layer_shapes:
            n = heads * dim // (layout.num_kv_heads * layout.head_dim)
            region = self.device_kv[:, start : start + n].flatten(1)
            size, shape = layout.block_size * heads * dim, (self.device_kv.shape[0], layout.block_size, heads, dim)
            pairs.append((region[:, :size].view(shape), region[:, size:].view(shape)))
            start += n
        return pairs

    @property
    def num_blocks(self) -> int:
        return self.device_kv.shape[0]

    @property
    def num_host_blocks(self) -> int:
        return self.host_kv.shape[0]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V views of one layer, each ``[num_blocks, block_size, kv_heads, head_dim]``."""
        return self._layers[layer]

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copies device blocks to host blocks: ``pairs`` of (device block id, host block id)."""
        if pairs:
            src, dst = _split(pairs, self.device)
            as_bytes(self.host_kv)[dst.cpu()] = as_bytes(self.device_kv)[src].to("cpu", non_blocking=False)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copies host blocks to device blocks: ``pairs`` of (host block id, device block id)."""
        if pairs:
            src, dst = _split(pairs, self.device)
            as_bytes(self.device_kv)[dst] = as_bytes(self.host_kv)[src.cpu()].to(self.device)

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        """Copies device blocks to device blocks (copy-on-write of shared partial blocks)."""
        if pairs:
            src, dst = _split(pairs, self.device)
            as_bytes(self.device_kv)[dst] = as_bytes(self.device_kv)[src]  # a float8 pool's as bytes: kv_quant.py

    def memory_regions(self) -> list[MemoryRegion]:
        """The two pools as registrable regions (for a NIXL agent)."""
        regions = [_region(self.device_kv)]
        if self.num_host_blocks:
            regions.append(_region(self.host_kv))
        return regions

    def block_region(self, block_id: int, host: bool = False) -> tuple[int, int]:
        """(address, length) of one block: one contiguous region, as the layout promises."""
        pool = self.host_kv if host else self.device_kv
        block = pool[block_id]
        return block.data_ptr(), block.numel() * block.element_size()


def _split(pairs: list[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor(pairs, dtype=torch.long, device=device)
    return t[:, 0], t[:, 1]


def _region(t: torch.Tensor) -> MemoryRegion:
    device_id = t.device.index or 0
    return MemoryRegion(t.data_ptr(), t.numel() * t.element_size(), device_id, "VRAM" if t.is_cuda else "DRAM")
