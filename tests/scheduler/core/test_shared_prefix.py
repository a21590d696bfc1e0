"""Requests sharing a prefix that another request computes in the same step wait for it (shared_prefix.py)."""

from __future__ import annotations

import pytest

from services.common.sampling_params import SamplingParams
from services.scheduler.core.request import Request
from tests.scheduler.core.test_scheduler import create_scheduler, step

PROMPT = list(range(100, 140))  # 40 tokens: 10 blocks of 4


def _siblings(n: int, prompt=PROMPT, **params) -> list[Request]:
    return [Request(f"c{j}", list(prompt), SamplingParams(max_tokens=3, **params), float(j)) for j in range(n)]


@pytest.mark.parametrize("policy", ["sarathi", "vllm", "fastserve"])
def test_the_choices_of_one_prompt_compute_it_once(policy):
    s = create_scheduler(block_size=4, chunk_size=128, policy=policy)
    for r in _siblings(3):
        s.add(r)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"c0": 40}  # the others wait a step for c0's blocks
    plan, _ = step(s)
    assert {n.seq_id: n.num_computed_tokens for n in plan.new} == {"c1": 36, "c2": 36}  # all but the last token
    assert s.prefix_stats.hit_blocks == 18
    while s.has_work:
        step(s)


def test_a_chunked_prefix_is_waited_for_chunk_by_chunk_then_taken_whole():
    s = create_scheduler(block_size=4, chunk_size=24)
    first, second = _siblings(2)
    s.add(first)
    s.add(second)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"c0": 24}  # no room for c1 anyway
    plan, _ = step(s)
    assert plan.num_scheduled_tokens["c0"] == 16 and "c1" not in plan.num_scheduled_tokens  # would share c0's rest
    plan, _ = step(s)
    assert plan.new[0].seq_id == "c1" and plan.new[0].num_computed_tokens == 36


def test_unrelated_prompts_and_short_shared_runs_do_not_wait():
    s = create_scheduler(block_size=4, chunk_size=128)
    s.add(Request("a", PROMPT, SamplingParams(max_tokens=2), 0.0))
    s.add(Request("b", PROMPT[:4] + [7] * 36, SamplingParams(max_tokens=2), 1.0))  # one block in common
    s.add(Request("c", [9] * 40, SamplingParams(max_tokens=2), 2.0))
    plan, _ = step(s)
    assert set(plan.num_scheduled_tokens) == {"a", "b", "c"}


def test_nobody_waits_for_a_request_that_is_not_in_the_step_or_left():
    s = create_scheduler(block_size=4, chunk_size=128)
    first, second = _siblings(2)
    s.add(first)
    s.add(second)
    s.schedule()  # c0 admitted with blocks to compute; the plan is dropped before any result
    s.finish("c0")
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"c1": 40}  # c0 is gone: c1 computes the prompt itself
    assert not s._computing or all(rid != "c0" for rid, _ in s._computing.values())


def test_a_request_scoring_its_prompt_neither_waits_nor_is_waited_for():
    s = create_scheduler(block_size=4, chunk_size=128)
    scored, plain = _siblings(2, prompt_logprobs=0)[0], _siblings(2)[1]
    s.add(scored)
    s.add(plain)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"c0": 40, "c1": 40}  # c0 computes its own copy, which c1 cannot await
