"""Multi-step decoding in the core (``num_decode_steps``): when a step of decodes may run several passes, how
many, with which blocks, and what becomes of tokens past a stop. Plain data, no model."""

from __future__ import annotations

from services.common.sampling_params import FinishReason
from services.common.step import SampledToken, StepResult
from services.scheduler.core.step_time import StepTimeModel
from tests.scheduler.core.test_scheduler import EOS, create_requests, create_scheduler, step


def _prefilled(n=2, max_tokens=9, **overrides):
    s = create_scheduler(num_decode_steps=4, **overrides)
    for r in create_requests(n, prompt_len=10, max_tokens=max_tokens):
        s.add(r)
    step(s)  # the prompts: one token each
    return s


def test_decodes_with_nothing_waiting_run_several_passes_up_to_max_tokens():
    s = _prefilled()
    plan, events = step(s)
    assert plan.num_scheduled_tokens == {"r0": 4, "r1": 4} and plan.num_passes == 4
    assert [e.request_id for e in events] == ["r0"] * 4 + ["r1"] * 4
    # Blocks for the 4 tokens were reserved ahead: 10 + 4 computed in blocks of 4.
    assert len(s.requests["r0"].block_ids) == 4
    plan, events = step(s)  # 5 outputs, 4 left to max_tokens = 9
    assert plan.num_scheduled_tokens == {"r0": 4, "r1": 4}
    assert [e.finish_reason for e in events if e.request_id == "r0"] == [None] * 3 + [FinishReason.LENGTH]
    assert not s.has_work and s.blocks.num_free == s.blocks.num_blocks


def test_a_waiting_request_makes_the_step_a_single_pass_that_admits_it():
    s = _prefilled()
    s.add(create_requests(1, prompt_len=6, start=2)[0])
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 1, "r1": 1, "r2": 6}
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 4, "r1": 4, "r2": 4}


def test_the_context_caps_the_passes():
    s = _prefilled(n=1, max_model_len=13)  # 11 tokens after the prompt: room for 2
    plan, events = step(s)
    assert plan.num_scheduled_tokens == {"r0": 2}
    assert events[-1].finish_reason == FinishReason.LENGTH


def test_without_free_blocks_for_the_extra_tokens_a_decode_keeps_one_pass():
    s = _prefilled(n=1, num_blocks=3)  # 10 prompt tokens fill 3 blocks of 4 but for 2 slots; 4 more need a 4th
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 1}
    s.check_integrity()


def test_tokens_after_a_stop_token_are_dropped_and_every_block_returns():
    s = _prefilled(n=1)
    plan = s.schedule()
    result = StepResult(plan.step_id, {"r0": [SampledToken(7), SampledToken(EOS), SampledToken(7), SampledToken(7)]})
    events = s.on_result(plan, result)
    assert [(e.token.token_id, e.finish_reason) for e in events] == [(7, None), (EOS, FinishReason.STOP)]
    assert not s.has_work and s.blocks.num_free == s.blocks.num_blocks


def test_a_stop_string_in_an_earlier_token_keeps_only_the_outputs_up_to_it():
    s = _prefilled(n=1)
    req = s.requests["r0"]
    plan, events = step(s)
    assert len(events) == 4
    s.finish("r0", FinishReason.STOP, num_outputs=3)  # the detokenizer saw the stop string in token 2 of 4
    assert req.output_token_ids == [7, 7, 7] and s.blocks.num_free == s.blocks.num_blocks


def test_the_logical_clock_charges_every_pass():
    model = StepTimeModel(base_s=0.01, per_token_s=0.001)
    s = _prefilled(step_time=model)
    step(s)  # two decodes, 4 passes, starting at s.now
    start = s.now
    s.schedule()
    assert abs(s.now - start - 4 * model.predict(2, 2)) < 1e-12
