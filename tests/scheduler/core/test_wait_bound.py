"""FastServe's wait bound (``MLFQConfig.max_wait_ratio``) and its FCFS credit (``virtual_fcfs.py``).

Steps are driven with explicit times, ``STEP_S`` apart, so a job's service is its steps x ``STEP_S``.
"""

from __future__ import annotations

import random

import pytest

from services.common.sampling_params import SamplingParams
from services.scheduler.core.config import MLFQConfig
from services.scheduler.core.policies.mlfq import MLFQ
from services.scheduler.core.policies.virtual_fcfs import VirtualFCFS
from services.scheduler.core.request import Request
from services.scheduler.core.step_time import StepTimeModel
from tests.scheduler.core.test_scheduler import create_scheduler, step

STEP_S = 0.01
MS_PER_TOKEN = StepTimeModel(base_s=0.0, per_token_s=0.001, tile_tokens=1)


def job(rid: str, max_tokens: int, arrival: float, prompt_len: int = 1) -> Request:
    token = 10 + sum(map(ord, rid))
    return Request(rid, [token] * prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival)


def fastserve(mlfq: MLFQConfig, max_num_seqs: int = 1):
    return create_scheduler(policy="fastserve", step_time=MS_PER_TOKEN, mlfq=mlfq, max_num_seqs=max_num_seqs,
                            num_blocks=4096, block_size=4)


def long_job_under_short_ones(mlfq: MLFQConfig, steps: int = 400) -> tuple[float, float, list[float]]:
    """One slot. A 100-token job starts alone; from the second step a 3-token job arrives every step, so
    the MLFQ always has a fresher job ahead of it. Returns the long job's latency, its service, and its
    wait minus the bound's allowance (ratio x service + slack) at every step it was live."""
    s = fastserve(mlfq)
    s.add(job("long", 100, 0.0))
    excess, ratio = [], mlfq.max_wait_ratio or 0.0
    for i in range(steps):
        now = i * STEP_S
        if i >= 1:
            s.add(job(f"short{i}", 3, now))
        plan, events = step(s, now=now)
        j = s.policy.mlfq.jobs.get("long")
        if j is not None:  # charged up to the previous step when this one was composed
            excess.append((now - j.joined - j.ran) - (ratio * j.ran + mlfq.wait_slack_s))
        if any(e.request_id == "long" and e.finish_reason for e in events):
            return now + STEP_S, 100 * STEP_S, excess
    return float("inf"), 100 * STEP_S, excess


@pytest.mark.parametrize("ratio", [0.0, 0.5, 2.0])
def test_a_started_job_never_waits_past_the_bound(ratio):
    mlfq = MLFQConfig(max_wait_ratio=ratio, wait_credit="none", reserve_frac=0.0)
    latency, service, excess = long_job_under_short_ones(mlfq)
    # The bound is checked when a step is composed, so the job can be one step past it.
    assert max(excess) <= STEP_S + 1e-9
    assert latency <= (1 + ratio) * service + STEP_S + 1e-9


def test_without_the_bound_the_same_job_waits_far_longer():
    latency, service, excess = long_job_under_short_ones(MLFQConfig(reserve_frac=0.0, starvation_s=1e9))
    assert latency > 3 * service
    assert max(excess) > 1.0


def test_slack_lets_a_job_wait_that_much_longer():
    tight = long_job_under_short_ones(MLFQConfig(max_wait_ratio=0.5, wait_credit="none", reserve_frac=0.0))
    slack = long_job_under_short_ones(MLFQConfig(max_wait_ratio=0.5, wait_slack_s=0.2, wait_credit="none",
                                                 reserve_frac=0.0))
    assert tight[0] < slack[0] <= 1.5 * slack[1] + 0.2 + STEP_S + 1e-9


def test_overdue_jobs_run_ahead_of_every_level_oldest_first():
    m = MLFQ(MLFQConfig(max_wait_ratio=1.0, wait_credit="none"), MS_PER_TOKEN)
    reqs = [job(rid, 50, 0.0) for rid in "abcd"]
    for r in reqs:
        m.join(r, 1, now=0.0)
    for rid in "ab":  # ran 10 ms, then demoted far below c and d, which have not run
        m.jobs[rid].ran, m.jobs[rid].level = 0.01, 9
    assert [r.request_id for r in m.order(reqs, now=0.015)] == ["c", "d", "a", "b"]  # waited 5 ms: within 1x
    assert [r.request_id for r in m.order(reqs, now=0.05)] == ["a", "b", "c", "d"]  # waited 40 ms: overdue
    assert [r.request_id for r in m.order(reqs)] == ["c", "d", "a", "b"]  # no time given: the plain MLFQ order


def test_the_bound_is_off_by_default_and_in_the_sources_presets():
    for mlfq in (MLFQConfig(), MLFQConfig.paper(), MLFQConfig.released_code()):
        assert mlfq.max_wait_ratio is None


@pytest.mark.parametrize("bad", [{"max_wait_ratio": -0.1}, {"max_wait_ratio": float("inf")},
                                 {"max_wait_ratio": float("nan")}, {"wait_slack_s": -1.0},
                                 {"wait_credit": "sjf"}, {"fcfs_step_s": 0.0}])
def test_bad_wait_bound_settings_are_refused(bad):
    with pytest.raises(ValueError, match="mlfq"):
        MLFQConfig(**bad)


# --- the FCFS credit ------------------------------------------------------------------------------------------


def test_the_fcfs_replay_places_jobs_in_arrival_order_over_their_tokens_so_far():
    v = VirtualFCFS(slots=2)
    for rid, t in (("a", 0.0), ("b", 0.0), ("c", 0.2), ("d", 0.2)):
        v.join(rid, t)
    for rid, n in (("a", 10), ("b", 3), ("c", 5)):
        v.progress(rid, n)
    # a holds a slot until 1.0, b until 0.3; c takes b's slot at 0.3 (until 0.8), d takes it at 0.8.
    assert v.waits(0.1) == pytest.approx({"a": 0.0, "b": 0.0, "c": 0.1, "d": 0.6})
    v.leave("a")  # folded: its slot stays busy until 1.0
    v.progress("b", 6)
    # b now holds its slot until 0.6; c runs 0.6-1.1; d gets a's slot at 1.0.
    assert v.waits(0.1) == pytest.approx({"b": 0.0, "c": 0.4, "d": 0.8})


@pytest.mark.parametrize("seed", range(5))
def test_the_fcfs_credit_never_exceeds_the_wait_fcfs_gives(seed):
    """The core's own fcfs policy runs random jobs; the replay, fed any prefix of their tokens, never
    credits a job more wait than it had there."""
    rng = random.Random(seed)
    slots = rng.randint(1, 3)
    jobs = sorted((round(rng.uniform(0, 0.5), 3), f"j{i}", rng.randint(1, 30)) for i in range(12))
    s = create_scheduler(policy="fcfs", max_num_seqs=slots, num_blocks=4096, block_size=4)
    started, pending, now = {}, list(jobs), 0.0
    while pending or s.has_work:
        while pending and pending[0][0] <= now:
            t, rid, n = pending.pop(0)
            s.add(job(rid, n, t))
        plan, _ = step(s, now=now)
        for rid in plan.num_scheduled_tokens:
            started.setdefault(rid, now)
        now = round(now + STEP_S, 9)
    fcfs_wait = {rid: started[rid] - t for t, rid, _ in jobs}
    for fraction in (0.0, 0.5, 1.0):
        v = VirtualFCFS(slots)
        for t, rid, n in jobs:
            v.join(rid, t)
            v.progress(rid, int(n * fraction))
        for rid, wait in v.waits(STEP_S).items():
            assert wait <= fcfs_wait[rid] + 1e-9, (rid, wait, fcfs_wait[rid])


@pytest.mark.parametrize(("credit", "overdue_at"), [("fcfs", (False, True)), ("none", (True, True))])
def test_a_job_fcfs_would_have_queued_may_wait_that_long_too(credit, overdue_at):
    """Two slots, held by a and b, which have produced 30 tokens each (10 ms a token). "late" arrived at 50 ms
    and has run 10 ms: FCFS would have queued it until 300 ms at least, so with the credit it may wait until
    then (plus ratio 0 x its service) before it is overdue."""
    m = MLFQ(MLFQConfig(max_wait_ratio=0.0, wait_credit=credit, fcfs_step_s=STEP_S), MS_PER_TOKEN, slots=2)
    reqs = [job("a", 50, 0.0), job("b", 50, 0.0), job("late", 50, 0.05)]
    for r in reqs:
        m.join(r, 1, now=r.arrival_time)
    m.jobs["late"].ran = STEP_S
    if m.fcfs is not None:
        for rid, n in (("a", 30), ("b", 30), ("late", 1)):
            m.fcfs.progress(rid, n)
    for now, expected in zip((0.2, 0.35), overdue_at, strict=True):
        m.order(reqs, now=now)
        assert m.overdue("late", now) is expected
