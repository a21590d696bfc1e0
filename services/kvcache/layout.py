"""KV layouts at the kvcache's edge: the ``KVLayout`` message of a peer ↔ the engine's ``KVLayout``."""

from __future__ import annotations

import torch

from seawall.v1 import common_pb2
from services.common.errors import InvalidArgument
from services.common.kv_transport import kv_dtype_proto
from services.engine.kv_pool import KVLayout

TORCH_DTYPES = {
    common_pb2.KV_DTYPE_FLOAT32: torch.float32,
    common_pb2.KV_DTYPE_FLOAT16: torch.float16,
    common_pb2.KV_DTYPE_BFLOAT16: torch.bfloat16,
    common_pb2.KV_DTYPE_FP8_E4M3: torch.float8_e4m3fn,
    common_pb2.KV_DTYPE_FP8_E5M2: torch.float8_e5m2,
}


def layout_from_proto(msg: common_pb2.KVLayout, what: str) -> KVLayout:
    """The block-major layout ``msg`` describes. InvalidArgument (naming ``what``) when it is unset, not
    block-major (one region per block), or its byte counts disagree with its shape."""
    if not msg.block_size or msg.dtype not in TORCH_DTYPES:
        raise InvalidArgument(f"{what}.kv_layout is missing or has no dtype; send the endpoint's KVLayout")
    layout = KVLayout(num_layers=msg.num_layers, block_size=msg.block_size, num_kv_heads=msg.num_kv_heads,
                      head_dim=msg.head_dim, dtype=TORCH_DTYPES[msg.dtype], num_parts=msg.kv_parts or 2)
    if msg.regions_per_block != 1 or msg.bytes_per_block != layout.bytes_per_block \
            or msg.region_block_bytes != layout.bytes_per_block:
        raise InvalidArgument(
            f"{what}.kv_layout must be block-major (regions_per_block 1, bytes_per_block = region_block_bytes "
            f"= {layout.bytes_per_block} for its shape); got regions_per_block {msg.regions_per_block}, "
            f"bytes_per_block {msg.bytes_per_block}, region_block_bytes {msg.region_block_bytes}"
        )
    return layout


def describe(layout: KVLayout) -> str:
    """A short human form for error messages: ``layers x block_size x kv_heads x head_dim dtype``."""
    latent = " (latent)" if layout.num_parts == 1 else ""
    return (f"{layout.num_layers} layers{latent} x {layout.block_size} tokens x {layout.num_kv_heads} kv heads x "
            f"{layout.head_dim} {str(layout.dtype).removeprefix('torch.')} ({layout.bytes_per_block} B/block)")


def dtype_code(dtype: torch.dtype) -> int:
    """The ``KVDtype`` number of a torch dtype (what block file headers store)."""
    return kv_dtype_proto(dtype)
