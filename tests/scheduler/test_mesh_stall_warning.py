"""A worker's core that holds requests and plans nothing for ``stall_warning_s`` is logged with what it holds and
counted, again while it lasts: a core that can never plan again (bench/README.md: the chunking policies' prompt
order deadlock) once left its streams hanging without a word in any log."""

from __future__ import annotations

import logging

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


async def test_a_core_that_plans_nothing_while_holding_requests_is_reported(caplog):
    worker = _StalledWorker()
    server, port = await _serve(worker)
    mesh = Mesh(SchedulerServiceConfig(mode="colocated", stall_warning_s=0.2))
    caplog.set_level(logging.WARNING, logger="services.scheduler.mesh")
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(mesh.run)
            await _until(lambda: mesh._tg is not None, "the mesh to start")
            link = mesh.register(f"127.0.0.1:{port}", worker_info(blocks=4))
            # A transfer out holds 3 of the 4 blocks: the 37-token prompt (3 blocks) waits for them.
            link.core.handed_off["sent"] = link.core.blocks.allocate(3)
            mesh.submit(tracked_request("r"))
            stalls = mesh.metrics.stalls.labels(link.worker_id)
            await _until(lambda: stalls._value.get() >= 2, "two stall warnings")
            assert worker.plans == 0
            warning = next(r.getMessage() for r in caplog.records if "planned nothing" in r.getMessage())
            assert f"worker {link.worker_id} planned nothing for 0.2 s while holding 0 running, 1 waiting" in warning
            assert "(1 of 4 blocks free, 3 held for transfers out)" in warning

            # The transfer ends: the request runs, and an idle core with nothing to hold says nothing.
            link.core.release_handed_off("sent")
            link.wake()
            await _until(lambda: worker.plans >= 1, "the request's plan to reach the worker")
            tg.cancel_scope.cancel()
    finally:
        await server.stop(None)


async def test_an_idle_core_with_no_requests_is_not_a_stall(caplog):
    worker = _StalledWorker()
    server, port = await _serve(worker)
    mesh = Mesh(SchedulerServiceConfig(mode="colocated", stall_warning_s=0.05))
    caplog.set_level(logging.WARNING, logger="services.scheduler.mesh")
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(mesh.run)
            await _until(lambda: mesh._tg is not None, "the mesh to start")
            link = mesh.register(f"127.0.0.1:{port}", worker_info())
            await anyio.sleep(0.5)
            assert mesh.metrics.stalls.labels(link.worker_id)._value.get() == 0
            assert not [r for r in caplog.records if "planned nothing" in r.getMessage()]
            tg.cancel_scope.cancel()
    finally:
        await server.stop(None)
