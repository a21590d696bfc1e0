"""A worker's step times measured at start-up and fitted to the scheduler core's linear model."""

from __future__ import annotations

import pytest

from services.engine.config import EngineConfig
from services.engine.runner import ModelRunner
from services.engine.step_profile import (
    PROFILE_CONTEXT,
    PROFILE_SHAPES,
    Planner,
    StepTimeFit,
    fit_step_time,
    profile_step_time,
)
from services.scheduler.core.step_time import StepTimeModel
from services.worker.config import WorkerConfig
from services.worker.main import parse_args
from services.worker.servicer import WorkerServicer


def test_the_fit_recovers_a_linear_model():
    truth = StepTimeModel(base_s=0.004, per_token_s=2e-5, per_seq_s=1e-4)
    shapes = [(16, 1), (64, 1), (256, 1), (1, 1), (8, 8), (32, 32), (80, 17)]
    fit = fit_step_time([(t, s, truth.predict(t, s)) for t, s in shapes])
    assert fit.base_s == pytest.approx(0.004) and fit.per_token_s == pytest.approx(2e-5)
    assert fit.per_seq_s == pytest.approx(1e-4)


def test_a_coefficient_the_data_would_make_negative_is_left_out():
    # More sequences never cost less: a fit that says so is refitted without the per-sequence term.
    samples = [(16, 1, 0.010), (64, 1, 0.012), (8, 8, 0.009), (32, 32, 0.008)]
    fit = fit_step_time(samples)
    assert fit.per_seq_s == 0 and fit.base_s > 0 and fit.per_token_s >= 0
    assert fit_step_time([(5, 1, 0.003)]) == StepTimeFit(0.003, 0.0, 0.0)  # one sample: a constant
    with pytest.raises(ValueError, match="no step samples"):
        fit_step_time([])


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(EngineConfig(model=str(tiny_model_dir), kv_cache_bytes=8 << 20))


def test_the_built_in_models_profile_has_a_cost_per_step_and_per_token(runner):
    fit = profile_step_time(runner, repeats=2)
    model = StepTimeModel(fit.base_s, fit.per_token_s, fit.per_seq_s)
    assert fit.base_s > 0 and model.predict(256) > model.predict(1)
    assert runner.seqs == {}  # the profile's sequences are gone: the worker starts empty


def test_a_profile_without_a_cost_per_token_is_measured_again_with_more_repeats(runner, monkeypatch):
    """A machine busy while the small steps ran can make every step look alike: no real model computes 256
    tokens as fast as 16, so that fit is measured again."""
    calls = []

    def timed(self, chunks, decodes, repeats):
        calls.append(repeats)
        tokens = sum(new for new, _ in chunks) + len(decodes)
        busy = len(calls) <= 1 + len(PROFILE_SHAPES)  # the warm-up and the first pass: flat
        return 0.01 if busy else 0.004 + 1e-5 * tokens

    monkeypatch.setattr(Planner, "time", timed)
    fit = profile_step_time(runner, repeats=2)
    assert fit.per_token_s == pytest.approx(1e-5) and fit.base_s == pytest.approx(0.004)
    assert calls == [1] + [2] * len(PROFILE_SHAPES) + [4] * len(PROFILE_SHAPES)
    calls.clear()
    monkeypatch.setattr(Planner, "time", lambda self, chunks, decodes, repeats: calls.append(repeats) or 0.01)
    assert profile_step_time(runner, repeats=1, attempts=3).per_token_s < 1e-12  # gives up after three passes
    assert calls == [1] + [1] * len(PROFILE_SHAPES) + [2] * len(PROFILE_SHAPES) + [4] * len(PROFILE_SHAPES)


def test_shapes_larger_than_the_pool_are_left_out(tiny_model_dir, monkeypatch):
    # 24 blocks of 16 tokens: the 256-token prompt (16 blocks) fits, 32 decodes at 64 tokens (160) do not.
    small = ModelRunner(EngineConfig(model=str(tiny_model_dir), kv_cache_bytes=24 * 4 * 2 * 16 * 2 * 32 * 4))
    assert small.kv.num_blocks == 24
    timed, time = [], Planner.time

    def recorded(planner, chunks, decodes, repeats):
        timed.append((list(chunks), len(decodes)))
        return time(planner, chunks, decodes, repeats)

    monkeypatch.setattr(Planner, "time", recorded)
    fit = profile_step_time(small, repeats=1)
    planner = Planner(small)
    need = {shape: planner.blocks_needed([(shape[0], 0)] if shape[0] else [], [PROFILE_CONTEXT] * shape[1])
            for shape in PROFILE_SHAPES}
    measured = {(chunks[0][0] if chunks else 0, decodes) for chunks, decodes in timed[1:]}  # after the warm-up
    assert measured == {shape for shape, blocks in need.items() if blocks <= 24} != set(PROFILE_SHAPES)
    # A fit of what was measured (its split between base and per token is the machine's noise at one repeat).
    assert fit.base_s + fit.per_token_s > 0 and small.seqs == {}


def test_the_worker_reports_its_profile_in_its_info(runner):
    fit = StepTimeFit(0.003, 2e-5, 0.0)
    info = WorkerServicer(WorkerConfig(), runner, None, step_time=fit).info()
    assert info.step_time.base_ms == pytest.approx(3.0) and info.step_time.per_token_ms == pytest.approx(0.02)
    assert not WorkerServicer(WorkerConfig(), runner, None).info().HasField("step_time")
    assert parse_args([], "decode").profile_steps and not parse_args(["--no-step-profile"], "decode").profile_steps
