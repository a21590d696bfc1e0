"""The issue's targets, read off one run's report, and judged over repeated rounds by their median.

One run on a shared box is a weak verdict: a policy's run can land on a busier minute than its baseline's, and
near saturation a few percent of the box's speed moves FCFS's latency by 2x (bench/README.md). ``--repeats``
runs every policy once per round, in alternating order, and a target's figure is the median of its per-round
values, each a ratio within one round, so the pair shares that round's box.
"""

from __future__ import annotations

from statistics import median

# target -> [(the key saying whether it is met, the figure it judges, threshold, "<=" or ">=")]
THRESHOLDS: dict[str, list[tuple[str, str, float, str]]] = {
    "sarathi_burst_tbt_p99_vs_steady": [("met", "vs_steady_p50", 2.0, "<="),
                                        ("met_vs_steady_p99", "vs_steady_p99", 2.0, "<="),
                                        ("met_vs_control_p50", "vs_control_p50", 2.0, "<=")],
    "fastserve_mean_latency_2x_fcfs": [("met", "gain", 2.0, ">=")],
    "fastserve_no_request_worse_1_5x": [("met", "worst_ratio", 1.5, "<=")],
    "sarathi_capacity_1_5x_vllm": [("met", "gain", 1.5, ">=")],
}
HEADLINE = {"sarathi_burst_tbt_p99_vs_steady": "vs_steady_p50", "vllm_burst_tbt_p99_vs_steady": "vs_steady_p50",
            "fastserve_mean_latency_2x_fcfs": "gain", "fastserve_no_request_worse_1_5x": "worst_ratio",
            "sarathi_capacity_1_5x_vllm": "gain"}


def figures(report: dict) -> dict[str, dict]:
    """Each target's figures for whichever of its systems the report has (values None where not measured)."""
    res, out = report["results"], {}
    for name in ("sarathi", "vllm"):
        if not report["workload"]["bursts"] or name not in res:
            continue
        r = res[name]
        out[f"{name}_burst_tbt_p99_vs_steady"] = {
            "vs_steady_p50": r.get("burst_tbt_ratio"), "vs_steady_p99": r.get("burst_tbt_ratio_p99"),
            "vs_control_p50": r.get("burst_tbt_ratio_control"),
            "vs_control_p99": r.get("burst_tbt_ratio_control_p99"), "max_stall": r.get("max_stall")}
    if "fcfs" in res and "fastserve" in res:
        f, s = res["fcfs"].get("e2e_mean"), res["fastserve"].get("e2e_mean")
        out["fastserve_mean_latency_2x_fcfs"] = {"gain": f / s if f and s else None}
        # request by request against fcfs: only when fcfs is the run's baseline (``paired`` is against it)
        pair = report["paired"].get("fastserve", {}) if report["baseline"] == "fcfs" else {}
        out["fastserve_no_request_worse_1_5x"] = {"worst_ratio": pair.get("worst_e2e_ratio"),
                                                  "requests_over_1_5x": pair.get("num_worse_1_5x")}
    caps = report.get("capacity") or {}
    if "sarathi" in caps and "vllm" in caps and caps["vllm"]["capacity_rate"]:
        out["sarathi_capacity_1_5x_vllm"] = {"gain": caps["sarathi"]["capacity_rate"] / caps["vllm"]["capacity_rate"]}
    return out


def judge(figs: dict[str, dict]) -> dict[str, dict]:
    """``figs`` with each target's ``met`` keys added (None where its figure is missing)."""
    out = {}
    for name, entry in figs.items():
        entry = dict(entry)
        for key, figure, threshold, op in THRESHOLDS.get(name, []):
            value = entry.get(figure)
            entry[key] = None if value is None else (value <= threshold if op == "<=" else value >= threshold)
        out[name] = entry
    return out


def over_rounds(per_round: list[dict[str, dict]]) -> dict[str, dict]:
    """The targets judged on the median over rounds of each figure; ``rounds`` keeps every round's figures."""
    out = {}
    for name in per_round[0]:
        entries = [r[name] for r in per_round if name in r]
        merged = {key: _median([e.get(key) for e in entries]) for key in entries[0]}
        out[name] = {**judge({name: merged})[name], "rounds": entries}
    return out


def _median(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None
