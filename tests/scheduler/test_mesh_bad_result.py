"""A worker whose step result does not parse is treated as failed: the mesh drops it and queues its requests
again (here no other worker is alive, so they wait unplaced), and keeps serving."""

from __future__ import annotations

import anyio
import grpc
import pytest

from seawall.v1 import worker_pb2, worker_pb2_grpc
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.mesh import Mesh
from tests.scheduler.links import tracked_request, worker_info

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _MisalignedWorker(worker_pb2_grpc.WorkerServicer):
    """Answers every plan with two sampled tokens counted for a sequence but one token id sent."""

    async def StepStream(self, request_iterator, context):
        async for plan in request_iterator:
            yield worker_pb2.StepResult(step_id=plan.step_id, sampled_seq_ids=list(plan.scheduled_seq_ids)[:1],
                                        num_sampled_tokens=[2], sampled_token_ids=[7])


async def test_a_result_whose_columns_do_not_line_up_fails_the_worker_and_requeues_its_requests():
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(_MisalignedWorker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(mesh.run)
            while mesh._tg is None:
                await anyio.sleep(0.01)
            link = mesh.register(f"127.0.0.1:{port}", worker_info())
            tracked = tracked_request("r")
            mesh.submit(tracked)
            with anyio.fail_after(10):
                while link.alive:
                    await anyio.sleep(0.01)
            assert not mesh.live_links() and [r.request_id for r in mesh.unplaced] == ["r"]
            assert not tracked.finished  # still the client's: it runs once a worker registers
            tg.cancel_scope.cancel()
    finally:
        await mesh.close()
        await server.stop(None)
