"""A worker dropped while calls to it are pending: closing its channel cancels them, and gRPC reports that by
raising CancelledError in the tasks awaiting them. The mesh's task group must take that as failed calls,
not as its own cancellation, and go on driving the other workers (bench/soak.py found it: a killed decode
worker with a KV pull pending stopped the whole mesh)."""

from __future__ import annotations

import asyncio

import anyio
import grpc
import pytest

from seawall.v1 import worker_pb2, worker_pb2_grpc
from services.common.rpc import rpc
from services.common.sampling_params import SamplingParams
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request
from services.scheduler.mesh import Mesh
from services.scheduler.worker_link import Arrival
from tests.scheduler.links import add_link, tracked_request, worker_info

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _StalledWorker(worker_pb2_grpc.WorkerServicer):
    """Takes plans and pulls and never answers either: a hung worker the mesh is about to drop."""

    def __init__(self) -> None:
        self.plans = 0
        self.pulls = 0

    async def StepStream(self, request_iterator, context):
        async for _ in request_iterator:
            self.plans += 1
        yield worker_pb2.StepResult()  # never reached while the scheduler keeps the stream open

    async def PullKV(self, request, context):
        self.pulls += 1
        await anyio.sleep_forever()


async def _serve(servicer) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _until(condition, what: str) -> None:
    with anyio.move_on_after(10):
        while not condition():
            await anyio.sleep(0.01)
        return
    pytest.fail(f"waited 10 s for {what}")


async def test_dropping_a_worker_with_a_step_and_a_pull_pending_leaves_the_mesh_running():
    stalled = _StalledWorker()
    server, port = await _serve(stalled)
    mesh = Mesh(SchedulerServiceConfig(mode="colocated", step_timeout_s=60))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(mesh.run)
            await _until(lambda: mesh._tg is not None, "the mesh to start")
            dst = mesh.register(f"127.0.0.1:{port}", worker_info())
            # A request running on it: the mesh's loop for it awaits the step's result.
            tracked = tracked_request("r")
            mesh.submit(tracked)
            # A hand-off into it: the pull is pending on the worker.
            src = add_link(mesh, "src", "prefill")
            moved = Request("m", list(range(3, 40)), SamplingParams(max_tokens=4), 0.0, num_computed_tokens=37)
            moved.output_token_ids.append(5)
            src.core.handed_off["m"] = src.core.blocks.allocate(3)  # its KV, held for the pull
            blocks = dst.core.reserve_arrival(moved)
            mesh._tg.start_soon(mesh._transfer, Arrival(moved, src, [0, 1, 2]), dst, blocks)
            await _until(lambda: stalled.plans and stalled.pulls, "a plan and a pull to reach the worker")

            mesh._fail(dst, "dropped by the test")  # closes its channel: both calls are cancelled under them
            await _until(lambda: "m" not in src.core.handed_off, "the pull to end")  # as a failed call
            await anyio.sleep(0.2)  # the step loop has ended too
            mesh._tg.start_soon(anyio.sleep, 0)  # the mesh's task group is still running: no RuntimeError
            assert not tracked.finished and mesh.where["r"] is src  # moved to the worker left, to run again
            tg.cancel_scope.cancel()
    finally:
        await mesh.close()  # a channel left open delivers its cancelled step stream to a later test's loop
        await server.stop(None)


async def test_rpc_turns_a_call_cancelled_by_its_channel_into_a_cancelled_rpc_error():
    stalled = _StalledWorker()
    server, port = await _serve(stalled)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = worker_pb2_grpc.WorkerStub(channel)
    caught: list[BaseException] = []

    async def pull() -> None:
        try:
            await rpc(stub.PullKV(worker_pb2.PullKVRequest()))
        except grpc.aio.AioRpcError as exc:
            caught.append(exc)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pull)
            await _until(lambda: stalled.pulls, "the pull to reach the worker")
            await channel.close()
        assert caught and caught[0].code() == grpc.StatusCode.CANCELLED
        # A task that is itself cancelled still unwinds with its own cancellation.
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = worker_pb2_grpc.WorkerStub(channel)
        with anyio.move_on_after(0.3) as scope:
            await rpc(stub.PullKV(worker_pb2.PullKVRequest()))
        assert scope.cancelled_caught
    finally:
        await channel.close()
        await server.stop(None)


async def test_a_mesh_whose_task_group_ends_by_itself_raises_instead_of_returning():
    # Before rpc(), a pull's stray CancelledError cancelled the group, run() returned quietly, and the
    # scheduler went on answering every call with "This task group is not active".
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))

    async def stray() -> None:
        raise asyncio.CancelledError()  # what grpc.aio raises for a call its channel's close cancelled

    with pytest.raises(BaseExceptionGroup) as raised:
        async with anyio.create_task_group() as tg:
            tg.start_soon(mesh.run)
            await _until(lambda: mesh._tg is not None, "the mesh to start")
            mesh._tg.start_soon(stray)
            await anyio.sleep(5)
            pytest.fail("the mesh's task group was cancelled and nothing noticed")
    (error,) = raised.value.exceptions
    assert isinstance(error, RuntimeError) and "ended by itself" in str(error)
