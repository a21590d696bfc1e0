"""Arrival processes of the live benchmark: rates, burstiness, bursts and their groups."""

from __future__ import annotations

import pytest

from seawall.bench.arrivals import ArrivalSpec, arrival_times, burst_groups, count_for_duration, describe
from services.common.errors import InvalidArgument


def test_poisson_has_the_rate_and_a_cv_of_one():
    d = describe(arrival_times(ArrivalSpec("poisson", rate=8.0), 8000, seed=1))
    assert d["rate"] == pytest.approx(8.0, rel=0.05)
    assert d["cv"] == pytest.approx(1.0, rel=0.08)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_has_the_rate_and_the_cv(cv):
    d = describe(arrival_times(ArrivalSpec("gamma", rate=2.0, cv=cv), 20000, seed=3))
    assert d["rate"] == pytest.approx(2.0, rel=0.1)
    assert d["cv"] == pytest.approx(cv, rel=0.15)


def test_onoff_keeps_the_mean_rate_and_is_silent_when_off():
    spec = ArrivalSpec("onoff", rate=2.0, on_s=1.0, off_s=3.0)
    times = arrival_times(spec, 4000, seed=2)
    assert describe(times)["rate"] == pytest.approx(2.0, rel=0.1)
    assert all(t % 4.0 < 1.0 for t in times)
    groups = burst_groups(spec, times)
    assert all(b % 4.0 < 1.0 and all(int(times[i] // 4) == int(b // 4) for i in members) for b, members in groups)
    assert sum(len(m) for _, m in groups) == len(times)


def test_bursts_arrive_together_at_fixed_intervals():
    spec = ArrivalSpec("bursts", burst_size=3, burst_interval=2.5)
    times = arrival_times(spec, 7)
    assert times == [0.0, 0.0, 0.0, 2.5, 2.5, 2.5, 5.0]
    assert burst_groups(spec, times) == [(0.0, (0, 1, 2)), (2.5, (3, 4, 5)), (5.0, (6,))]
    assert burst_groups(ArrivalSpec("poisson"), times) == []


def test_the_same_seed_at_another_rate_is_the_same_pattern_stretched():
    slow = arrival_times(ArrivalSpec("gamma", rate=1.0, cv=2.0), 50, seed=4)
    fast = arrival_times(ArrivalSpec("gamma", rate=4.0, cv=2.0), 50, seed=4)
    assert fast == pytest.approx([t / 4 for t in slow])


def test_count_for_duration_covers_the_duration():
    spec = ArrivalSpec("poisson", rate=5.0)
    for seed in range(5):
        assert arrival_times(spec, count_for_duration(spec, 30.0), seed)[-1] > 30.0
    assert count_for_duration(ArrivalSpec("bursts", burst_size=4, burst_interval=2.0), 5.0) == 12


def test_bad_arguments_say_what_to_fix():
    with pytest.raises(InvalidArgument, match="--rate"):
        arrival_times(ArrivalSpec("poisson", rate=0.0), 4)
    with pytest.raises(InvalidArgument, match="unknown arrival"):
        arrival_times(ArrivalSpec("weibull"), 4)
    with pytest.raises(InvalidArgument, match="--duration"):
        count_for_duration(ArrivalSpec("burst"), 3.0)
