"""Worker.MeetPeers over gRPC between real workers: a worker loads each peer's NIXL metadata and opens its
connections to it before a transfer needs them, reports whom it met and counts them in seawall_nixl_peers;
requests that cannot be met say what to fix."""

from __future__ import annotations

import contextlib

import grpc
import pytest

pytest.importorskip("nixl_cu12._api")

from seawall.v1 import common_pb2, worker_pb2_grpc  # noqa: E402
from services.common.grpc_kv import add_worker_servicer  # noqa: E402
from services.common.kv_transport import NixlKVAgent  # noqa: E402
from services.worker.config import WorkerConfig  # noqa: E402
from services.worker.servicer import WorkerServicer  # noqa: E402
from tests.common.served_worker import small_runner  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@contextlib.asynccontextmanager
async def _serve(servicer: WorkerServicer):
    """``servicer`` on a free port; yields a stub to it."""
    server = grpc.aio.server()
    add_worker_servicer(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield worker_pb2_grpc.WorkerStub(channel)
    finally:
        await server.stop(None)


def _endpoint(servicer: WorkerServicer) -> common_pb2.KVEndpoint:
    info = servicer.info()
    return common_pb2.KVEndpoint(agent_name=info.nixl.agent_name, agent_metadata=info.nixl, kv_layout=info.kv_layout)


def _met(servicer: WorkerServicer) -> float:
    (family,) = servicer.metrics.nixl_peers.collect()
    return family.samples[0].value


async def test_a_worker_meets_its_peers_once_and_counts_them(tiny_model_dir):
    workers = []
    for name in ("meet-a", "meet-b", "meet-c"):
        runner = small_runner(tiny_model_dir)
        workers.append(WorkerServicer(WorkerConfig(), runner, NixlKVAgent(name, runner.kv)))
    a, b, c = workers
    try:
        async with _serve(a) as stub:
            assert _met(a) == 0
            reply = await stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[_endpoint(b), _endpoint(c)]))
            assert list(reply.agent_names) == ["meet-b", "meet-c"] and _met(a) == 2
            again = await stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[_endpoint(c)], timeout_ms=5000))
            assert list(again.agent_names) == [] and _met(a) == 2  # met already

            bare = common_pb2.KVEndpoint(kv_layout=_endpoint(b).kv_layout, grpc_address="127.0.0.1:1")
            with pytest.raises(grpc.aio.AioRpcError, match="needs its agent_metadata") as err:
                await stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[bare]))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            other = _endpoint(b)
            other.kv_layout.block_size = 32
            with pytest.raises(grpc.aio.AioRpcError, match="different KV layout: block_size 32") as err:
                await stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[other]))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        for w in workers:
            w.agent.close()


async def test_a_worker_without_nixl_has_no_peers_to_meet(tiny_model_dir):
    async with _serve(WorkerServicer(WorkerConfig(), small_runner(tiny_model_dir), None)) as stub:
        with pytest.raises(grpc.aio.AioRpcError, match="no NIXL agent") as err:
            await stub.MeetPeers(common_pb2.MeetPeersRequest())
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
