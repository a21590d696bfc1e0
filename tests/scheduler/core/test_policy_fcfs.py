"""``fcfs``: run-to-completion first come first served (FastServe's FCFS baseline)."""

from __future__ import annotations

from services.scheduler.core.request import RequestStatus
from tests.scheduler.core.test_scheduler import create_requests, create_scheduler, step


def test_running_requests_run_to_completion_before_a_newer_one_starts():
    s = create_scheduler(policy="fcfs", max_num_seqs=2)
    a, b = create_requests(2, prompt_len=10, max_tokens=4)
    short = create_requests(1, prompt_len=2, max_tokens=1, start=2)[0]
    for r in (a, b, short):
        s.add(r)
    plans = []
    while s.has_work:
        plan, _ = step(s)
        plans.append(dict(plan.num_scheduled_tokens))
    assert plans[:4] == [{"r0": 10, "r1": 10}] + [{"r0": 1, "r1": 1}] * 3
    assert plans[4] == {"r2": 2}  # the short job waited for a free slot
    assert a.num_preemptions == b.num_preemptions == 0


def test_a_step_takes_every_decode_then_whole_new_prompts_and_chunk_size_does_not_apply():
    s = create_scheduler(policy="fcfs", chunk_size=4)
    a, b = create_requests(2, prompt_len=10, max_tokens=5)
    s.add(a)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 10}
    s.add(b)
    plan, _ = step(s)
    assert list(plan.num_scheduled_tokens.items()) == [("r0", 1), ("r1", 10)]


def test_a_prompt_that_does_not_fit_the_budget_holds_back_every_later_one():
    s = create_scheduler(policy="fcfs", max_num_batched_tokens=12)
    first = create_requests(1, prompt_len=10, max_tokens=8)[0]
    s.add(first)
    step(s)
    big, small = create_requests(2, prompt_len=12, start=1)
    small.prompt_token_ids = small.prompt_token_ids[:2]
    s.add(big)
    s.add(small)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 1}  # big needs 12 of the 11 left; small may not jump it
    assert small.status is RequestStatus.WAITING


def test_decodes_go_in_arrival_order_and_block_pressure_preempts_the_newest():
    s = create_scheduler(policy="fcfs", num_blocks=6, block_size=4)
    a, b = create_requests(2, prompt_len=8, max_tokens=8)  # 4 blocks each in the end, 6 in the pool
    s.add(b)  # added first, arrived second
    s.add(a)
    plan, _ = step(s)
    assert list(plan.num_scheduled_tokens) == ["r1", "r0"]
    plan, _ = step(s)
    assert list(plan.num_scheduled_tokens) == ["r0", "r1"]  # running requests by arrival
    while s.has_work:
        step(s)
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
