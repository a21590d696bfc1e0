"""A real model runner behind a worker's gRPC server, in-process on a free port: the endpoint peers (another
worker, kvcache) read KV blocks and recurrent states from, or write them into."""

from __future__ import annotations

import contextlib

import grpc

from seawall.v1 import common_pb2
from services.common.grpc_kv import add_worker_servicer
from services.common.kv_transport import kv_layout_proto
from services.engine.config import EngineConfig
from services.engine.runner import ModelRunner
from services.worker.config import WorkerConfig
from services.worker.servicer import WorkerServicer


class CallContext:
    """What a servicer method called directly (not over gRPC) reads of its context."""

    def invocation_metadata(self):
        return ()


def small_runner(model_dir) -> ModelRunner:
    """A float32 runner of ``model_dir`` with a 64-block pool (of the tiny models' 4 KiB blocks)."""
    return ModelRunner(EngineConfig(model=str(model_dir), dtype="float32", kv_cache_bytes=64 * 4096))


@contextlib.asynccontextmanager
async def served(runner: ModelRunner):
    """``runner`` behind a worker's gRPC server on a free port; yields its endpoint (gRPC address, no NIXL)."""
    server = grpc.aio.server()
    add_worker_servicer(WorkerServicer(WorkerConfig(), runner, None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield common_pb2.KVEndpoint(kv_layout=kv_layout_proto(runner.layout), grpc_address=f"127.0.0.1:{port}")
    finally:
        await server.stop(None)
