"""Transfers into freshly reserved blocks wait for the plans in flight: the blocks' previous owners may still
use them there (a swap-out copies them out, a last decode writes one), and nothing orders a kvcache load or a
pull with the worker's steps. Real cores and real gRPC clients; the transfers' far ends are not listening,
so each fails fast once it is tried, which is what the tests watch for."""

from __future__ import annotations

import anyio
import pytest

from seawall.launcher import free_port
from seawall.v1 import worker_pb2
from services.common.sampling_params import SamplingParams
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.dual_path import DualPath
from services.scheduler.kvcache_client import KVCacheClient
from services.scheduler.mesh import Mesh
from services.scheduler.worker_link import Arrival, WorkerLink

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
ROLES = {"prefill": worker_pb2.WORKER_ROLE_PREFILL, "decode": worker_pb2.WORKER_ROLE_DECODE,
         "hybrid": worker_pb2.WORKER_ROLE_HYBRID}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _link(mesh: Mesh, worker_id: str, role: str) -> WorkerLink:
    info = worker_pb2.WorkerInfo(role=ROLES[role], model="tiny", num_device_blocks=64, max_model_len=4096)
    info.kv_layout.block_size = 16
    link = WorkerLink.connect(worker_id, f"127.0.0.1:{free_port()}", info, mesh.config.core)  # nothing listens
    mesh.links[worker_id] = link
    return link


def _req(rid: str, prompt_len: int, computed: int = 0) -> Request:
    return Request(rid, [3 + i for i in range(prompt_len)], SamplingParams(max_tokens=8), 0.0,
                   num_computed_tokens=computed)


async def test_plans_done_waits_for_every_plan_committed_before_it():
    mesh = Mesh(SchedulerServiceConfig())
    link = _link(mesh, "w", "hybrid")
    await link.plans_done()  # nothing in flight
    link.note_sent(1)
    link.note_sent(2)
    returned = []

    async def wait(tag):
        await link.plans_done()
        returned.append(tag)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "before 3")
        await anyio.sleep(0.01)
        link.note_sent(3)  # a later plan: the first waiter does not wait for it
        tg.start_soon(wait, "after 3")
        await anyio.sleep(0.01)
        link.note_done(1)
        await anyio.sleep(0.01)
        assert returned == []
        link.note_done(2)
        await anyio.sleep(0.01)
        assert returned == ["before 3"]
        link.alive = False  # the worker died: nothing it would run matters any more
        link.release_fences()
    assert returned == ["before 3", "after 3"]
    await link.plans_done()


async def test_a_kvcache_load_waits_for_the_plans_in_flight():
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))
    link = _link(mesh, "w", "hybrid")
    client = KVCacheClient(f"127.0.0.1:{free_port()}", timeout_s=5)  # fails at once when called
    dual = mesh.dual_path = DualPath(mesh, client)
    req = _req("r", 40)
    link.note_sent(7)  # a plan in flight may still use the blocks the load is about to reserve
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(dual._pe_read, req, [11, 12], link)
            await anyio.sleep(0.5)
            assert req.status is RequestStatus.ARRIVING and not client.num_failures  # reserved, not loading
            assert dual.reads["w"].queued == 0
            link.note_done(7)
        # The load ran (and failed: nothing listens): the prompt is computed instead.
        assert client.num_failures == 1 and req.status is RequestStatus.WAITING
    finally:
        await client.close()


async def test_a_de_read_load_waits_for_the_decode_workers_plans_in_flight():
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated"))
    prefill, decode = _link(mesh, "p", "prefill"), _link(mesh, "d", "decode")
    client = KVCacheClient(f"127.0.0.1:{free_port()}", timeout_s=5)
    dual = mesh.dual_path = DualPath(mesh, client, policy="de-read")
    req = _req("r", 40)
    decode.note_sent(2)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(dual._de_read, req, [11, 12], prefill, decode)
            await anyio.sleep(0.5)
            assert "r#kv" in decode.core.arriving and not client.num_failures  # staged, not loading
            decode.note_done(2)
        assert client.num_failures == 1 and not decode.core.arriving  # loaded (failed), the stage let go
    finally:
        await client.close()


async def test_a_hand_off_pull_waits_for_the_receivers_plans_in_flight():
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated"))
    src, dst = _link(mesh, "p", "prefill"), _link(mesh, "d", "decode")
    req = _req("r", 40, computed=40)
    req.output_token_ids.append(5)
    dst.note_sent(3)
    blocks = dst.core.reserve_arrival(req)
    async with anyio.create_task_group() as tg:
        mesh._tg = tg
        tg.start_soon(mesh._transfer, Arrival(req, src, [0, 1, 2]), dst, blocks)
        await anyio.sleep(0.5)
        assert req.status is RequestStatus.ARRIVING  # no pull tried yet: it would have failed by now
        dst.note_done(3)
    assert req.status is RequestStatus.WAITING  # the pull ran, failed, and the prompt is recomputed
