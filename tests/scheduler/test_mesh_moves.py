"""A request whose every worker fails while running it is moved at most ``max_moves`` times, then ends with an
error that says so: one request that breaks whatever worker runs it must not take every worker down in turn."""

from __future__ import annotations

import anyio
import grpc
import pytest

from seawall.v1 import worker_pb2, worker_pb2_grpc
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.mesh import Mesh
from tests.scheduler.links import tracked_request, worker_info

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _BrokenWorker(worker_pb2_grpc.WorkerServicer):
    """Answers a plan that runs a sequence with a result that does not parse (two tokens counted, one sent)."""

    def __init__(self) -> None:
        self.plans = 0

    async def StepStream(self, request_iterator, context):
        async for plan in request_iterator:
            self.plans += 1
            yield worker_pb2.StepResult(step_id=plan.step_id, sampled_seq_ids=list(plan.scheduled_seq_ids)[:1],
                                        num_sampled_tokens=[2], sampled_token_ids=[7])


@pytest.mark.parametrize("max_moves", [0, 1])
async def test_a_request_that_breaks_every_worker_is_moved_at_most_max_moves_times(max_moves):
    workers = [_BrokenWorker() for _ in range(3)]
    servers, ports = [], []
    for w in workers:
        server = grpc.aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(w, server)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        servers.append(server)
    mesh = Mesh(SchedulerServiceConfig(mode="colocated", max_moves=max_moves))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(mesh.run)
            while mesh._tg is None:
                await anyio.sleep(0.01)
            links = [mesh.register(f"127.0.0.1:{port}", worker_info()) for port in ports]
            tracked = tracked_request("r")
            mesh.submit(tracked)
            with anyio.fail_after(20):
                await tracked.done.wait()
            delta = tracked.take()
            assert delta.finish_reason == "error" and tracked.moves == max_moves + 1
            assert f"on {max_moves + 1} workers that failed" in delta.detail
            assert f"(--max-moves {max_moves})" in delta.detail
            assert sum(not link.alive for link in links) == max_moves + 1  # the rest were never given it
            assert "r" not in mesh.tracked and not mesh.unplaced
            tg.cancel_scope.cancel()
    finally:
        await mesh.close()
        for server in servers:
            await server.stop(None)
