"""Live migration in the core: a leaving decode holds still until no plan in flight runs it, then is handed off
and decodes on another scheduler from the next token on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken, StepResult
from services.scheduler.core.policies import POLICY_NAMES
from services.scheduler.core.request import Request, RequestStatus
from tests.scheduler.core.test_scheduler import create_requests, create_scheduler, step


def _decoding(s, n=2, prompt_len=10, max_tokens=20):
    reqs = create_requests(n, prompt_len=prompt_len, max_tokens=max_tokens)
    for r in reqs:
        s.add(r)
    while not all(r.output_token_ids for r in reqs):
        step(s)
    return reqs


def test_a_high_priority_decode_is_not_a_candidate_to_move_while_a_normal_one_is():
    s = create_scheduler()
    reqs = create_requests(3, prompt_len=10, max_tokens=20)
    reqs[0].priority = reqs[2].priority = -1
    for r in reqs:
        s.add(r)
    while not all(r.output_token_ids for r in reqs):
        step(s)
    assert s.migratable() == [("r1", reqs[1].num_tokens)]
    s.start_migration("r1")
    assert sorted(s.migratable()) == [("r0", reqs[0].num_tokens), ("r2", reqs[2].num_tokens)]  # only high ones left


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


migration_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 1), st.integers(1, 30), st.integers(1, 12)),
        st.tuples(st.just("step"), st.integers(0, 1), st.integers(1, 3)),
        st.tuples(st.just("migrate"), st.integers(0, 1), st.integers(0, 7)),
        st.tuples(st.just("steal"), st.integers(0, 1)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
    ),
    min_size=1, max_size=40,
)


# 11 blocks of 4 tokens hold the longest request (30 + 12) alone: one that cannot would preempt itself forever,
# and admission refuses it before it reaches a core (admission.py).
@settings(max_examples=200, deadline=None)
@given(policy=st.sampled_from(POLICY_NAMES), script=migration_ops, num_blocks=st.integers(11, 24),
       mode=st.sampled_from(["swap", "recompute"]), pipelined=st.booleans())
def test_requests_moving_between_two_cores_lose_and_repeat_no_token_and_leak_no_block(policy, script, num_blocks,
                                                                                      mode, pipelined):
    """Two cores, requests moving both ways (decodes with their KV: marked, handed off once nothing in flight
    runs them, reserved and landed on the other; waiting ones at once), aborts anywhere, plans planned ahead
    of their results or not: every core stays consistent, every request not aborted ends with exactly its
    max_tokens outputs, and every pool ends empty."""
    cores = [create_scheduler(num_blocks=num_blocks, num_host_blocks=8, policy=policy, preemption_mode=mode)
             for _ in range(2)]
    landing: list[tuple[int, Request]] = []  # (receiving core, request) handed off, waiting for blocks there
    in_flight: list[tuple | None] = [None, None]  # (plan, tokens it samples per request), result not applied
    added: dict[str, Request] = {}
    aborted: set[str] = set()

    def where(rid):
        return next((c for c in cores if rid in c.requests), None)

    def hand_off_ready(i):
        oldest = in_flight[i][0].step_id if in_flight[i] else None
        for rid in cores[i].ready_to_leave(oldest_in_flight=oldest):
            req = cores[i].requests[rid]
            cores[i].hand_off(rid)
            landing.append((1 - i, req))

    def land():
        for entry in list(landing):
            dst, req = entry
            if req.request_id in aborted:
                landing.remove(entry)
                cores[1 - dst].release_handed_off(req.request_id)
            elif cores[dst].reserve_arrival(req) is not None:  # the KV "arrives" at once
                landing.remove(entry)
                cores[1 - dst].release_handed_off(req.request_id)
                cores[dst].arrive(req.request_id)

    def run(i):
        """One step of core i; pipelined: the next plan is sent (expected) before the last one's result."""
        land()
        if not pipelined:
            step(cores[i])
        else:
            c, behind = cores[i], in_flight[i]
            plan = c.schedule()
            pending = {r.request_id: r.num_pending for r in c.requests.values()}
            c.expect(plan)
            in_flight[i] = (plan, {rid: r.num_pending - pending.get(rid, 0) for rid, r in c.requests.items()})
            if behind is not None:
                done, counts = behind
                c.on_result(done, StepResult(done.step_id, sampled={rid: [SampledToken(7)] * k
                                                                    for rid, k in counts.items() if k > 0}))
            c.check_integrity()
        hand_off_ready(i)

    for op in script:
        if op[0] == "add":
            rid = f"r{len(added)}"
            added[rid] = Request(rid, [len(added) + 2] * op[2], SamplingParams(max_tokens=op[3]), float(len(added)),
                                 eos_token_ids=(0,))
            cores[op[1]].add(added[rid])
        elif op[0] == "step":
            for _ in range(op[2]):
                run(op[1])
        elif op[0] == "migrate":
            # One move with KV at a time per worker, out or in (the migrator's _busy): two crossing moves between
            # full workers would each wait for the room the other holds.
            movable = [] if landing or any(c.leaving for c in cores) else cores[op[1]].migratable()
            if movable:
                cores[op[1]].start_migration(movable[op[2] % len(movable)][0])
                hand_off_ready(op[1])
        elif op[0] == "steal":
            req = cores[op[1]].next_queued()
            if req is not None:
                cores[1 - op[1]].add(cores[op[1]].take_queued(req.request_id))
        elif op[0] == "abort" and added:
            rid = list(added)[op[1] % len(added)]
            if (core := where(rid)) is not None:
                core.finish(rid)
            aborted.add(rid)
        for c in cores:
            c.check_integrity()
    for k in range(4000):
        if not landing and not any(c.has_work or c.arriving for c in cores):
            break
        run(k % 2)
    for i, c in enumerate(cores):  # the last plans' results: any token in them is of a request that ended
        if in_flight[i] is not None:
            done, counts = in_flight[i]
            assert not c.on_result(done, StepResult(done.step_id, sampled={rid: [SampledToken(7)] * k
                                                                           for rid, k in counts.items() if k > 0}))
    assert not landing and not any(c.has_work or c.requests for c in cores)
    for rid, req in added.items():
        if rid not in aborted:
            assert req.output_token_ids == [7] * req.params.max_tokens, rid
    for c in cores:
        c.schedule()  # host blocks read by the last swap-ins are released one plan later
        assert c.blocks.num_free == c.blocks.num_blocks and c.host_blocks.num_free == 8
        c.check_integrity()
