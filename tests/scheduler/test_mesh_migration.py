"""The mesh's migrator over real cores (no worker processes): a worker short of KV memory moves a decode to the
peer with room, only once no plan in flight runs it, and takes it back when the peer dies first."""

from __future__ import annotations

from dataclasses import replace

import anyio
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
    mesh.migrator._start(a, mesh.migrator.load(a, busy=False))
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


async def test_a_worker_keeps_room_for_its_high_priority_request_by_moving_a_normal_one_out():
    """With 16 tokens a request left, "a" is at ease under a 16-token headroom; made r1 high priority with a
    priority headroom of 16, a keeps 16 of its 32 free tokens for it (8 a request left) and moves r0, the
    normal decode, out: r1 is the smaller, the one that would move otherwise, but its stream is not paused."""
    mesh, a, b = _mesh(headroom=16)
    a.core.requests["r1"].priority = -1
    mesh.migrator.after_step(a)  # no priority headroom: nothing moves
    assert not b.arrivals
    mesh.config = replace(mesh.config, priority_headroom=16)
    mesh.migrator.after_step(a)
    (arrival,) = b.arrivals
    assert arrival.request.request_id == "r0" and "r1" in a.core.requests


async def test_placement_counts_the_tokens_kept_for_high_priority_requests():
    mesh, a, b = _mesh()
    loads = {link.worker_id: mesh.engine_load(link).tokens for link in (a, b)}
    mesh.config = replace(mesh.config, priority_headroom=1000)
    a.core.requests["r0"].priority = -1
    assert mesh.engine_load(a).tokens == loads["a"] + 1000 and mesh.engine_load(b).tokens == loads["b"]


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
    mesh.migrator._give_queued(a, mesh.migrator.load(a, busy=False))
    assert list(b.arrivals) == [arrival] and not a.arrivals  # b reserves blocks and pulls from the prefill worker
    assert mesh.migrator.num_queued_moves == 1


async def test_nothing_queued_leaves_a_worker_that_can_start_it_soon():
    mesh, a, b = _mesh()
    mesh.place_on(b, _prompt("q", 100))  # b has room for it
    mesh.migrator.after_step(b)
    assert mesh.where["q"] is b and mesh.migrator.num_queued_moves == 0


def _long_mesh(a_blocks: int = 17):
    """Worker "a" (17 blocks) holding decodes of 100 + 1 and 96 + 1 tokens (7 and 6 blocks: a sampled token has
    no KV yet): 4 blocks free, 32 tokens a request, getting short (under twice the headroom, not under it); "b"
    (64 blocks) empty. r1's 6 full blocks are enough to copy ahead. With 16 blocks a is short."""
    mesh = Mesh(SchedulerServiceConfig(mode="colocated", transfer_timeout_s=5, migration_precopy=True))
    a, b = add_link(mesh, "a", "hybrid", blocks=a_blocks), add_link(mesh, "b", "hybrid", blocks=64)
    for i, n in enumerate((100, 96)):
        mesh.place_on(a, Request(f"r{i}", list(range(1000 * i + 3, 1000 * i + 3 + n)), SamplingParams(max_tokens=64),
                                 0.0))
    _run(a, _send(a))
    return mesh, a, b


async def _until_copied(mesh):
    with anyio.fail_after(10):
        while mesh.migrator.precopies:
            await anyio.sleep(0.01)


async def _copy_ahead(mesh, a, monkeypatch, meanwhile=lambda req: None):
    """Runs ``a``'s next step result through the migrator and its copy ahead to the end. No worker runs here:
    the read stands in for one that copied the blocks, after ``meanwhile(request)`` (what the sender did while
    it copied)."""
    async def copied(req, dst, src, src_blocks, dst_blocks, state=None):
        meanwhile(req)
        return True

    monkeypatch.setattr(mesh.peer, "pull", copied)
    async with anyio.create_task_group() as tg:
        mesh._tg = tg
        mesh.migrator.after_step(a)
        assert list(mesh.migrator.precopies) == ["r1"]
        await _until_copied(mesh)


async def test_a_worker_getting_short_copies_full_blocks_ahead_and_a_failed_copy_lets_go_of_them():
    mesh, a, b = _long_mesh()
    async with anyio.create_task_group() as tg:
        mesh._tg = tg
        mesh.migrator.after_step(a)
        await anyio.sleep(0)  # the copy starts
        # r1 keeps decoding while its 6 full blocks are read: pinned on a, staged on b.
        assert list(mesh.migrator.precopies) == ["r1"] and not a.core.leaving and not b.arrivals
        assert "r1#pin" in a.core.arriving and "r1#ahead" in b.core.arriving
        assert len(b.core.arriving["r1#ahead"].block_ids) == 6
        mesh.migrator.after_step(a)  # a is busy: no second move
        assert list(mesh.migrator.precopies) == ["r1"]
        await _until_copied(mesh)  # nothing listens at b's address: the read fails
    assert mesh.migrator.num_precopied_blocks == 0
    assert not a.core.arriving and not b.core.arriving and b.core.blocks.num_free == 64  # the stages let go
    assert not b.arrivals and not a.core.leaving  # a is not short: nothing moves yet
    a.core.check_integrity()
    b.core.check_integrity()


async def test_a_copy_ahead_of_a_request_that_finished_meanwhile_moves_nothing_and_frees_its_blocks():
    mesh, a, b = _long_mesh()
    async with anyio.create_task_group() as tg:
        mesh._tg = tg
        mesh.migrator.after_step(a)
        await anyio.sleep(0)
        mesh.place_on(a, _prompt("q", 1500))  # too big for b: a is short from now on
        free = a.core.blocks.num_free
        a.core.finish("r1")  # an abort: its blocks stay pinned by the read until it ended
        assert a.core.blocks.num_free == free
        await _until_copied(mesh)
    assert not b.arrivals and not mesh.migrator.moves and mesh.migrator.num_migrations == 0
    assert a.core.blocks.num_free == free + 6 and b.core.blocks.num_free == 64
    a.core.check_integrity()


async def test_a_short_worker_moves_at_once_without_copying_ahead():
    mesh, a, b = _long_mesh(a_blocks=16)  # short: 3 blocks free
    mesh.migrator.after_step(a)  # no task group needed: nothing is copied ahead
    assert not mesh.migrator.precopies and [x.request.request_id for x in b.arrivals] == ["r1"]


async def test_no_copy_ahead_when_switched_off_or_for_few_blocks():
    mesh, a, b = _long_mesh()
    mesh.config = replace(mesh.config, migration_precopy=False)
    mesh.migrator.after_step(a)  # getting short is not short: without copying ahead nothing happens yet
    assert not mesh.migrator.precopies and not b.arrivals
    mesh, a, b = _mesh(headroom=16)  # getting short, but 2 full blocks are not worth copying ahead
    mesh.migrator.after_step(a)
    assert not mesh.migrator.precopies and not b.arrivals


async def test_a_mover_preempted_while_its_blocks_were_copied_starts_over_where_they_are_cached(monkeypatch):
    """The copy ahead lands, but meanwhile the sender ran out and preempted the mover for recompute: it goes to
    the receiver as a queued request, whose copied blocks are a prefix cache hit there."""
    mesh, a, b = _long_mesh()
    await _copy_ahead(mesh, a, monkeypatch, meanwhile=a.core._preempt)  # as a's next plan would, out of blocks
    assert mesh.migrator.num_precopied_blocks == 6 and mesh.migrator.num_queued_moves == 1
    assert mesh.migrator.num_migrations == 0 and not b.arrivals and mesh.where["r1"] is b
    (moved,) = b.core.waiting
    assert moved.request_id == "r1" and "r1" not in a.core.requests
    assert b.cached_prefix_tokens(moved) == 96  # its 6 full blocks: only the rest runs there
    a.core.check_integrity()
    b.core.check_integrity()


async def test_a_worker_getting_short_copies_a_decode_ahead_and_moves_it_once_short(monkeypatch):
    """With a block more (4 free: 32 tokens a request, under twice the headroom but not under it) a copies
    r1's full blocks to b and moves nothing; once short (a prompt queued there), r1 moves with only the rest
    to copy: b caches its full blocks already."""
    mesh, a, b = _long_mesh()
    await _copy_ahead(mesh, a, monkeypatch)
    assert mesh.migrator.num_precopied_blocks == 6 and not b.arrivals and not a.core.leaving
    r1 = a.core.requests["r1"]
    assert b.cached_prefix_tokens(r1) == 96
    mesh.place_on(a, _prompt("q", 1500))  # short now: too big for b, it stays queued on a
    mesh.migrator.after_step(a)  # no task group needed: nothing left worth copying ahead, the move at once
    assert not mesh.migrator.precopies
    (arrival,) = b.arrivals
    assert arrival.request is r1 and mesh.migrator.num_migrations == 1
    a.core.check_integrity()
    b.core.check_integrity()


async def test_a_worker_that_gets_short_during_a_copy_ahead_moves_at_once():
    """The copy ahead of r1 is still under way when a runs short (a prompt queued there): r1 moves now, with
    all its blocks, instead of a waiting for the copy while its decodes grow; the copy, when it ends, is only a
    cache on b."""
    mesh, a, b = _long_mesh()
    async with anyio.create_task_group() as tg:
        mesh._tg = tg
        mesh.migrator.after_step(a)
        await anyio.sleep(0)
        assert list(mesh.migrator.precopies) == ["r1"]
        mesh.place_on(a, _prompt("q", 1500))  # too big for b: a is short from now on
        mesh.migrator.after_step(a)
        (arrival,) = b.arrivals
        assert arrival.request.request_id == "r1" and mesh.migrator.num_migrations == 1
        await _until_copied(mesh)  # the read fails (nothing listens), and the move it preceded is already made
    assert mesh.migrator.num_migrations == 1 and not b.core.arriving and "r1#pin" not in a.core.arriving
    assert "r1" not in a.core.requests and a.core.handed_off["r1"] == arrival.src_blocks
    a.core.check_integrity()
    b.core.check_integrity()


async def test_a_worker_short_by_the_end_of_a_copy_ahead_moves_the_request_with_only_the_rest_to_pull(monkeypatch):
    mesh, a, b = _long_mesh()
    # A prompt too big for b is queued on a while r1 is copied: a is short by the copy's end.
    await _copy_ahead(mesh, a, monkeypatch, meanwhile=lambda req: mesh.place_on(a, _prompt("q", 1500)))
    (arrival,) = b.arrivals
    assert arrival.request.request_id == "r1" and mesh.migrator.num_migrations == 1
    assert b.cached_prefix_tokens(arrival.request) == 96  # its 6 full blocks are not pulled again
    a.core.check_integrity()
    b.core.check_integrity()


async def test_a_request_copied_ahead_moves_where_its_copy_is_though_another_peer_has_more_room(monkeypatch):
    """r1's blocks were copied ahead to b; then c, emptier, joins. Once a is short, r1 still moves to b, where
    only the rest is to pull, not to c, where all of it would be (and the copy would have been for nothing)."""
    mesh, a, b = _long_mesh()
    await _copy_ahead(mesh, a, monkeypatch)
    assert mesh.migrator.prepared == {"a": ("r1", "b")}
    add_link(mesh, "c", "hybrid", blocks=256)
    mesh.place_on(a, _prompt("q", 1500))  # short now
    mesh.migrator.after_step(a)
    (arrival,) = b.arrivals
    assert arrival.request.request_id == "r1" and not mesh.links["c"].arrivals
    assert b.cached_prefix_tokens(arrival.request) == 96
