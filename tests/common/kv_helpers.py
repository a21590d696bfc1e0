"""Helpers for KV-transfer tests: pools of random blocks and a real gRPC server over one pool."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import torch

from services.common.grpc_kv import GRPC_KV_OPTIONS, KVBytesServicer, add_worker_servicer
from services.engine.kv_pool import KVLayout, PagedKVPool

# Small enough that tests move many blocks quickly: 4 KiB per block.
SMALL_LAYOUT = KVLayout(num_layers=2, block_size=16, num_kv_heads=2, head_dim=16, dtype=torch.float16)


def random_pool(layout: KVLayout, num_blocks: int, seed: int = 0) -> PagedKVPool:
    pool = PagedKVPool(layout, num_blocks, 0, torch.device("cpu"))
    pool.device_kv.copy_(torch.randn(pool.device_kv.shape, generator=torch.Generator().manual_seed(seed)))
    return pool


@contextlib.asynccontextmanager
async def kv_bytes_server(pool: PagedKVPool) -> AsyncIterator[str]:
    """A grpc.aio server on loopback serving Worker.ReadKV/WriteKV over ``pool``; yields its address."""
    srv = grpc.aio.server(options=GRPC_KV_OPTIONS)
    add_worker_servicer(KVBytesServicer(pool), srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await srv.stop(grace=None)
