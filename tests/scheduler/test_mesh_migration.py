"""The mesh's migrator over real cores (no worker processes): a worker short of KV memory moves a decode to the
peer with room, only once no plan in flight runs it, and takes it back when the peer dies first."""

from __future__ import annotations

import pytest

from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken, StepResult
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request
from services.scheduler.mesh import Mesh
from services.scheduler.worker_link import Arrival
from tests.scheduler.links import add_link

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _mesh(headroom: int = 32, mode: str = "colocated", b_blocks: int = 64):
    """Worker "a" (8 blocks) holding two decodes of 37 + 1 tokens: 2 blocks free, 16 tokens a request; "b"
    (64 blocks) empty. Disaggregated, they are decode workers."""
    mesh = Mesh(SchedulerServiceConfig(mode=mode, migration_headroom=headroom))
    role = "hybrid" if mode == "colocated" else "decode"
    a, b = add_link(mesh, "a", role, blocks=8), add_link(mesh, "b", role, blocks=b_blocks)
    for i, n in enumerate((37, 36)):
        mesh.place_on(a, Request(f"r{i}", list(range(1000 * i + 3, 1000 * i + 3 + n)), SamplingParams(max_tokens=64),
                                 0.0))
    _run(a, _send(a))  # the prompts, each sampling its first token
    return mesh, a, b


def _send(link, expect=False):
    plan = link.core.schedule()
    link.note_sent(plan.step_id)
    if expect:
        link.core.expect(plan)
    return plan


def _run(link, plan):
    result = StepResult(plan.step_id, sampled={rid: [SampledToken(5)] for rid in plan.num_scheduled_tokens})
    link.core.on_result(plan, result)
    link.note_done(plan.step_id)


async def test_the_smallest_decode_moves_to_the_peer_with_room():
    mesh, a, b = _mesh()
    mesh.migrator.after_step(a)
    (arrival,) = b.arrivals  # handed off at once: no plan in flight runs it
    assert arrival.request.request_id == "r1" and arrival.src is a  # 37 tokens against 38
    assert "r1" not in a.core.requests and a.core.handed_off["r1"] == arrival.src_blocks
    assert mesh.migrator.num_migrations == 1
    assert mesh.metrics.migrations.labels("a", "b")._value.get() == 1
    mesh.migrator.after_step(a)
    assert len(b.arrivals) == 1  # one move at a time: both workers are busy until it landed
    a.core.check_integrity()


async def test_the_move_waits_for_the_plans_in_flight_that_run_it():
    mesh, a, b = _mesh()
    first = _send(a, expect=True)
    second = _send(a, expect=True)  # planned ahead, as the mesh does: both decode r0 and r1
    _run(a, first)
    mesh.migrator.after_step(a)
    assert "r1" in a.core.leaving and not b.arrivals
    assert "r1" not in _send(a).num_scheduled_tokens  # it holds still from now on
    _run(a, second)
    mesh.migrator.after_step(a)  # the plan still in flight was planned after the mark: it does not run r1
    (arrival,) = b.arrivals
    assert arrival.request.output_token_ids == [5, 5, 5] and not arrival.request.num_pending


async def test_a_move_whose_receiver_died_is_called_off():
    mesh, a, b = _mesh()
    _run(a, _send(a, expect=True))
    in_flight = _send(a, expect=True)
    mesh.migrator._start(a, mesh.migrator._load(a, busy=False))
    assert "r1" in a.core.leaving
    b.alive = False
    _run(a, in_flight)
    mesh.migrator.after_step(a)
    assert not a.core.leaving and not mesh.migrator.moves and "r1" in _send(a).num_scheduled_tokens


async def test_no_move_with_migration_off_or_room_left():
    mesh, a, b = _mesh(headroom=0)
    mesh.migrator.after_step(a)
    assert not b.arrivals and not a.core.leaving
    mesh, a, b = _mesh(headroom=16)  # 16 tokens a request left: not under the headroom
    mesh.migrator.after_step(a)
    assert not b.arrivals and not a.core.leaving


def _prompt(rid: str, n: int) -> Request:
    return Request(rid, list(range(2000, 2000 + n)), SamplingParams(max_tokens=8), 0.0)


async def test_a_worker_short_of_memory_gives_a_queued_prompt_to_the_peer_with_room():
    mesh, a, b = _mesh()
    mesh.place_on(a, _prompt("q", 100))  # 32 tokens free there, 100 wanted
    mesh.migrator.after_step(a)  # b is idle: it never steps, it is given work
    assert mesh.where["q"] is b and [r.request_id for r in b.core.waiting] == ["q"] and "q" not in a.core.requests
    assert mesh.migrator.num_queued_moves == 1 and mesh.metrics.queued_moves.labels("a", "b")._value.get() == 1
    assert [x.request.request_id for x in b.arrivals] == ["r1"]  # and a decode moves with its KV, as before
    a.core.check_integrity()
    b.core.check_integrity()


async def test_a_queued_prompt_no_peer_has_room_for_makes_room_by_moving_a_decode_out():
    """De-fragmentation: b (8 blocks) can take a 37-token decode but not the 100-token prompt queued on a,
    whose tokens count against a's freeness: the decode leaves to make room for the prompt where it is."""
    mesh, a, b = _mesh(b_blocks=8)
    mesh.place_on(a, _prompt("q", 100))
    mesh.migrator.after_step(a)
    assert [x.request.request_id for x in b.arrivals] == ["r1"] and mesh.where["q"] is a
    assert mesh.migrator.num_queued_moves == 0 and mesh.migrator.num_migrations == 1


async def test_an_arrival_waiting_for_blocks_goes_to_the_decode_worker_with_room():
    mesh, a, b = _mesh(mode="disaggregated", headroom=17)  # 16 tokens a request: short, but no decode moves
    a.core.start_migration("r0")  # a move out of a under way: a queued one goes all the same
    mesh.migrator.moves["r0"] = (a, b)
    prefill = add_link(mesh, "p", "prefill")
    req = _prompt("x", 40)
    req.output_token_ids.append(5)
    req.num_computed_tokens = 40
    arrival = Arrival(req, prefill, [0, 1, 2])
    a.arrivals.append(arrival)
    mesh.migrator._give_queued(a, mesh.migrator._load(a, busy=False))
    assert list(b.arrivals) == [arrival] and not a.arrivals  # b reserves blocks and pulls from the prefill worker
    assert mesh.migrator.num_queued_moves == 1


async def test_nothing_queued_leaves_a_worker_that_can_start_it_soon():
    mesh, a, b = _mesh()
    mesh.place_on(b, _prompt("q", 100))  # b has room for it
    mesh.migrator.after_step(b)
    assert mesh.where["q"] is b and mesh.migrator.num_queued_moves == 0
