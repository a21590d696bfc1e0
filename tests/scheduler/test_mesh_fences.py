"""Transfers into freshly reserved blocks wait for the plans in flight: the blocks' previous owners may still
use them there (a swap-out copies them out, a last decode writes one), and nothing orders a kvcache load or a
pull with the worker's steps. Real cores and real gRPC clients; the transfers' far ends are not listening,
so each fails fast once it is tried, which is what the tests watch for."""

from __future__ import annotations

import anyio
import pytest

from seawall.launcher import free_port
from services.common.sampling_params import SamplingParams
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.dual_path import DualPath
from services.scheduler.kvcache_client import KVCacheClient
from services.scheduler.mesh import Mesh
from services.scheduler.worker_link import Arrival, WorkerLink
from tests.scheduler.links import add_link

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _link(mesh: Mesh, worker_id: str, role: str, blocks: int = 64) -> WorkerLink:
    return add_link(mesh, worker_id, role, blocks, address=f"127.0.0.1:{free_port()}")  # nothing listens


def _plan_then_free(link: WorkerLink, prompt_len: int) -> int:
    """A request's prompt planned (and sent: in flight) on ``link``, then aborted: its blocks are free in
    the core while the plan may still write them on the worker. Returns the plan's step id."""
    link.core.add(_req("gone", prompt_len))
    plan = link.core.schedule()
    link.note_sent(plan.step_id)
    link.core.finish("gone")
    return plan.step_id


def _req(rid: str, prompt_len: int, computed: int = 0) -> Request:
    return Request(rid, [3 + i for i in range(prompt_len)], SamplingParams(max_tokens=8), 0.0,
                   num_computed_tokens=computed)


async def test_plans_done_waits_for_the_plans_sent_up_to_a_step():
    mesh = Mesh(SchedulerServiceConfig())
    link = _link(mesh, "w", "hybrid")
    await link.plans_done(5)  # nothing in flight
    link.note_sent(1)
    link.note_sent(2)
    link.note_sent(3)
    await link.plans_done(0)  # no plan up to step 0
    returned = []

    async def wait(upto):
        await link.plans_done(upto)
        returned.append(upto)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, 2)
        tg.start_soon(wait, 3)
        await anyio.sleep(0.01)
        link.note_done(1)
        await anyio.sleep(0.01)
        assert returned == []
        link.note_done(2)
        await anyio.sleep(0.01)
        assert returned == [2]
        link.alive = False  # the worker died: nothing it would run matters any more
        link.release_fences()
    assert returned == [2, 3]
    await link.plans_done(3)


async def test_the_reuse_fence_is_the_last_plan_planned_before_the_blocks_were_freed():
    mesh = Mesh(SchedulerServiceConfig())
    link = _link(mesh, "w", "hybrid", blocks=8)
    core = link.core
    step = _plan_then_free(link, 40)  # 3 blocks, freed after plan `step` was sent
    req = _req("r", 130, computed=128)  # needs all 8 blocks: 5 never used, 3 just freed
    blocks = core.reserve_arrival(req)
    assert core.reuse_fence(blocks[:5]) == 0 and core.reuse_fence(blocks) == step


async def test_a_kvcache_load_waits_for_the_plans_in_flight():
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))
    link = _link(mesh, "w", "hybrid", blocks=3)
    client = KVCacheClient(f"127.0.0.1:{free_port()}", timeout_s=5)  # fails at once when called
    dual = mesh.dual_path = DualPath(mesh, client)
    step = _plan_then_free(link, 40)  # the plan in flight still writes the 3 blocks the load reserves
    req = _req("r", 40)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(dual._pe_read, req, [11, 12], link)
            await anyio.sleep(0.5)
            assert req.status is RequestStatus.ARRIVING and not client.num_failures  # reserved, not loading
            assert dual.reads["w"].queued == 0
            link.note_done(step)
        # The load ran (and failed: nothing listens): the prompt is computed instead.
        assert client.num_failures == 1 and req.status is RequestStatus.WAITING
    finally:
        await client.close()


async def test_a_load_into_blocks_no_plan_in_flight_used_starts_at_once():
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))
    link = _link(mesh, "w", "hybrid")
    client = KVCacheClient(f"127.0.0.1:{free_port()}", timeout_s=5)
    dual = mesh.dual_path = DualPath(mesh, client)
    _plan_then_free(link, 40)  # in flight, but its blocks are at the back of the free queue
    req = _req("r", 40)
    try:
        with anyio.fail_after(5):
            await dual._pe_read(req, [11, 12], link)
        assert client.num_failures == 1 and req.status is RequestStatus.WAITING and link.in_flight
    finally:
        await client.close()


async def test_a_de_read_load_waits_for_the_decode_workers_plans_in_flight():
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated"))
    prefill, decode = _link(mesh, "p", "prefill"), _link(mesh, "d", "decode", blocks=3)
    client = KVCacheClient(f"127.0.0.1:{free_port()}", timeout_s=5)
    dual = mesh.dual_path = DualPath(mesh, client, policy="de-read")
    step = _plan_then_free(decode, 40)
    req = _req("r", 40)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(dual._de_read, req, [11, 12], prefill, decode)
            await anyio.sleep(0.5)
            assert "r#kv" in decode.core.arriving and not client.num_failures  # staged, not loading
            decode.note_done(step)
        assert client.num_failures == 1 and not decode.core.arriving  # loaded (failed), the stage let go
        assert decode.core.blocks.num_free == 3  # its blocks too (none left landing)
        with anyio.fail_after(1):
            await decode.wait_for_work()  # and the worker's loop was woken: a hand-off may be waiting for them
    finally:
        await client.close()


async def test_a_hand_off_pull_waits_for_the_receivers_plans_in_flight():
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated"))
    src, dst = _link(mesh, "p", "prefill"), _link(mesh, "d", "decode", blocks=3)
    step = _plan_then_free(dst, 40)
    req = _req("r", 40, computed=40)
    req.output_token_ids.append(5)
    blocks = dst.core.reserve_arrival(req)
    async with anyio.create_task_group() as tg:
        mesh._tg = tg
        tg.start_soon(mesh._transfer, Arrival(req, src, [0, 1, 2]), dst, blocks)
        await anyio.sleep(0.5)
        assert req.status is RequestStatus.ARRIVING  # no pull tried yet: it would have failed by now
        dst.note_done(step)
    assert req.status is RequestStatus.WAITING  # the pull ran, failed, and the prompt is recomputed
