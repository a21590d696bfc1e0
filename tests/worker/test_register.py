"""A worker announcing itself to a scheduler that takes the call and never answers gives up at its deadline
with Unavailable, which says what happened, not with the blank CancelledError gRPC raises when the deadline's
cancel scope ends a pending call (services/common/rpc.py); one that refuses it, with Seawall's error saying why."""

from __future__ import annotations

import anyio
import grpc
import pytest

from seawall.v1 import scheduler_pb2_grpc, worker_pb2
from services.common.errors import InvalidArgument, Unavailable
from services.worker.main import register

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _RefusingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    async def RegisterWorker(self, request, context):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "it serves another model")


async def test_a_scheduler_that_refuses_the_worker_is_reported_as_seawalls_error_saying_why():
    """A refusal ends the worker with one line (run_service: exit code 2), not a grpc traceback."""
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(_RefusingScheduler(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(InvalidArgument, match=f"scheduler at 127.0.0.1:{port} refused this worker: it serves"):
            await register(f"127.0.0.1:{port}", "127.0.0.1:1", worker_pb2.WorkerInfo(), timeout_s=5.0)
    finally:
        await server.stop(None)


class _SilentScheduler(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.calls = 0

    async def RegisterWorker(self, request, context):
        self.calls += 1
        await anyio.sleep_forever()


async def test_a_scheduler_that_never_answers_is_reported_as_unavailable_at_the_deadline():
    scheduler = _SilentScheduler()
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(Unavailable, match="did not answer within 1 s"):
            await register(f"127.0.0.1:{port}", "127.0.0.1:1", worker_pb2.WorkerInfo(), timeout_s=1.0)
        assert scheduler.calls == 1  # the deadline fell inside the pending call
    finally:
        await server.stop(None)
