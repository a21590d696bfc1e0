"""The step-time model the core assumes: a linear function of a step's tokens."""

from __future__ import annotations

import pytest

from services.scheduler.core.step_time import StepTimeModel


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
