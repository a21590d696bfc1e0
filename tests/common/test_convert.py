"""Step plans and results survive the wire unchanged (the worker rebuilds exactly what the scheduler planned)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from seawall.v1 import common_pb2, worker_pb2
from services.common.convert import (
    params_from_proto,
    params_to_proto,
    plan_from_proto,
    plan_to_proto,
    result_from_proto,
    result_to_proto,
)
from services.common.errors import InvalidArgument, SeawallError
from services.common.sampling_params import SamplingParams
from services.common.step import ContinuingSequence, LoraRef, NewSequence, SampledToken, StepPlan, StepResult


def _wire(msg):
    return type(msg).FromString(msg.SerializeToString())


def test_a_plan_with_every_kind_of_entry_round_trips():
    plan = StepPlan(
        7,
        new=[NewSequence("a", [5, 6, 7, 8], 3, 2, [4, 9], SamplingParams(max_tokens=5, temperature=0.5, seed=3,
                                                                         stop=("x",), logprobs=2,
                                                                         prompt_logprobs=0,
                                                                         logit_bias=((3, -1.5), (9, 2.0)),
                                                                         allowed_token_ids=(9, 3, 4),
                                                                         skip_special_tokens=False)),
             NewSequence("g", [1, 2], 2, 0, [7], SamplingParams(), LoraRef("sql", "/loras/sql")),
             NewSequence("h", [1, 2, 3, 4, 5], 5, 4, [8, 9], SamplingParams(), state_checkpoint=0)],
        continuing=[
            ContinuingSequence("b", [11], [42]),  # a decode that needs a new block
            ContinuingSequence("c", [], [43]),  # a decode with room left, handed a token it did not sample
            ContinuingSequence("d", [], [], [1, 2, 3]),  # swapped in: a new block table
            ContinuingSequence("e", [], [], []),  # a new, empty block table is not "no change"
        ],
        num_scheduled_tokens={"a": 2, "b": 1, "c": 1, "d": 1, "e": 0, "f": 1, "g": 2, "h": 1},  # f: nothing changed
        finished=["z"], swap_out=[(1, 2)], swap_in=[(3, 4)], copy=[(5, 6)], state_saves={"a": (2, 0), "g": (1, 3)},
        swapped_out=["y"], state_moves=[(0, 16), (3, 17)],
    )
    msg = _wire(plan_to_proto(plan, "sched-1"))
    assert msg.scheduler_id == "sched-1"
    assert plan_from_proto(msg) == plan


@pytest.mark.parametrize("with_logprobs", [False, True])
def test_a_result_round_trips(with_logprobs):
    result = StepResult(9, forward_seconds=0.25)
    for i, seq in enumerate(("a", "b", "c")):  # "c" ran a multi-step decode: three tokens
        result.sampled[seq] = [(SampledToken(10 + i + j, -0.5 * i, i + 1, [(10 + i + j, -0.5 * i), (3, -2.0)])
                                if with_logprobs else SampledToken(10 + i + j)) for j in range(1 + 2 * (i == 2))]
    msg = _wire(result_to_proto(result, step_seconds=0.5))
    assert isinstance(msg, worker_pb2.StepResult) and msg.step_time_ms == 500.0 and msg.num_sampled == 3
    assert result_from_proto(msg) == result


@pytest.mark.parametrize("structured", [("json", '{"type": "object"}'), ("regex", "[0-9]+"),
                                        ("choice", '["yes", "no, thanks"]'), ("grammar", 'start: "a"+'), None])
def test_structured_output_round_trips(structured):
    params = SamplingParams(structured_output=structured)
    assert params_from_proto(_wire(params_to_proto(params))) == params


@pytest.mark.parametrize("free_thought", ["required", "optional", "harmony"])
def test_a_free_thought_before_the_structured_output_round_trips(free_thought):
    params = SamplingParams(structured_output=("json", '{"type": "object"}'), free_thought=free_thought)
    assert params_from_proto(_wire(params_to_proto(params))) == params
    with pytest.raises(InvalidArgument, match="needs one"):
        SamplingParams(free_thought=free_thought)
    with pytest.raises(InvalidArgument, match="free_thought must be one of"):
        SamplingParams(structured_output=("json", '{"type": "object"}'), free_thought="sometimes")


def test_an_empty_structured_output_message_is_refused():
    msg = params_to_proto(SamplingParams())
    msg.structured_output.SetInParent()
    with pytest.raises(InvalidArgument, match="structured_output is set but empty"):
        params_from_proto(msg)


@pytest.mark.parametrize("top_p", [2.0, -0.5, float("nan")])
def test_a_top_p_out_of_range_on_the_wire_is_refused_not_ignored(top_p):
    msg = params_to_proto(SamplingParams())
    msg.top_p = top_p
    with pytest.raises(InvalidArgument, match="top_p must be"):
        params_from_proto(msg)
    msg.top_p = 0.0  # the field's default: disabled
    assert params_from_proto(msg).top_p == 1.0


_DEFAULTED = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_tokens")


def test_fields_a_request_leaves_unset_take_the_models_generation_config():
    model = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1,
             "max_tokens": 7}
    unset = _wire(common_pb2.SamplingParams())
    got = params_from_proto(unset, 100, model)
    assert tuple(getattr(got, f) for f in _DEFAULTED) == pytest.approx((0.6, 20, 0.95, 0.05, 1.1, 7))
    assert params_from_proto(unset, 5, model).max_tokens == 5  # the room left is less than the config's
    # Set, even to the value that means "off", a field keeps it.
    off = _wire(common_pb2.SamplingParams(temperature=0, top_k=0, top_p=0, min_p=0, repetition_penalty=0,
                                          max_tokens=9))
    got = params_from_proto(off, 100, model)
    assert tuple(getattr(got, f) for f in _DEFAULTED) == (0.0, 0, 1.0, 0.0, 1.0, 9)
    # Without a generation config: the neutral values.
    neutral = SamplingParams(max_tokens=100)
    assert params_from_proto(unset, 100) == neutral and params_from_proto(unset, 100, {}) == neutral


def test_a_result_of_one_token_each_round_trips():
    result = StepResult(3, sampled={f"s{i}": [SampledToken(100 + i)] for i in range(5)})
    assert result_from_proto(_wire(result_to_proto(result))) == result


def test_embeddings_round_trip_beside_their_stand_in_tokens():
    result = StepResult(5, sampled={"gen": [SampledToken(7)], "emb": [SampledToken(0)]},
                        embeddings={"emb": [0.5, -1.25, 3.0]})
    assert result_from_proto(_wire(result_to_proto(result))) == result


def test_logprobs_of_some_sequences_only_round_trip():
    result = StepResult(4, sampled={"plain": [SampledToken(1), SampledToken(2)],
                                    "asked": [SampledToken(3, -0.25, 2, [(4, -0.125), (3, -0.25)])]})
    msg = _wire(result_to_proto(result))
    assert len(msg.logprobs) == len(msg.sampled_token_ids) == 3
    assert result_from_proto(msg) == result


def test_prompt_scores_round_trip_beside_the_sampled_tokens():
    result = StepResult(5, sampled={"done": [SampledToken(7)]},
                        prompt_logprobs={"done": (33, [SampledToken(4, -1.5, 3, [(9, -0.5)])]),
                                         "chunk": (1, [SampledToken(5, -0.25, 1), SampledToken(6, -3.0, 40)])})
    msg = _wire(result_to_proto(result))
    assert list(msg.prompt_logprob_starts) == [33, 1] and len(msg.prompt_logprobs) == 3
    assert result_from_proto(msg) == result
    msg.num_prompt_logprobs[1] = 1
    with pytest.raises(InvalidArgument, match="prompt logprobs do not line up"):
        result_from_proto(msg)


def test_sequence_errors_come_back_as_the_same_kind_of_error_beside_the_tokens():
    result = StepResult(6, sampled={"ok": [SampledToken(7)]},
                        errors={"stuck": InvalidArgument("no token is possible"), "odd": SeawallError("broken")})
    back = result_from_proto(_wire(result_to_proto(result)))
    assert back.sampled == result.sampled
    assert {sid: (type(e), str(e)) for sid, e in back.errors.items()} == {
        "stuck": (InvalidArgument, "no token is possible"), "odd": (SeawallError, "broken")}


def test_columns_that_do_not_line_up_are_rejected():
    plan = plan_to_proto(StepPlan(1, num_scheduled_tokens={"a": 1, "b": 1}))
    del plan.num_scheduled_tokens[1]
    with pytest.raises(InvalidArgument, match="one count per sequence"):
        plan_from_proto(plan)
    result = result_to_proto(StepResult(1, sampled={"a": [SampledToken(1)], "b": [SampledToken(2)]}))
    result.num_sampled_tokens[1] = 2
    with pytest.raises(InvalidArgument, match="do not line up"):
        result_from_proto(result)


_INTS = st.integers(-2, 2**64)
# The edges of float32, which the contract carries: past its largest, below its smallest normal and subnormal.
_FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.5, 1.0, 3.4e38, 3.5e38, 1e308, 1.2e-38, 1e-40, 1e-46, 5e-324])


@settings(max_examples=300, deadline=None, derandomize=True)  # the same examples every run: CI stays stable
@example({"top_k": 2**40})
@example({"temperature": 1e308})
@example({"repetition_penalty": 5e-324})
@example({"top_p": 1e-46})
@given(st.fixed_dictionaries({}, optional={
    "max_tokens": _INTS, "top_k": _INTS, "min_tokens": _INTS, "seed": _INTS, "logprobs": _INTS,
    "temperature": _FLOATS, "repetition_penalty": _FLOATS, "top_p": _FLOATS, "min_p": _FLOATS,
    "presence_penalty": _FLOATS, "frequency_penalty": _FLOATS,
    "prompt_logprobs": _INTS, "stop_token_ids": st.lists(_INTS, max_size=2).map(tuple),
    "allowed_token_ids": st.lists(_INTS, max_size=2).map(tuple), "bad_words": st.lists(st.text(), max_size=2).map(tuple),
    "logit_bias": st.lists(_INTS, max_size=2, unique=True).map(lambda ids: tuple((t, 1.0) for t in sorted(ids)))}))
def test_any_params_that_validate_fit_the_contract(fields):
    # A request whose params passed validation but not the proto's ranges (top_k 2**40: a uint32 field) was
    # queued, and the scheduler's step loop then died converting its plan: one request took the mesh down. A
    # temperature past float32's range became inf in the plan, and NaN in the sampler: every worker it was
    # moved to died in turn.
    try:
        params = SamplingParams(**fields)
    except InvalidArgument:
        return
    back = params_from_proto(params_to_proto(params))  # float fields are float32 in the contract
    floats = {f: pytest.approx(getattr(params, f), rel=1e-6, abs=1e-30) for f in (
        "temperature", "repetition_penalty", "top_p", "min_p", "presence_penalty", "frequency_penalty")}
    assert back == dataclasses.replace(params, **{f: getattr(back, f) for f in floats})
    assert {f: getattr(back, f) for f in floats} == floats
