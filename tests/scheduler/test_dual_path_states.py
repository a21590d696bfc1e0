"""Storing a hybrid's finished turn (dual_path.py): its blocks go to kvcache only as far as its worker saved a
recurrent state after them, with that state, which stays lent (pinned) until the store ended. Real cores; the
kvcache is not listening, so the store fails fast once it is tried, which is what the tests watch for."""

from __future__ import annotations

import anyio
import pytest

from seawall.launcher import free_port
from services.common.block_hash import extend_hashes
from services.common.sampling_params import FinishReason, SamplingParams
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request
from services.scheduler.dual_path import DualPath
from services.scheduler.kvcache_client import KVCacheClient
from services.scheduler.mesh import Mesh
from services.scheduler.worker_link import WorkerLink
from tests.scheduler.links import add_link, worker_info

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TOKENS = [3 + i for i in range(100)]  # a turn's prompt and outputs: 6 full blocks of 16


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _hybrid_link(mesh: Mesh, checkpoints: int = 4) -> WorkerLink:
    link = add_link(mesh, "w", "hybrid", blocks=32, address=f"127.0.0.1:{free_port()}")  # nothing listens
    info = worker_info("hybrid", 32)
    info.recurrent_state, info.state_checkpoints = True, checkpoints
    link = mesh.links["w"] = WorkerLink.connect("w", link.address, info, mesh.config.core)
    return link


def _finished_turn(link: WorkerLink) -> Request:
    """A session's turn that ran on ``link`` and finished: its 99 computed tokens' blocks held for the store."""
    req = Request("turn", TOKENS[:60], SamplingParams(max_tokens=40), 0.0, num_computed_tokens=99)
    req.output_token_ids = TOKENS[60:]
    req.hold_blocks_on_finish = True
    link.core.reserve_arrival(req)
    link.core.arrive("turn")
    link.core.finish("turn", FinishReason.LENGTH)
    assert link.core.handed_off["turn"]
    return req


def _save_state(link: WorkerLink, block: int) -> int:
    """A state saved where block ``block`` (from 1) of TOKENS ends; its hash."""
    h = extend_hashes([], TOKENS, 16, link.core.seed_of(Request("x", TOKENS, SamplingParams(), 0.0)))[block - 1]
    link.core.checkpoints.assign(h)
    link.core.checkpoints.end_plan()
    link.core.checkpoints.confirm(h)
    return h


def _survives_saves(link: WorkerLink, h: int, first: int) -> bool:
    """Whether the state ``h`` is still saved after as many new saves as there are slots (one plan each, hashes
    from ``first``): they take the least recently used slots, which a lent state's is not among."""
    checkpoints = link.core.checkpoints
    for new in range(first, first + checkpoints.capacity):
        checkpoints.assign(new)
        checkpoints.end_plan()
    return checkpoints.covered([h]) == 1


async def test_a_hybrids_turn_is_stored_with_its_state_lent_until_the_store_ended():
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))
    link = _hybrid_link(mesh)
    client = KVCacheClient(f"127.0.0.1:{free_port()}", timeout_s=5)  # fails at once when called
    dual = mesh.dual_path = DualPath(mesh, client)
    req = _finished_turn(link)
    h = _save_state(link, 4)  # 4 of the 6 full blocks resume: those go, with the state
    link.note_sent(9)  # the plan saving it may still be running on the worker
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(dual.store, link, req, "s")
            await anyio.sleep(0.3)
            assert not client.num_failures and "turn" in link.core.handed_off  # waiting for plan 9
            assert _survives_saves(link, h, first=1)  # lent: it keeps its slot
            link.note_done(9)
        assert client.num_failures == 1  # tried, and failed: nothing listens
        assert "turn" not in link.core.handed_off and link.core.blocks.num_free == 32
        assert not _survives_saves(link, h, first=100)  # no longer lent
    finally:
        await client.close()


async def test_a_hybrids_turn_without_a_saved_state_stores_nothing_and_frees_its_blocks():
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))
    link = _hybrid_link(mesh)
    client = KVCacheClient(f"127.0.0.1:{free_port()}", timeout_s=5)
    dual = mesh.dual_path = DualPath(mesh, client)
    req = _finished_turn(link)
    try:
        with anyio.fail_after(5):
            await dual.store(link, req, "s")
        assert not client.num_failures  # blocks alone resume nothing: kvcache was not asked
        assert "turn" not in link.core.handed_off and link.core.blocks.num_free == 32
        assert not dual._storing  # the session's next turn waits for nothing
    finally:
        await client.close()
