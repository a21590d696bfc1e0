"""Real pieces for kvcache tests: worker-like endpoints (a PagedKVPool with a NIXL agent and a grpc.aio server
serving Worker.ReadKV/WriteKV through grpc_kv) and kvcache services started in-process on loopback."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import grpc
import grpc.aio
import pytest
import torch

from seawall.v1 import common_pb2, kvcache_pb2_grpc
from services.common.block_hash import extend_hashes, hash_seed
from services.common.grpc_kv import GRPC_KV_OPTIONS, KVBytesServicer, add_worker_servicer
from services.common.kv_transport import NixlKVAgent, kv_layout_proto
from services.engine.kv_pool import KVLayout, PagedKVPool
from services.kvcache.config import KVCacheConfig
from services.kvcache.main import start, stop
from services.kvcache.servicer import KVCacheServicer
from tests.common.kv_helpers import random_pool

LAYOUT = KVLayout(num_layers=2, block_size=16, num_kv_heads=2, head_dim=16, dtype=torch.float16)  # 4 KiB/block
BPB = LAYOUT.bytes_per_block
_names = itertools.count()


@pytest.fixture
def anyio_backend():
    return "asyncio"


def chain(n: int, start: int = 0, prompt: int = 0) -> list[int]:
    """Hashes of blocks ``start .. start + n - 1`` of prompt number ``prompt`` (real chained hashes)."""
    tokens = [(prompt * 7919 + i) % 50_000 for i in range((start + n) * LAYOUT.block_size)]
    return extend_hashes([], tokens, LAYOUT.block_size, hash_seed("test-model", LAYOUT.block_size))[start:]


def make_pool(num_blocks: int = 32, seed: int = 0, layout: KVLayout = LAYOUT) -> PagedKVPool:
    return random_pool(layout, num_blocks, seed)


@dataclass
class Worker:
    pool: PagedKVPool
    agent: NixlKVAgent | None
    address: str

    def endpoint(self, nixl: bool = True, metadata: bool = True) -> common_pb2.KVEndpoint:
        """The worker as a transfer handle: NIXL metadata (when ``nixl`` and ``metadata``) and its address."""
        ep = common_pb2.KVEndpoint(agent_name=self.agent.name if self.agent else f"grpc-{self.address}",
                                   kv_layout=kv_layout_proto(self.pool.layout), grpc_address=self.address)
        if nixl and metadata and self.agent is not None:
            ep.agent_metadata.CopyFrom(self.agent.metadata())
        return ep

    def blocks(self, ids) -> torch.Tensor:
        return self.pool.device_kv[list(ids)].clone()


@pytest.fixture
async def make_worker():
    """``await make_worker(seed=..., nixl=True, num_blocks=32, layout=LAYOUT)`` → a Worker serving ReadKV/WriteKV."""
    servers, agents = [], []

    async def factory(seed: int = 0, nixl: bool = True, num_blocks: int = 32, layout: KVLayout = LAYOUT) -> Worker:
        pool = make_pool(num_blocks, seed, layout)
        agent = NixlKVAgent(f"worker{next(_names)}", pool) if nixl else None
        server = grpc.aio.server(options=GRPC_KV_OPTIONS)
        add_worker_servicer(KVBytesServicer(pool), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        if agent is not None:
            agents.append(agent)
        return Worker(pool, agent, f"127.0.0.1:{port}")

    yield factory
    for server in servers:
        await server.stop(grace=None)
    for agent in agents:
        agent.close()


@dataclass
class KVCache:
    stub: kvcache_pb2_grpc.KVCacheStub
    servicer: KVCacheServicer
    address: str

    @property
    def store(self):
        return self.servicer.store


@pytest.fixture
async def make_kvcache():
    """``await make_kvcache(dram_blocks=16, disk_dir=None, disk_blocks=0, **config)`` → a KVCache served
    in-process on loopback; ``await stop_kvcache(kv)`` stops one early (as SIGTERM would: flush included)."""
    running = []

    async def factory(dram_blocks: int = 16, disk_dir=None, disk_blocks: int = 0, **overrides) -> KVCache:
        config = KVCacheConfig(dram_bytes=dram_blocks * BPB, disk_dir=str(disk_dir) if disk_dir else None,
                               disk_bytes=disk_blocks * (BPB + 64), name=f"kvcache{next(_names)}")
        config = replace(config, **overrides)
        server, servicer = await start(config)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        kv = KVCache(kvcache_pb2_grpc.KVCacheStub(channel), servicer, f"127.0.0.1:{server.port}")
        running.append((server, servicer, channel, kv))
        return kv

    async def stop_one(kv: KVCache) -> None:
        for entry in running:
            if entry[3] is kv:
                running.remove(entry)
                await entry[2].close()
                await stop(entry[0], entry[1], grace_s=1.0)
                return

    factory.stop = stop_one
    yield factory
    for server, servicer, channel, _ in running:
        await channel.close()
        await stop(server, servicer, grace_s=0)
