"""A request whose every worker fails while running it is moved at most ``max_moves`` times, then ends with an
error that says so: one request that breaks whatever worker runs it must not take every worker down in turn."""

from __future__ import annotations

import anyio
import grpc
import pytest

from seawall.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.mesh import Mesh
from services.scheduler.worker_link import Arrival
from tests.scheduler.links import add_link, tracked_request, worker_info

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


async def test_closing_the_mesh_closes_the_channels_of_workers_that_failed():
    # A failed worker's channel closes in the mesh's task group, which may end first (a close that waits for calls
    # to cancel, cancelled with it): then the mesh's close closes it. Left open, a channel fired its poller into
    # the next test's loop after this one's had ended ("Event loop is closed" in CI).
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(mesh.run)
        while mesh._tg is None:
            await anyio.sleep(0.01)
        link = mesh.register("127.0.0.1:1", worker_info("hybrid"))
        closed, close = [], link.channel.close

        async def waiting_close(grace=None):
            await anyio.sleep(0)  # a close waits for the channel's calls to be cancelled
            await close(grace)
            closed.append(link)

        link.channel.close = waiting_close
        mesh._fail(link, "gone")
        tg.cancel_scope.cancel()
    assert not closed  # the mesh's task group ended first
    await mesh.close()
    assert closed


@pytest.mark.parametrize("max_moves", [1, 0])
async def test_a_hand_off_whose_prefill_worker_died_counts_as_a_move(max_moves):
    # Its KV died with the worker that computed it: the decode worker recomputes the prompt, a move off a failed
    # worker like any other (counted, and bounded by max_moves).
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated", max_moves=max_moves))
    src, dst = add_link(mesh, "prefill-0", "prefill"), add_link(mesh, "decode-0", "decode")
    tracked = tracked_request("h")
    mesh.tracked["h"] = tracked
    req = tracked.request
    req.num_computed_tokens = len(req.prompt_token_ids)
    req.output_token_ids.append(5)
    dst.arrivals.append(Arrival(req, src, src.core.blocks.allocate(3)))
    src.alive = False
    mesh._place_arrivals(dst)
    moved = mesh.metrics.registry.get_sample_value("seawall_requests_moved_total")
    if max_moves:
        assert moved == 1 and tracked.moves == 1 and mesh.where["h"] is dst
        assert dst.core.requests["h"].num_computed_tokens == 0  # recomputed here
    else:
        delta = tracked.take()
        assert moved == 0 and delta.finish_reason == "error" and "prefill-0 failed holding its KV" in delta.detail
        assert "h" not in mesh.tracked and "h" not in dst.core.requests
    assert not dst.arrivals


class _PullFailsAsItsSourceDies(worker_pb2_grpc.WorkerServicer):
    """A decode worker whose pull fails because the worker it reads from died meanwhile."""

    def __init__(self, source) -> None:
        self.source = source

    async def PullKV(self, request, context):
        self.source.alive = False  # as Mesh._fail marks it
        return worker_pb2.PullKVResponse(status=common_pb2.TRANSFER_STATUS_FAILED, error="peer unreachable")


async def test_a_pull_that_fails_because_its_source_died_counts_as_a_move():
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated"))
    src = add_link(mesh, "prefill-0", "prefill")
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(_PullFailsAsItsSourceDies(src), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        dst = add_link(mesh, "decode-0", "decode", address=f"127.0.0.1:{port}")
        tracked = tracked_request("p")
        mesh.tracked["p"] = tracked
        req = tracked.request
        req.num_computed_tokens = len(req.prompt_token_ids)
        req.output_token_ids.append(5)
        src.core.handed_off["p"] = held = src.core.blocks.allocate(3)  # its KV, held for the pull
        blocks = dst.core.reserve_arrival(req)  # as Mesh._place_arrivals does before the pull
        mesh.where["p"] = dst
        await mesh._transfer(Arrival(req, src, held), dst, blocks)
        assert mesh.metrics.registry.get_sample_value("seawall_requests_moved_total") == 1 and tracked.moves == 1
        assert dst.core.requests["p"] in dst.core.waiting  # recomputed on the decode worker
    finally:
        await mesh.close()
        await server.stop(None)
