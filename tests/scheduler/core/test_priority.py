"""Request priority (vLLM's meaning: lower runs sooner): in the first-come-first-served policies it orders
prompts and decodes before arrival, and a more important prompt takes blocks from less important requests; in
FastServe's it orders the classes, each run by the MLFQ."""

from __future__ import annotations

import pytest

from services.scheduler.core.request import RequestStatus
from tests.scheduler.core.test_scheduler import create_requests, create_scheduler, step

FCFS_FAMILY = ["sarathi", "vllm", "fcfs"]


def _with_priorities(priorities, **kw):
    reqs = create_requests(len(priorities), **kw)
    for r, p in zip(reqs, priorities, strict=True):
        r.priority = p
    return reqs


def test_a_more_important_prompt_takes_the_chunk_budget_first_even_from_a_running_prompt():
    s = create_scheduler(chunk_size=8)
    r0, r1 = _with_priorities([0, -1], prompt_len=20)
    s.add(r0)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 8}
    s.add(r1)  # arrives while r0 is half way through its prompt
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r1": 8}
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r1": 8}
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r1": 4, "r0": 4}  # r1's last chunk, then r0 goes on where it stopped


@pytest.mark.parametrize("policy", FCFS_FAMILY)
def test_waiting_prompts_run_in_priority_order_then_arrival_order(policy):
    s = create_scheduler(policy=policy, chunk_size=None, max_num_seqs=2)
    for r in _with_priorities([3, 0, -2, 0], prompt_len=4, max_tokens=2):
        s.add(r)
    plan, _ = step(s)
    assert list(plan.num_scheduled_tokens) == ["r2", "r1"]


def _full_pool(policy, priorities):
    """6 blocks of 4 tokens, full: r0 (12 tokens + its first output) holds 4, r1 (4 + 1) holds 2."""
    s = create_scheduler(num_blocks=6, policy=policy, chunk_size=None)
    r0, r1 = _with_priorities(priorities, prompt_len=12, max_tokens=20)
    r1.prompt_token_ids = r1.prompt_token_ids[:4]
    s.add(r0)
    s.add(r1)
    step(s)
    step(s)
    assert s.blocks.num_free == 0
    return s, r0, r1


@pytest.mark.parametrize("policy", FCFS_FAMILY)
def test_a_more_important_prompt_preempts_the_least_important_request_for_blocks(policy):
    s, r0, r1 = _full_pool(policy, [5, 0])
    (r2,) = _with_priorities([-1], prompt_len=8, start=2)
    s.add(r2)
    plan, _ = step(s)
    assert "r2" in plan.num_scheduled_tokens and r2.status is RequestStatus.RUNNING
    assert r0.status is RequestStatus.WAITING and r0.num_preemptions == 1  # the least important gave way
    assert r1.status is RequestStatus.RUNNING and r1.num_preemptions == 0


@pytest.mark.parametrize("policy", FCFS_FAMILY)
def test_a_prompt_of_equal_priority_waits_for_blocks_instead(policy):
    s, r0, r1 = _full_pool(policy, [0, 0])
    (r2,) = _with_priorities([0], prompt_len=8, start=2)
    s.add(r2)
    plan, _ = step(s)
    assert "r2" not in plan.num_scheduled_tokens and r2.status is RequestStatus.WAITING
    assert r0.num_preemptions == r1.num_preemptions == 0


def test_a_decode_short_of_blocks_takes_them_from_the_least_important_even_if_it_is_older():
    # r0 is older but less important: when r1's decode needs a block, r0 gives way, not r1.
    s = create_scheduler(num_blocks=4, chunk_size=None)
    r0, r1 = _with_priorities([1, 0], prompt_len=7, max_tokens=20)
    s.add(r0)
    s.add(r1)
    for _ in range(3):
        step(s)
    assert r0.status is RequestStatus.WAITING and r0.num_preemptions == 1
    assert r1.status is RequestStatus.RUNNING and r1.num_preemptions == 0


@pytest.mark.parametrize("policy", ["fastserve", "fastserve+sarathi"])
def test_fastserve_runs_a_more_important_class_first_and_its_mlfq_within_each(policy):
    def finish_order(priorities, max_num_seqs=1):
        s = create_scheduler(policy=policy, num_blocks=32, num_host_blocks=32, max_num_seqs=max_num_seqs)
        reqs = _with_priorities(priorities, prompt_len=6, max_tokens=12)
        for r in reqs:
            s.add(r)
        done = []
        for _ in range(200):
            if not s.has_work:
                break
            step(s)
            done += [r.request_id for r in reqs if r.status is RequestStatus.FINISHED and r.request_id not in done]
        return done

    # One slot: the urgent request first, then the normal ones in the MLFQ's order, the background one last.
    assert finish_order([3, 0, -2, 0]) == ["r2", "r1", "r3", "r0"]
    # All of one priority: the MLFQ alone, as before priorities existed.
    assert finish_order([0, 0, 0, 0]) == finish_order([5, 5, 5, 5])
    # A long job of the important class at a deep level still runs before a fresh less important one.
    s = create_scheduler(policy=policy, num_blocks=32, num_host_blocks=32, max_num_seqs=1)
    long, = _with_priorities([0], prompt_len=6, max_tokens=40)
    s.add(long)
    for _ in range(10):
        step(s)
    assert s.policy.mlfq.jobs[long.request_id].level > 0
    late, = _with_priorities([1], prompt_len=6, max_tokens=4)
    late.request_id, late.arrival_time = "late", 100.0
    s.add(late)
    for _ in range(10):
        assert list(step(s)[0].num_scheduled_tokens) == [long.request_id]


def test_a_running_chunk_short_of_blocks_never_holds_back_an_older_running_prompt():
    """A bursty soak's stall (bench/README.md): r1's chunk needs blocks while r2, which arrived before it (a
    mesh adds a request once its kvcache lookup is back) but was admitted after it by priority, holds its own.
    r1, the newer, gives way (it waits); r2 must run, not wait behind r1 for ever with r1 waiting for r2."""
    s = create_scheduler(num_blocks=7, chunk_size=8)
    (r0,) = _with_priorities([2], prompt_len=4, max_tokens=20)  # less important: gives its blocks to r2
    r1, r2 = create_requests(2, prompt_len=24, max_tokens=3, start=1)
    r2.prompt_token_ids = r2.prompt_token_ids[:16]
    r2.arrival_time = 0.5  # before r1
    s.add(r0)
    step(s)
    s.add(r1)
    step(s)
    step(s)
    assert (r1.num_computed_tokens, len(r1.block_ids), s.blocks.num_free) == (16, 4, 1)
    s.add(r2)  # outranks r0: admitted before the step is composed, with r0's blocks
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r2": 8}
    finished = set()
    for _ in range(60):
        if not s.has_work:
            break
        finished |= {e.request_id for e in step(s)[1] if e.finish_reason}
    assert not s.has_work and finished == {"r0", "r1", "r2"}
