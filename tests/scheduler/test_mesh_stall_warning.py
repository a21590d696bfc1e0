"""A worker's core that holds requests and plans nothing for ``stall_warning_s`` is logged with what it holds and
counted, again while it lasts: a core that can never plan again (bench/README.md: the chunking policies' prompt
order deadlock) once left its streams hanging without a word in any log."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import anyio
import pytest

from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.mesh import Mesh
from tests.scheduler.links import tracked_request, worker_info
from tests.scheduler.test_mesh_dropped_worker import _serve, _StalledWorker, _until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@asynccontextmanager
async def _mesh_with_a_worker(stall_warning_s: float, blocks: int = 64):
    """A running colocated mesh with one registered stand-in worker (it takes plans, answers none)."""
    worker = _StalledWorker()
    server, port = await _serve(worker)
    mesh = Mesh(SchedulerServiceConfig(mode="colocated", stall_warning_s=stall_warning_s))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(mesh.run)
            await _until(lambda: mesh._tg is not None, "the mesh to start")
            yield mesh, mesh.register(f"127.0.0.1:{port}", worker_info(blocks=blocks)), worker
            tg.cancel_scope.cancel()
    finally:
        await mesh.close()  # a channel left open delivers its cancelled step stream to a later test's loop
        await server.stop(None)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "planned nothing" in r.getMessage()]


async def test_a_core_that_plans_nothing_while_holding_requests_is_reported(caplog):
    caplog.set_level(logging.WARNING, logger="services.scheduler.mesh")
    async with _mesh_with_a_worker(0.2, blocks=4) as (mesh, link, worker):
        # A transfer out holds 3 of the 4 blocks: the 37-token prompt (3 blocks) waits for them.
        link.core.handed_off["sent"] = link.core.blocks.allocate(3)
        mesh.submit(tracked_request("r"))
        stalls = mesh.metrics.stalls.labels(link.worker_id)
        await _until(lambda: stalls._value.get() >= 2, "two stall warnings")
        assert worker.plans == 0
        warning = _warnings(caplog)[0]
        assert f"worker {link.worker_id} planned nothing for 0.2 s while holding 0 running, 1 waiting" in warning
        assert "(1 of 4 blocks free, 3 held for transfers out)" in warning

        # The transfer ends: the request runs.
        link.core.release_handed_off("sent")
        link.wake()
        await _until(lambda: worker.plans >= 1, "the request's plan to reach the worker")


async def test_an_idle_core_with_no_requests_is_not_a_stall(caplog):
    caplog.set_level(logging.WARNING, logger="services.scheduler.mesh")
    async with _mesh_with_a_worker(0.05) as (mesh, link, _):
        await anyio.sleep(0.5)
        assert mesh.metrics.stalls.labels(link.worker_id)._value.get() == 0
        assert not _warnings(caplog)
