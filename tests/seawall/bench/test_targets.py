"""The issue's targets: figures read off a report, judged against their thresholds, and over repeated rounds."""

from __future__ import annotations

import pytest

from seawall.bench.metrics import RequestRecord, paired
from seawall.bench.targets import figures, judge, over_rounds


def rec(index, e2e):
    return RequestRecord(index, 0.0, 10, 1, "", sent=0.0, chunk_times=[e2e], chunk_tokens=[1])


def _fastserve_report(fcfs_e2e, fast_e2e, baseline="fcfs"):
    fcfs = [rec(i, e) for i, e in enumerate(fcfs_e2e)]
    fast = [rec(i, e) for i, e in enumerate(fast_e2e)]
    results = {"fcfs": {"e2e_mean": sum(fcfs_e2e) / len(fcfs_e2e)},
               "fastserve": {"e2e_mean": sum(fast_e2e) / len(fast_e2e)}}
    return {"results": results, "workload": {"bursts": []}, "baseline": baseline,
            "paired": {"fastserve": paired(fast, fcfs)}, "capacity": {}}


def test_the_fastserve_targets_report_the_gain_the_worst_request_and_how_many_were_over_1_5x():
    t = judge(figures(_fastserve_report((1.0, 1.0, 1.0, 4.0), (0.2, 2.0, 1.6, 0.4))))
    assert t["fastserve_mean_latency_2x_fcfs"] == {"gain": pytest.approx(1.75 / 1.05), "met": False}
    assert t["fastserve_no_request_worse_1_5x"] == {"worst_ratio": pytest.approx(2.0), "requests_over_1_5x": 2,
                                                    "met": False}


def test_request_by_request_figures_only_against_fcfs_as_the_baseline():
    # paired() compares with the first system: with fastserve first, its "worst ratio" would be fcfs's
    t = judge(figures(_fastserve_report((1.0, 1.0), (0.5, 0.5), baseline="fastserve")))
    assert t["fastserve_no_request_worse_1_5x"] == {"worst_ratio": None, "requests_over_1_5x": None, "met": None}
    assert t["fastserve_mean_latency_2x_fcfs"]["met"] is True


def test_burst_targets_judge_sarathi_and_only_report_vllm():
    res = {"burst_tbt_ratio": 1.9, "burst_tbt_ratio_p99": 1.2, "burst_tbt_ratio_control": 2.5,
           "burst_tbt_ratio_control_p99": 1.1, "max_stall": 0.03}
    report = {"results": {"vllm": {**res, "burst_tbt_ratio": 40.0}, "sarathi": res},
              "workload": {"bursts": [3.0]}, "baseline": "vllm", "paired": {}, "capacity": {}}
    t = judge(figures(report))
    assert t["sarathi_burst_tbt_p99_vs_steady"]["met"] is True
    assert t["sarathi_burst_tbt_p99_vs_steady"]["met_vs_control_p50"] is False
    assert "met" not in t["vllm_burst_tbt_p99_vs_steady"] and t["vllm_burst_tbt_p99_vs_steady"]["vs_steady_p50"] == 40
    no_burst = {**report, "workload": {"bursts": []}}
    assert figures(no_burst) == {}


def test_over_rounds_judges_the_median_of_each_figure_and_keeps_every_round():
    rounds = [figures(_fastserve_report((1.0, 1.0), f)) for f in ((0.4, 0.4), (0.9, 0.9), (0.45, 0.45))]
    t = over_rounds(rounds)
    gain = t["fastserve_mean_latency_2x_fcfs"]
    # gains 2.5, 1.11, 2.22: one slow round does not decide it, as it would if it were the only one
    assert gain["gain"] == pytest.approx(1 / 0.45) and gain["met"] is True
    assert [r["gain"] for r in gain["rounds"]] == pytest.approx([2.5, 1 / 0.9, 1 / 0.45])
    worst = t["fastserve_no_request_worse_1_5x"]
    assert worst["worst_ratio"] == pytest.approx(0.45) and worst["met"] is True
    assert worst["requests_over_1_5x"] == 0


def test_over_rounds_skips_a_round_without_the_figure():
    a = {"sarathi_capacity_1_5x_vllm": {"gain": 2.0}}
    b = {"sarathi_capacity_1_5x_vllm": {"gain": None}}
    c = {"sarathi_capacity_1_5x_vllm": {"gain": 1.0}}
    assert over_rounds([a, b, c])["sarathi_capacity_1_5x_vllm"]["gain"] == 1.5
    assert over_rounds([b])["sarathi_capacity_1_5x_vllm"]["met"] is None
