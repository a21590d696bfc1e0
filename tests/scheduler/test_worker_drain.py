"""A worker leaving on purpose, over real cores (no worker processes): it takes no new request, what it holds
moves to the workers that stay as far as they have room (all its decodes at once, not one move at a time), what
cannot move finishes there, and it is forgotten only once nothing of it is needed."""

from __future__ import annotations

import anyio
import pytest

from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken, StepResult
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request
from services.scheduler.core.scheduler import SchedulerConfig
from services.scheduler.mesh import Mesh
from services.scheduler.tracked import TrackedRequest
from services.scheduler.worker_drain import Drain
from tests.scheduler.links import add_link, tokenizer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _request(i: int, n: int = 37, max_tokens: int = 64) -> Request:
    return Request(f"r{i}", list(range(1000 * i + 3, 1000 * i + 3 + n)), SamplingParams(max_tokens=max_tokens), 0.0)


def _step(link) -> None:
    """Plans a step on ``link`` and applies its result: each scheduled request samples token 5."""
    plan = link.core.schedule()
    link.note_sent(plan.step_id)
    result = StepResult(plan.step_id, sampled={rid: [SampledToken(5)] for rid in plan.num_scheduled_tokens})
    link.core.on_result(plan, result)
    link.note_done(plan.step_id)


def _mesh(b_blocks: int = 64, mode: str = "colocated", max_tokens: int = 64):
    """Worker "a" decoding two requests and holding a third queued (two sequences a step), "b" with
    ``b_blocks`` blocks."""
    mesh = Mesh(SchedulerServiceConfig(mode=mode, core=SchedulerConfig(max_num_seqs=2)))
    role = "hybrid" if mode == "colocated" else "decode"
    a, b = add_link(mesh, "a", role), add_link(mesh, "b", role, blocks=b_blocks)
    for i in range(3):
        mesh.place_on(a, _request(i, max_tokens=max_tokens))
    _step(a)  # r0 and r1 run their prompts and sample; r2 waits for a place in the batch
    return mesh, a, b


async def test_everything_moves_to_the_worker_with_room_and_the_drained_worker_is_forgotten():
    mesh, a, b = _mesh()
    async with anyio.create_task_group() as tg:
        mesh._tg = tg
        a.drain = Drain()
        assert not mesh.drains.step(a)
        assert [x.request.request_id for x in b.arrivals] == ["r0", "r1"]  # both at once: no plan in flight
        assert "r2" in b.core.requests and mesh.where["r2"] is b  # queued: it starts there, nothing to copy
        assert a.drain.moved == 3 and mesh.migrator.num_migrations == 2 and mesh.migrator.num_queued_moves == 1
        assert not mesh.drains.step(a)  # their KV is still to be read from a
        for arrival in list(b.arrivals):
            mesh._release_source(arrival)  # b pulled it
        assert mesh.drains.step(a)
        assert "a" not in mesh.links and not a.alive and a.drain.done.is_set()
        tg.cancel_scope.cancel()


async def test_a_draining_worker_takes_no_new_request():
    mesh, a, b = _mesh(mode="disaggregated")
    p = add_link(mesh, "p", "prefill")
    a.drain = Drain()
    assert mesh.serving_links() == [b, p] and mesh.live_links() == [a, b, p]
    assert mesh.pick_decode_worker(_request(7)) is b
    req = _request(9)
    mesh.place_on(p, req)
    _step(p)
    mesh.hand_off(p, req, dst=a)  # bound for a (a peer-prefix read's decode worker) before it drained
    assert not a.arrivals and [x.request for x in b.arrivals] == [req]
    b.drain = Drain()
    assert mesh.pick_decode_worker(_request(7)) is None and mesh.pick_prompt_worker(_request(7)) is p


async def test_what_cannot_move_finishes_there_before_the_worker_is_forgotten():
    # b has 2 blocks: no room for a decode of 38 tokens and its headroom.
    mesh, a, b = _mesh(b_blocks=2, max_tokens=4)
    words = tokenizer()
    mesh.tracked = {rid: TrackedRequest(req, words, 0.0) for rid, req in a.core.requests.items()}
    async with anyio.create_task_group() as tg:
        mesh._tg = tg
        a.drain = Drain()
        assert not mesh.drains.step(a)
        assert not b.arrivals and a.drain.moved == 1  # only r2, queued: it waits for room on b instead
        while a.core.requests:
            plan = a.core.schedule()
            a.note_sent(plan.step_id)
            result = StepResult(plan.step_id, sampled={rid: [SampledToken(5)] for rid in plan.num_scheduled_tokens})
            mesh._dispatch(a, a.core.on_result(plan, result), 0.0)
            a.note_done(plan.step_id)
            assert not mesh.drains.step(a) or not a.core.requests
        assert a.drain.finished == 2 and not a.alive and a.drain.done.is_set()
        tg.cancel_scope.cancel()


async def test_a_move_to_a_worker_that_starts_draining_is_called_off():
    mesh, a, b = _mesh()
    plan = a.core.schedule()
    a.note_sent(plan.step_id)  # a plan in flight runs r1: its move waits for the result
    mesh.migrator.leave(a.core.requests["r1"], a, b)
    b.drain = Drain()
    a.core.on_result(plan, StepResult(plan.step_id, sampled={rid: [SampledToken(5)]
                                                             for rid in plan.num_scheduled_tokens}))
    a.note_done(plan.step_id)
    mesh.migrator.hand_off_ready(a)
    assert not b.arrivals and "r1" in a.core.requests and "r1" not in a.core.leaving
    a.core.check_integrity()
