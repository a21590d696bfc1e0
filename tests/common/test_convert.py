"""Step plans and results survive the wire unchanged (the worker rebuilds exactly what the scheduler planned)."""

from __future__ import annotations

import pytest

from seawall.v1 import worker_pb2
from services.common.convert import plan_from_proto, plan_to_proto, result_from_proto, result_to_proto
from services.common.sampling_params import SamplingParams
from services.common.step import ContinuingSequence, NewSequence, SampledToken, StepPlan, StepResult


def _wire(msg):
    return type(msg).FromString(msg.SerializeToString())


def test_a_plan_with_every_kind_of_entry_round_trips():
    plan = StepPlan(
        7,
        new=[NewSequence("a", [5, 6, 7, 8], 3, 2, [4, 9], SamplingParams(max_tokens=5, temperature=0.5, seed=3,
                                                                         stop=("x",), logprobs=2))],
        continuing=[
            ContinuingSequence("b", [11], [42]),  # a decode that needs a new block
            ContinuingSequence("c", [], [43]),  # a decode with room left
            ContinuingSequence("d", [], [], [1, 2, 3]),  # swapped in: a new block table
            ContinuingSequence("e", [], [], []),  # a new, empty block table is not "no change"
        ],
        num_scheduled_tokens={"a": 2, "b": 1, "c": 1, "d": 1, "e": 0},
        finished=["z"], swap_out=[(1, 2)], swap_in=[(3, 4)], copy=[(5, 6)],
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
