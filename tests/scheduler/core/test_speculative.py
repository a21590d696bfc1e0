"""Speculative decoding in the core (``num_speculative_tokens``): which decodes get room for drafts, how many,
and what a result that kept some of them leaves behind. Plain data, no model: a result here is what a
worker returns (the drafts it kept, then the token it sampled after them)."""

from __future__ import annotations

import pytest

from services.common.sampling_params import FinishReason, SamplingParams
from services.common.step import SampledToken, StepResult
from services.scheduler.core.config import SchedulerConfig
from services.scheduler.core.request import Request
from tests.scheduler.core.test_scheduler import EOS, create_requests, create_scheduler, step


def _decoding(n=2, max_tokens=20, k=3, **overrides):
    s = create_scheduler(num_speculative_tokens=k, **overrides)
    for r in create_requests(n, prompt_len=10, max_tokens=max_tokens):
        s.add(r)
    plan, _ = step(s)  # the prompts: one token each
    assert not plan.speculative
    return s


def _result(plan, **tokens):
    """What a worker returns: each sequence's kept drafts and the token after them (the count of kept drafts
    with them)."""
    return StepResult(plan.step_id, {rid: [SampledToken(t) for t in ids] for rid, ids in tokens.items()},
                      num_accepted_tokens=sum(max(0, len(ids) - 1) for ids in tokens.values()))


def test_each_decode_may_verify_up_to_k_drafts_in_one_pass():
    s = _decoding()
    plan = s.schedule()
    assert plan.speculative and plan.num_passes == 1
    assert plan.num_scheduled_tokens == {"r0": 4, "r1": 4}
    # Blocks for all 4 tokens: 10 prompt + 1 output computed after this pass at most 14 slots in blocks of 4.
    assert len(s.requests["r0"].block_ids) == 4


def test_a_result_keeps_as_many_tokens_as_the_worker_returned():
    s = _decoding()
    r0, r1 = s.requests["r0"], s.requests["r1"]
    plan = s.schedule()
    events = s.on_result(plan, _result(plan, r0=[8, 9, 5], r1=[6]))  # r0 kept 2 drafts, r1 none
    assert [(e.request_id, e.token.token_id) for e in events] == [("r0", 8), ("r0", 9), ("r0", 5), ("r1", 6)]
    assert r0.output_token_ids == [7, 8, 9, 5] and r0.num_computed_tokens == 13 and r0.num_uncomputed == 1
    assert r1.output_token_ids == [7, 6] and r1.num_computed_tokens == 11 and r1.num_uncomputed == 1
    assert not r0.num_pending and not r1.num_pending
    s.check_integrity()
    plan = s.schedule()  # the next step speculates again from where each one stands
    assert plan.num_scheduled_tokens == {"r0": 4, "r1": 4}


def test_a_failed_sequence_computed_nothing():
    s = _decoding(n=1)
    plan = s.schedule()
    s.on_result(plan, _result(plan))
    req = s.requests["r0"]
    assert req.num_computed_tokens == 10 and req.num_uncomputed == 1 and not req.num_pending


def test_max_tokens_and_the_context_cap_the_drafts():
    s = _decoding(n=1, max_tokens=3)  # 1 output so far: 2 more tokens, so 1 draft at most
    assert s.schedule().num_scheduled_tokens == {"r0": 2}
    s = _decoding(n=1, max_model_len=13)  # 11 tokens: room for 2 more
    assert s.schedule().num_scheduled_tokens == {"r0": 2}


def test_a_stop_among_the_kept_tokens_ends_the_request_and_frees_every_block():
    s = _decoding(n=1)
    plan = s.schedule()
    events = s.on_result(plan, _result(plan, r0=[8, EOS, 9, 9]))
    assert [(e.token.token_id, e.finish_reason) for e in events] == [(8, None), (EOS, FinishReason.STOP)]
    assert not s.has_work and s.blocks.num_free == s.blocks.num_blocks


def test_the_token_budget_and_free_blocks_bound_the_drafts():
    s = create_scheduler(num_speculative_tokens=3, max_num_batched_tokens=5)
    for r in create_requests(2, prompt_len=2, max_tokens=20):
        s.add(r)
    step(s)
    assert s.schedule().num_scheduled_tokens == {"r0": 4, "r1": 1}  # two decodes + 3 drafts: the first takes all
    s = _decoding(n=1, num_blocks=3)  # 11 tokens in 3 blocks of 4: one more slot, no block for drafts
    plan = s.schedule()
    assert plan.num_scheduled_tokens == {"r0": 1} and not plan.speculative
    s.check_integrity()


def test_decodes_speculate_beside_a_prompt_and_under_a_grammar():
    s = create_scheduler(num_speculative_tokens=3)
    s.add(Request("json", list(range(3, 13)), SamplingParams(max_tokens=9, structured_output=("json", "{}")), 0.0))
    step(s)
    s.add(create_requests(1, prompt_len=6, start=1)[0])
    plan = s.schedule()
    assert plan.num_scheduled_tokens == {"json": 4, "r1": 6} and plan.speculative  # the prompt runs whole


def test_a_speculative_plan_is_applied_with_its_result_never_ahead_of_it():
    s = _decoding(n=1)
    plan = s.schedule()
    with pytest.raises(ValueError, match="draft tokens"):
        s.expect(plan)
    # A decode with a token in flight (a plan applied ahead) has nothing to draft from yet.
    s = create_scheduler(num_speculative_tokens=3)
    s.add(create_requests(1, prompt_len=10)[0])
    first = s.schedule()
    s.expect(first)
    ahead = s.schedule()
    assert ahead.num_scheduled_tokens == {"r0": 1} and not ahead.speculative


def test_speculation_and_multi_step_decoding_exclude_each_other():
    with pytest.raises(ValueError, match="exclude each other"):
        SchedulerConfig(num_speculative_tokens=2, num_decode_steps=4)
    with pytest.raises(ValueError, match=">= 0"):
        SchedulerConfig(num_speculative_tokens=-1)


def test_every_block_returns_after_random_kept_counts():
    import random

    rng = random.Random(5)
    s = _decoding(n=4, max_tokens=40, k=5, num_blocks=40)
    while s.has_work:
        plan = s.schedule()
        result = StepResult(plan.step_id)
        for rid, n in plan.num_scheduled_tokens.items():
            req = s.requests[rid]
            if req.num_computed_tokens + n >= req.num_tokens:
                result.sampled[rid] = [SampledToken(rng.choice([7, 8, EOS] if rng.random() < .05 else [7, 8]))
                                       for _ in range(rng.randint(1, n - req.num_uncomputed + 1))]
        s.on_result(plan, result)
        s.check_integrity()
    assert s.blocks.num_free == s.blocks.num_blocks


def test_drafts_that_keep_missing_pause_speculation_until_a_probe_keeps_some():
    from services.scheduler.core.speculative import PAUSE_STEPS

    s = _decoding(n=2, max_tokens=1000)
    misses = 0
    while (plan := s.schedule()).speculative:  # every step keeps no draft: one token per decode
        assert s.speculation_due
        s.on_result(plan, _result(plan, r0=[8], r1=[8]))
        misses += 1
    assert 5 < misses < 30 and not s.speculation_due  # paused: the step loop may plan ahead again
    s.on_result(plan, _result(plan, r0=[8], r1=[8]))
    for _ in range(PAUSE_STEPS - 1):
        plan = s.schedule()
        assert not plan.speculative and plan.num_scheduled_tokens == {"r0": 1, "r1": 1}
        s.on_result(plan, _result(plan, r0=[8], r1=[8]))
    assert s.speculation_due
    probe = s.schedule()
    assert probe.speculative  # a probe: its result alone decides
    s.on_result(probe, _result(probe, r0=[8, 9, 9, 5], r1=[8, 9]))  # 2 of 3 drafts kept a decode
    for _ in range(3):
        plan = s.schedule()
        assert plan.speculative
        s.on_result(plan, _result(plan, r0=[8, 9, 5], r1=[8, 9, 5]))
    s.check_integrity()
