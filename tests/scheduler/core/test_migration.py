"""Live migration in the core: a leaving decode holds still until no plan in flight runs it, then is handed off
and decodes on another scheduler from the next token on."""

from __future__ import annotations

import pytest

from services.common.step import SampledToken, StepResult
from services.scheduler.core.request import RequestStatus
from tests.scheduler.core.test_scheduler import create_requests, create_scheduler, step


def _decoding(s, n=2, prompt_len=10, max_tokens=20):
    reqs = create_requests(n, prompt_len=prompt_len, max_tokens=max_tokens)
    for r in reqs:
        s.add(r)
    while not all(r.output_token_ids for r in reqs):
        step(s)
    return reqs


def test_a_leaving_request_holds_still_keeps_its_blocks_and_leaves_once_its_plans_ran():
    s = create_scheduler()
    r0, r1 = _decoding(s)
    assert sorted(s.migratable()) == [("r0", r0.num_tokens), ("r1", r1.num_tokens)]
    s.start_migration("r0")
    assert s.migratable() == [("r1", r1.num_tokens)]
    assert s.ready_to_leave(oldest_in_flight=None) == ["r0"]  # nothing in flight ran it after the mark
    outputs, blocks = list(r0.output_token_ids), list(r0.block_ids)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r1": 1}  # r0 is not scheduled, nor dropped
    assert r0.output_token_ids == outputs and r0.block_ids == blocks and r0.status is RequestStatus.RUNNING
    held = s.hand_off("r0")
    assert held == blocks and "r0" not in s.leaving and "r0" not in s.requests
    assert s.schedule().finished == ["r0"]  # the worker drops the sequence; its blocks wait for the transfer
    s.release_handed_off("r0")
    s.check_integrity()


def test_a_leaving_request_waits_for_the_plans_in_flight_that_run_it():
    s = create_scheduler()
    (r0,) = _decoding(s, n=1)
    plan = s.schedule()
    s.expect(plan)  # sent; the next plan is planned before its result, as the mesh does
    assert r0.num_pending == 1
    s.start_migration("r0")
    behind = s.schedule()
    assert "r0" not in behind.num_scheduled_tokens
    assert s.ready_to_leave(oldest_in_flight=plan.step_id) == []  # its token is still being computed
    s.on_result(plan, StepResult(plan.step_id, sampled={"r0": [SampledToken(9)]}))
    assert s.ready_to_leave(oldest_in_flight=None) == ["r0"] and r0.output_token_ids[-1] == 9
    s.check_integrity()


def test_a_leaving_request_is_no_victim_and_a_finish_or_drain_ends_its_move():
    s = create_scheduler(num_blocks=8, policy="vllm")
    r0, r1 = _decoding(s, max_tokens=40)
    s.start_migration("r1")  # the latest arrival: the one vllm's policy would preempt first
    for _ in range(40):  # r0 fills the pool; when it needs another block, nothing is left to preempt but itself
        step(s)
        if r0.num_preemptions:
            break
    assert r0.num_preemptions == 1
    assert r1.status is RequestStatus.RUNNING and r1.num_preemptions == 0
    s.finish("r1")
    assert not s.leaving
    s.check_integrity()
    t = create_scheduler()
    _decoding(t, n=1)
    t.start_migration("r0")
    t.drain()
    assert not t.leaving


def test_the_receiver_continues_from_the_next_token():
    src, dst = create_scheduler(), create_scheduler()
    (r0,) = _decoding(src, n=1, max_tokens=6)
    step(src, token=8)
    src.start_migration("r0")
    src.hand_off("r0")
    assert dst.reserve_arrival(r0) is not None
    dst.arrive("r0")
    plan, events = step(dst, token=9)
    (new,) = plan.new
    assert new.num_computed_tokens == r0.num_computed_tokens - 1 == len(new.token_ids) - 1
    assert [e.token.token_id for e in events] == [9] and r0.output_token_ids == [7, 8, 9]
    dst.check_integrity()


def test_only_running_requests_migrate():
    s = create_scheduler(chunk_size=4)
    s.add(create_requests(1)[0])
    with pytest.raises(ValueError, match="WAITING, not running"):
        s.start_migration("r0")
    step(s)
    assert s.migratable() == []  # still computing its prompt


def test_a_queued_request_leaves_without_kv_the_most_important_first():
    s = create_scheduler()
    reqs = create_requests(3)
    reqs[2].priority = -1
    for r in reqs:
        s.add(r)
    assert s.next_queued() is reqs[2]
    assert s.take_queued("r2") is reqs[2] and "r2" not in s.requests
    assert s.next_queued() is reqs[0]
    step(s)
    with pytest.raises(ValueError, match="only a waiting request"):
        s.take_queued("r0")  # running now
    s.check_integrity()


def test_a_request_preempted_for_recompute_leaves_with_its_outputs():
    s = create_scheduler(num_blocks=8, policy="vllm")
    r0, r1 = _decoding(s, max_tokens=40)
    for _ in range(40):
        plan, _ = step(s)
        if r1.num_preemptions:
            break
    assert "r1" in plan.finished  # the worker dropped its sequence when it was preempted
    assert r1.status is RequestStatus.WAITING and s.next_queued() is r1
    moved = s.take_queued("r1")
    assert moved.output_token_ids and not moved.block_ids and not moved.num_computed_tokens  # recomputed elsewhere
    assert "r1" not in s.schedule().num_scheduled_tokens
    s.check_integrity()
