"""The step-time model the core assumes: a linear function of a step's tokens."""

from __future__ import annotations

import pytest

from services.scheduler.core.step_time import StepTimeModel
from tests.scheduler.core.test_scheduler import create_requests, create_scheduler, step


def test_predict_is_linear_and_an_empty_step_is_free():
    m = StepTimeModel(base_s=0.02, per_token_s=0.001, per_seq_s=0.0005)
    assert m.predict(0) == 0.0
    assert m.predict(10, num_seqs=4) == pytest.approx(0.02 + 0.01 + 0.002)


def test_token_budget_is_the_largest_step_under_the_target_in_whole_tiles():
    m = StepTimeModel(base_s=0.02, per_token_s=0.001, tile_tokens=64)
    assert m.token_budget(0.02 + 0.200) == 192  # 200 tokens fit: 3 whole tiles
    assert m.token_budget(0.02 + 0.050) == 50  # under one tile: as is
    assert StepTimeModel(per_token_s=0.0).token_budget(1.0) is None  # any step fits
    with pytest.raises(ValueError, match="one-token step"):
        m.token_budget(0.0205)


@pytest.mark.parametrize("bad", [{"base_s": -1}, {"per_token_s": float("nan")}, {"tile_tokens": 0},
                                 {"base_s": 0, "per_token_s": 0}])
def test_nonsense_is_refused(bad):
    with pytest.raises(ValueError, match="step_time"):
        StepTimeModel(**bad)


def _driven(truth: StepTimeModel, steps: int, idle_every: int = 0, **config):
    """A scheduler whose plans take ``truth``'s time on a clock passed in (an idle second every ``idle_every``
    steps); returns it after ``steps`` steps."""
    s = create_scheduler(num_blocks=256, **config)
    for r in create_requests(8, prompt_len=40, max_tokens=400):
        s.add(r)
    now = 0.0
    for i in range(steps):
        plan, _ = step(s, now=now)
        now += truth.predict(sum(plan.num_scheduled_tokens.values()), len(plan.num_scheduled_tokens))
        if idle_every and i % idle_every == idle_every - 1:
            now += 1.0
    return s


def test_a_live_clock_corrects_the_fixed_cost_and_what_follows_from_it():
    model = StepTimeModel(base_s=0.001, per_token_s=2e-5, per_seq_s=3e-5, tile_tokens=1)
    truth = StepTimeModel(base_s=0.003, per_token_s=2e-5, per_seq_s=3e-5, tile_tokens=1)  # 2 ms of mesh a step
    s = _driven(truth, 140, idle_every=2, step_time=model, tbt_target_s=0.01, calibrate_step_time=True)
    assert s.config.step_time.base_s == pytest.approx(0.003, abs=1e-6)  # idle gaps left out
    assert s.policy.budget == truth.token_budget(0.01) < model.token_budget(0.01)  # Sarathi's tau follows
    fast = _driven(truth, 70, step_time=model, policy="fastserve", calibrate_step_time=True)
    assert fast.policy.mlfq.base == pytest.approx(truth.predict(1), abs=1e-6)  # FastServe's quantum too


def test_without_calibration_the_model_stays_and_an_unmeetable_correction_is_not_taken():
    model = StepTimeModel(base_s=0.001, per_token_s=2e-5, tile_tokens=1)
    truth = StepTimeModel(base_s=0.003, per_token_s=2e-5, tile_tokens=1)
    assert _driven(truth, 70, step_time=model, tbt_target_s=0.01).config.step_time == model
    # A 2.5 ms target fits a step under the model, not under the truth: the scheduler keeps its budget.
    kept = _driven(truth, 70, step_time=model, tbt_target_s=0.0025, calibrate_step_time=True)
    assert kept.config.step_time == model and kept.policy.budget == model.token_budget(0.0025)
