"""The report: JSON schema, the table with ratios, the HTML with its plots; the capacity search."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from seawall.bench.capacity import capacity_search
from seawall.bench.metrics import RequestRecord, summarize
from seawall.bench.report import format_table, write_html, write_json
from seawall.bench.session import BenchOptions, System, _report
from seawall.bench.workload import WorkloadSpec
from services.common.errors import InvalidArgument

SCHEMA_KEYS = {"ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "max_stall", "throughput_tok_s", "goodput",
               "goodput_frac", "e2e_mean", "preemptions", "kv_blocks_peak", "steady_tbt_p50", "burst_tbt_p99"}


def _system(name: str, stall: float) -> System:
    records = []
    for i in range(4):  # steady users: a token every 10 ms, one long gap at the burst (t = 1.0)
        times = [0.01 * k for k in range(1, 100)] + [1.0 + stall + 0.01 * k for k in range(20)]
        records.append(RequestRecord(i, 0.0, 8, len(times), "steady", 0.0, times, [1] * len(times)))
    for i in range(4, 6):
        times = [1.0 + stall + 0.05, 1.0 + stall + 0.06]
        records.append(RequestRecord(i, 1.0, 500, 2, "burst", 1.0, times, [1, 1]))
    summary = summarize(records, bursts=[(1.0, (4, 5))], slo_ttft=0.5, slo_tbt=0.05)
    return System(name, [{"rate": None, **summary}], records)


@pytest.fixture
def report_and_runs():
    spec = WorkloadSpec(kind="burst", steady_users=4, burst_size=2, burst_at=1.0, burst_prompt_len=500)
    systems = [_system("vllm", 0.6), _system("sarathi", 0.02)]
    return _report(BenchOptions(workload=spec, slo_ttft=0.5, slo_tbt=0.05), systems, []), \
        {s.name: s.records for s in systems}


def test_json_has_every_figure_per_policy(tmp_path, report_and_runs):
    report, _ = report_and_runs
    write_json(tmp_path / "out.json", report)
    data = json.loads((tmp_path / "out.json").read_text())
    assert set(data["results"]) == {"vllm", "sarathi"}
    for res in data["results"].values():
        assert SCHEMA_KEYS <= set(res)
    assert data["baseline"] == "vllm"
    # the stall is the gap from the last token before the burst (0.99) to the first after it
    assert data["results"]["vllm"]["max_stall"] == pytest.approx(0.61)
    assert data["ratios"]["sarathi"]["max_stall"] == pytest.approx(0.03 / 0.61)
    assert data["workload"]["bursts"] == [1.0]
    assert len(data["requests"]["sarathi"]) == 6
    sarathi = data["targets"]["sarathi_burst_tbt_p99_vs_steady"]
    assert sarathi["vs_steady_p50"] == pytest.approx(data["results"]["sarathi"]["burst_tbt_p99"] / 0.01)
    assert sarathi["met"] is False  # a 30 ms gap is 3x the steady 10 ms
    assert data["targets"]["vllm_burst_tbt_p99_vs_steady"]["max_stall"] == pytest.approx(0.61)


def test_table_has_a_row_per_system_and_ratios(report_and_runs):
    report, _ = report_and_runs
    table = format_table(report["results"], report["ratios"])
    lines = table.splitlines()
    assert lines[1].startswith("vllm") and lines[2].startswith("sarathi")
    assert "ratio to vllm" in table and "0.05x" in table
    assert "queue p99 ms" not in table  # no server reported one (test_live.py: a mesh does)


def test_html_has_the_plots_as_valid_svg(tmp_path, report_and_runs):
    report, runs = report_and_runs
    write_html(tmp_path / "out.html", report, runs)
    html = (tmp_path / "out.html").read_text()
    svgs = [html[i:html.index("</svg>", i) + 6] for i in range(len(html)) if html.startswith("<svg", i)]
    assert len(svgs) == 3  # TBT over time, TTFT CDF, goodput
    for s in svgs:
        ET.fromstring(s)
    assert "TBT over time" in html and "TTFT CDF" in html and "Goodput" in html
    assert "target sarathi_burst_tbt_p99_vs_steady: vs_steady_p50 3" in html  # the targets, under the table


def test_a_control_run_joins_the_tbt_timeline_only(tmp_path, report_and_runs):
    report, runs = report_and_runs
    controls = {"sarathi": [r for r in runs["sarathi"] if r.role == "steady"]}
    write_html(tmp_path / "out.html", report, runs, controls)
    html = (tmp_path / "out.html").read_text()
    tbt, ttft = html.split("TTFT CDF")[0], html.split("TTFT CDF")[1]
    assert "sarathi, no burst" in tbt and "no burst" not in ttft


def test_capacity_search_brackets_the_highest_passing_rate():
    def probe(rate):
        return {"num_requests": 10, "num_finished": 10, "tbt_p99": 0.02 * rate, "ttft_p50": 0.1}

    out = capacity_search(probe, slo_ttft=1.0, slo_tbt=0.066, start_rate=1.0, tolerance=0.05, max_probes=20)
    assert out["capacity_rate"] <= 3.3 < out["upper_rate"]
    assert out["upper_rate"] - out["capacity_rate"] <= 0.05 * out["upper_rate"] and out["upper_failed"]
    assert [p["rate"] for p in out["probes"][:3]] == [1.0, 2.0, 4.0]
    few = capacity_search(probe, slo_ttft=1.0, slo_tbt=0.066, start_rate=1.0, max_probes=2)
    assert few["capacity_rate"] == 2.0 and not few["upper_failed"]  # every probe passed: a lower bound
    with pytest.raises(InvalidArgument, match="SLO"):
        capacity_search(probe, slo_ttft=None, slo_tbt=None)


def test_priority_classes_get_their_own_table_and_ttft_cdfs(tmp_path, report_and_runs):
    _, runs = report_and_runs
    for records in runs.values():
        records[4].priority = records[5].priority = -1  # the burst's two requests were urgent
    spec = WorkloadSpec(kind="burst", steady_users=4, burst_size=2, burst_at=1.0, burst_prompt_len=500)
    systems = [System(n, [{"rate": None, **summarize(r, bursts=[(1.0, (4, 5))])}], r) for n, r in runs.items()]
    report = _report(BenchOptions(workload=spec), systems, [])
    assert set(report["results"]["sarathi"]["by_priority"]) == {"-1", "0"}
    assert report["results"]["sarathi"]["by_priority"]["-1"]["num_requests"] == 2
    write_html(tmp_path / "out.html", report, runs)
    html = (tmp_path / "out.html").read_text()
    assert "by priority (lower runs sooner)" in html and "sarathi priority -1" in html
    assert "TTFT CDF by priority" in html and "vllm, priority -1" in html and "vllm, priority 0" in html
