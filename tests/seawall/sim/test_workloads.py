"""Workloads: arrival rates and burstiness, trace parsing and windows."""

from __future__ import annotations

import statistics

import pytest

from seawall.sim.workloads import WorkloadConfig, make_workload, read_trace
from services.common.errors import InvalidArgument


def _gaps(specs):
    times = [s.arrival for s in specs]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_poisson_rate_and_cv():
    gaps = _gaps(make_workload(WorkloadConfig("fixed", "poisson", 4000, qps=5.0, seed=1)))
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.08)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_rate_and_burstiness(cv):
    gaps = _gaps(make_workload(WorkloadConfig("fixed", "gamma", 20000, qps=2.0, seed=3, cv=cv)))
    assert statistics.mean(gaps) == pytest.approx(0.5, rel=0.1)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(cv, rel=0.15)


def test_onoff_keeps_the_mean_rate_and_is_silent_when_off():
    specs = make_workload(WorkloadConfig("fixed", "onoff", 3000, qps=1.0, seed=2, on_s=5, off_s=15))
    span = specs[-1].arrival
    assert len(specs) / span == pytest.approx(1.0, rel=0.1)
    assert all(s.arrival % 20 < 5 for s in specs)


def test_sharegpt_lengths_are_sampled_from_the_trace():
    specs = make_workload(WorkloadConfig("sharegpt", "burst", 2000, None, seed=0))
    assert statistics.median(s.prompt_len for s in specs) == pytest.approx(1730, rel=0.1)
    assert max(s.prompt_len for s in specs) <= 8141 and max(s.output_len for s in specs) <= 1024
    assert all(s.arrival == 0 for s in specs)
    capped = make_workload(WorkloadConfig("sharegpt", "burst", 500, None, max_total_len=2048))
    assert max(s.prompt_len + s.output_len for s in capped) <= 2048


def test_azure_trace_timestamps_and_rescaling():
    rows = read_trace("azure-conv", limit=3)
    assert [(r.prompt_len, r.output_len) for r in rows[:2]] == [(374, 44), (396, 109)]
    assert rows[0].timestamp == 0 and rows[1].timestamp == pytest.approx(4.314, abs=1e-3)
    native = make_workload(WorkloadConfig("azure-conv", "trace", 200, None))
    doubled = make_workload(WorkloadConfig("azure-conv", "trace", 200, None, time_scale=2.0))
    assert doubled[-1].arrival == pytest.approx(2 * native[-1].arrival)
    at_rate = make_workload(WorkloadConfig("azure-conv", "trace", 200, qps=4.0))
    assert (len(at_rate) - 1) / at_rate[-1].arrival == pytest.approx(4.0)


def test_mooncake_trace_has_prefix_blocks():
    rows = read_trace("mooncake-conv", limit=5, offset=0)
    assert rows[0].prompt_len == 6758 and rows[0].output_len == 500
    assert all(len(r.prefix_ids) == -(-r.prompt_len // 512) for r in rows)
    later = read_trace("mooncake-conv", limit=2, offset=100)
    assert later[0].timestamp > 0


def test_longtail_outputs_are_heavy_tailed_and_capped():
    specs = make_workload(WorkloadConfig("longtail", "poisson", 3000, qps=1.0, max_total_len=2048,
                                         pareto_alpha=1.0, pareto_min=16))
    outs = sorted(s.output_len for s in specs)
    assert all(s.output_len >= min(16, 2048 - s.prompt_len) for s in specs)  # Pareto from 16, room allowing
    assert max(s.prompt_len + s.output_len for s in specs) <= 2048
    assert outs[-len(outs) // 100] > 20 * statistics.median(outs)  # the top 1% dwarfs the median


def test_bad_workloads_say_what_to_fix():
    with pytest.raises(InvalidArgument, match="no timestamps"):
        make_workload(WorkloadConfig("sharegpt", "trace", 10, None))
    with pytest.raises(InvalidArgument, match="unknown workload"):
        make_workload(WorkloadConfig("nope", "poisson", 10, 1.0))
    with pytest.raises(InvalidArgument, match="qps"):
        make_workload(WorkloadConfig("fixed", "poisson", 10, None))


def test_a_priority_mix_marks_that_fraction_high_and_changes_no_length_or_arrival():
    plain = make_workload(WorkloadConfig("sharegpt", "poisson", 2000, 5.0, seed=4))
    mixed = make_workload(WorkloadConfig("sharegpt", "poisson", 2000, 5.0, seed=4, priority_mix=0.1))
    assert [(s.arrival, s.prompt_len, s.output_len) for s in mixed] == \
        [(s.arrival, s.prompt_len, s.output_len) for s in plain]
    assert {s.priority for s in plain} == {0} and {s.priority for s in mixed} == {-1, 0}
    assert 0.08 < sum(s.priority == -1 for s in mixed) / 2000 < 0.12  # binomial: 0.1 +- 3 sigma (0.02)
    with pytest.raises(InvalidArgument, match=r"--priority-mix is a fraction of the requests, in \[0, 1\]"):
        make_workload(WorkloadConfig("sharegpt", "poisson", 10, 5.0, priority_mix=1.5))
