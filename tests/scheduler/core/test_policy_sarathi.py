"""``sarathi``: the token budget tau derived from a step-time model and a TBT target."""

from __future__ import annotations

import pytest

from services.scheduler.core.config import SchedulerConfig
from services.scheduler.core.step_time import StepTimeModel
from tests.scheduler.core.test_scheduler import create_requests, create_scheduler, step

MS_PER_TOKEN = StepTimeModel(base_s=0.0, per_token_s=0.001, tile_tokens=1)


def test_tau_comes_from_the_tbt_target_when_chunk_size_is_not_given():
    # The default model: 20 ms per step + 0.15 ms per token; Sarathi-Serve's strict SLO for Mistral-7B.
    assert SchedulerConfig(tbt_target_s=0.1).derived_token_budget == 512
    assert SchedulerConfig(tbt_target_s=0.5).derived_token_budget == 3200
    assert SchedulerConfig(tbt_target_s=0.1, chunk_size=64).derived_token_budget is None  # given wins
    assert SchedulerConfig().derived_token_budget is None
    # A target the model cannot meet is refused where the budget is derived: a mesh builds each worker's core
    # with that worker's measured model (services/engine/step_profile.py), so the service cannot tell earlier.
    too_tight = SchedulerConfig(tbt_target_s=0.01)
    with pytest.raises(ValueError, match="tbt_target_s: a one-token step takes"):
        assert too_tight.derived_token_budget
    with pytest.raises(ValueError, match="tbt_target_s: a one-token step takes"):
        create_scheduler(tbt_target_s=0.01)
    fast = StepTimeModel(base_s=0.002, per_token_s=1e-5, tile_tokens=1)
    assert SchedulerConfig(tbt_target_s=0.01, step_time=fast).derived_token_budget == 800


def test_decodes_count_against_a_derived_budget_but_are_never_skipped():
    s = create_scheduler(tbt_target_s=0.008, step_time=MS_PER_TOKEN)
    for r in create_requests(3, prompt_len=2, max_tokens=30):
        s.add(r)
    step(s)
    s.add(create_requests(1, prompt_len=20, start=3)[0])
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 1, "r1": 1, "r2": 1, "r3": 5}  # tau 8 = 3 decodes + 5
    many = create_scheduler(tbt_target_s=0.008, step_time=MS_PER_TOKEN)
    for r in create_requests(10, prompt_len=2, max_tokens=30):  # 10 decodes, handed over from prefill
        r.output_token_ids, r.num_computed_tokens = [7], 2
        many.reserve_arrival(r)
        many.arrive(r.request_id)
    many.add(create_requests(1, prompt_len=20, start=10)[0])
    plan, _ = step(many)
    assert sum(plan.num_scheduled_tokens.values()) == 10 and "r10" not in plan.num_scheduled_tokens


def test_an_explicit_chunk_size_does_not_count_decodes():
    s = create_scheduler(chunk_size=8, tbt_target_s=0.008, step_time=MS_PER_TOKEN)
    for r in create_requests(3, prompt_len=2, max_tokens=30):
        s.add(r)
    step(s)
    s.add(create_requests(1, prompt_len=20, start=3)[0])
    plan, _ = step(s)
    assert plan.num_scheduled_tokens["r3"] == 8
