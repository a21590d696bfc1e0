"""What the scheduler refuses before queueing, and how it says so."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument, ResourceExhausted
from services.common.sampling_params import SamplingParams
from services.scheduler.admission import room, validate_request
from services.scheduler.core.config import SchedulerConfig


def _check(prompt, max_tokens=4, pool_blocks=100):
    validate_request(prompt, SamplingParams(max_tokens=max_tokens), vocab_size=50, max_model_len=64, block_size=4,
                     pool_blocks=pool_blocks)


@pytest.mark.parametrize("prompt, fragment", [
    ([], "prompt is empty"),
    ([1, 50], "outside the vocabulary [0, 50)"),
    ([1, -1], "outside the vocabulary"),
    ([1] * 64, "shorten the prompt"),
])
def test_what_the_model_cannot_run_is_an_invalid_argument(prompt, fragment):
    with pytest.raises(InvalidArgument, match=fragment.replace("[", r"\[").replace(")", r"\)")):
        _check(prompt)


def test_what_no_pool_can_hold_is_resource_exhausted_with_the_fix():
    _check([1] * 10, max_tokens=6, pool_blocks=4)  # 16 tokens: exactly 4 blocks
    with pytest.raises(ResourceExhausted, match="needs 5 KV blocks; the pool holds 4: lower max_tokens"):
        _check([1] * 10, max_tokens=7, pool_blocks=4)
    _check([1] * 10, max_tokens=1000, pool_blocks=None)  # no worker yet: checked once one registers


def test_the_context_limit_caps_what_a_request_can_need():
    _check([1] * 10, max_tokens=10_000, pool_blocks=16)  # at most 64 tokens = 16 blocks


@pytest.mark.parametrize("policy, limited", [("vllm", True), ("fcfs", True), ("fastserve", True),
                                             ("sarathi", False), ("fastserve+sarathi", False)])
def test_a_policy_that_runs_prompts_whole_refuses_what_could_never_fit_one_step(policy, limited):
    """It would wait forever: the step takes a prompt whole, and a recompute takes its prompt and output."""
    limit = SchedulerConfig(policy=policy, max_num_batched_tokens=32).whole_prompt_limit
    assert limit == (32 if limited else None)
    assert SchedulerConfig(policy=policy).whole_prompt_limit is None  # no token budget: anything fits

    def check(n, max_tokens):
        validate_request([1] * n, SamplingParams(max_tokens=max_tokens), vocab_size=50, max_model_len=64,
                         block_size=4, pool_blocks=100, whole_prompt_limit=limit)

    check(20, 12)
    if limited:
        with pytest.raises(InvalidArgument, match=r"prompt \(20 tokens\) \+ max_tokens \(13\) may need 33 tokens "
                                                  r"in one step.*at most 32 \(--max-num-batched-tokens\)"):
            check(20, 13)
    else:
        check(40, 20)


def test_a_request_without_a_limit_may_generate_what_the_context_and_the_pool_leave():
    assert room(100, 4096, None) == 3996  # the context left: vLLM's chat default
    assert room(100, 4096, 1024) == 924  # a pool smaller than the context: what it holds
    assert room(5000, 4096, None) == 1  # no room: validate_request refuses the prompt, saying so
