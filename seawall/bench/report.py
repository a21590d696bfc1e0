"""The benchmark's outputs: a text table with ratios to the first row, the JSON report and the HTML report.

JSON (``seawall-bench/v1``): ``results`` maps each system (a policy, ``mesh`` for a mesh the benchmark did
not start, ``hf-transformers``) to its summary at the first rate (``metrics.summarize``: ``ttft_p50``,
``ttft_p99``, ``tbt_p50``, ``tbt_p99``, ``max_stall``, ``throughput_tok_s``, ``goodput``...; seconds, tokens/s,
requests/s); ``ratios`` divides each by the first system's; ``paired`` compares E2E request by request with
the first system; ``sweep`` holds one summary per rate, ``capacity`` the capacity searches, ``requests`` one
record per request. With a ``--priority-mix``, each summary's ``by_priority`` maps each priority to its
class's latencies (``metrics.class_summary``). ``targets`` holds the issue's targets (``targets.py``); with
``--repeats N``, every other key is round 1's, ``rounds`` holds each round's results, ratios, paired
comparisons and targets, and ``targets`` is judged on the median over the rounds (each entry's ``rounds`` lists
its figures round by round). The HTML has the table and SVG plots: TBT over time around the
bursts, the TTFT CDF (one line per priority class when there are several), latency against load (with
several rates), goodput and capacity per system.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from seawall.bench import svg
from seawall.bench.metrics import RequestRecord
from seawall.bench.targets import HEADLINE

COLUMNS = (  # (key, header, scale, format)
    ("ttft_p50", "TTFT p50 ms", 1e3, "{:.0f}"), ("ttft_p99", "TTFT p99 ms", 1e3, "{:.0f}"),
    # the server's own queueing delay (its part of TTFT); "-" where the server does not report it
    ("queue_delay_p99", "queue p99 ms", 1e3, "{:.0f}"),
    ("tbt_p50", "TBT p50 ms", 1e3, "{:.1f}"), ("tbt_p99", "TBT p99 ms", 1e3, "{:.1f}"),
    ("max_stall", "max stall ms", 1e3, "{:.0f}"), ("burst_tbt_ratio", "burst/steady", 1, "{:.2f}"),
    ("burst_tbt_ratio_control", "burst/control", 1, "{:.2f}"),
    ("e2e_mean", "E2E mean s", 1, "{:.2f}"), ("throughput_tok_s", "tok/s", 1, "{:.0f}"),
    ("goodput", "goodput req/s", 1, "{:.2f}"), ("preemptions", "preempt", 1, "{:.0f}"),
    ("migrations", "migrated", 1, "{:.0f}"), ("queued_moves", "queue moves", 1, "{:.0f}"),
    ("kv_blocks_peak", "KV peak", 1, "{:.0f}"), ("prefix_hit_rate", "prefix hits", 100, "{:.0f}%"),
    ("draft_acceptance", "drafts kept", 100, "{:.0f}%"),  # only runs with --speculative-tokens have drafts
)
RATIO_COLUMNS = ("ttft_p50", "ttft_p99", "tbt_p99", "max_stall", "e2e_mean", "throughput_tok_s", "goodput")


def _cell(value, scale: float, fmt: str) -> str:
    return "-" if value is None else fmt.format(value * scale)


def format_table(results: dict[str, dict], ratios: dict[str, dict] | None = None) -> str:
    cols = [c for c in COLUMNS if any(r.get(c[0]) is not None for r in results.values())]
    width = max([len(n) for n in results] + [6])
    rows = [f"{'system':<{width}} " + " ".join(f"{h:>{max(len(h), 8)}}" for _, h, _, _ in cols)]
    for name, res in results.items():
        rows.append(f"{name:<{width}} " + " ".join(f"{_cell(res.get(k), s, f):>{max(len(h), 8)}}"
                                                   for k, h, s, f in cols))
    if ratios and len(results) > 1:
        base = next(iter(results))
        rows.append(f"\nratio to {base} (x / {base}; lower is better except tok/s and goodput):")
        heads = {k: h for k, h, _, _ in COLUMNS}
        rcols = [k for k in RATIO_COLUMNS if any(ratios[n].get(k) is not None for n in ratios)]
        rows.append(f"{'system':<{width}} " + " ".join(f"{heads[k]:>{max(len(heads[k]), 8)}}" for k in rcols))
        for name, rat in ratios.items():
            rows.append(f"{name:<{width}} " + " ".join(
                f"{_cell(rat.get(k), 1, '{:.2f}x'):>{max(len(heads[k]), 8)}}" for k in rcols))
    return "\n".join(rows)


def format_targets(report: dict) -> list[str]:
    """A line per target the run measured (and, over repeated rounds, its headline figure in each round)."""
    lines = []
    for name, t in report["targets"].items():
        rounds = t.get("rounds")
        t = {k: v for k, v in t.items() if k != "rounds"}
        if all(v is None for v in t.values()):
            continue  # e.g. bursts that caught no request decoding: nothing to print, the JSON keeps the entry
        figures = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in t.items())
        lines.append(f"target {name}{f' (median of {len(rounds)} rounds)' if rounds else ''}: {figures}")
        key = HEADLINE.get(name)
        if rounds and key:
            lines.append(f"  {key} by round: " + ", ".join("-" if r.get(key) is None else f"{r[key]:.3g}"
                                                         for r in rounds))
    return lines


def write_json(path: Path, report: dict) -> None:
    Path(path).write_text(json.dumps(report, indent=1, default=_jsonable) + "\n")


def _jsonable(obj):
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# ------------------------------------------------------------------------------------------------ plots


def tbt_timeline(records: list[RequestRecord], origin: float, span: tuple[float, float] | None,
                 bins: int = 200) -> list[tuple[float, float]]:
    """The longest gap (ms) overlapping each time bin, x in seconds from ``origin``, so a stall shows as a
    plateau over its whole length; only the requests decoding at the first burst (the ``steady`` ones when
    the workload names them) when ``span`` is given."""
    tracked = [r for r in records if r.ok]
    if span is not None:
        roles = {r.role for r in tracked}
        tracked = [r for r in tracked if (r.role == "steady" if "steady" in roles
                                          else r.chunk_times[0] < origin < r.chunk_times[-1])]
    gaps = [(a - origin, z - origin) for r in tracked for a, z in zip(r.chunk_times, r.chunk_times[1:],
                                                                       strict=False)]
    if span is not None:
        gaps = [(a, z) for a, z in gaps if z >= span[0] and a <= span[1]]
    if not gaps:
        return []
    lo, hi = min(a for a, _ in gaps), max(z for _, z in gaps)
    if span is not None:
        lo, hi = max(lo, span[0]), min(hi, span[1])
    width = max((hi - lo) / bins, 1e-3)
    best: dict[int, float] = {}
    last = int((hi - lo) / width)
    for a, z in gaps:
        for k in range(max(0, int((a - lo) / width)), min(last, int((z - lo) / width)) + 1):
            best[k] = max(best.get(k, 0.0), (z - a) * 1e3)
    return [(lo + k * width, best[k]) for k in sorted(best)]


def ttft_cdf(records: list[RequestRecord]) -> list[tuple[float, float]]:
    ttft = sorted(r.ttft * 1e3 for r in records if r.ok)
    n = len(ttft)
    return [(v, (i + 1) / n) for i, v in enumerate(ttft)]


def _ttft_cdfs(runs: dict[str, list[RequestRecord]]) -> str:
    """The TTFT CDF of each system, one line per priority class when the run had several."""
    classes = sorted({r.priority for records in runs.values() for r in records})
    if len(classes) < 2:
        return svg.line_chart("TTFT CDF", {n: ttft_cdf(r) for n, r in runs.items()}, "TTFT, ms",
                              "fraction of requests")
    lines = {f"{n}, priority {p}": ttft_cdf([r for r in records if r.priority == p])
             for n, records in runs.items() for p in classes}
    return svg.line_chart("TTFT CDF by priority (lower runs sooner)", lines, "TTFT, ms", "fraction of requests")


def priority_table(results: dict[str, dict]) -> str | None:
    """Each system's latencies per priority class (``by_priority``), or None when no run had classes."""
    classes = {f"{n} priority {p}": c for n, r in results.items() for p, c in (r.get("by_priority") or {}).items()}
    return format_table(classes) if classes else None


def plots(report: dict, runs: dict[str, list[RequestRecord]],
          controls: dict[str, list[RequestRecord]] | None = None) -> list[str]:
    """The report's figures; ``controls`` (each system's run without the burst) join the TBT timeline, so
    the burst's gaps show against the same decodes' gaps without it."""
    bursts = report["workload"].get("bursts") or []
    origin = bursts[0] if bursts else 0.0
    span = (-2.0, max(6.0, (bursts[-1] - origin) + 4.0)) if bursts else None
    x_label = "time since the burst, s" if bursts else "time since start, s"
    out = [svg.line_chart("TBT over time (longest gap in each bin)" + (", decodes running at the burst" if bursts
                                                                    else ""),
                          {**{n: tbt_timeline(r, origin, span) for n, r in runs.items()},
                           **{f"{n}, no burst": tbt_timeline(r, origin, span) for n, r in (controls or {}).items()}},
                          x_label, "gap, ms",
                          vlines=[b - origin for b in bursts], step=True),
           _ttft_cdfs(runs)]
    sweep = report.get("sweep") or {}
    if any(len(v) > 1 for v in sweep.values()):
        for key, label in (("tbt_p99", "TBT p99, ms"), ("ttft_p50", "TTFT p50, ms"), ("e2e_mean", "E2E mean, ms")):
            out.append(svg.line_chart(f"{label.split(',')[0]} vs load", {
                n: [(s["rate"], s[key] * 1e3) for s in v if s.get(key) is not None] for n, v in sweep.items()},
                "arrival rate, requests/s", label))
    results = report["results"]
    out.append(svg.bar_chart("Goodput" + _slo_text(report), {n: r.get("goodput") for n, r in results.items()},
                             "requests/s within the SLOs"))
    cap = report.get("capacity") or {}
    if cap:
        out.append(svg.bar_chart("Capacity" + _slo_text(report), {n: c["capacity_rate"] for n, c in cap.items()},
                                 "highest rate within the SLOs, req/s"))
    return out


def _slo_text(report: dict) -> str:
    slo = report.get("slo") or {}
    parts = [f"TTFT <= {slo['ttft']:g} s" if slo.get("ttft") is not None else "",
             f"TBT <= {slo['tbt'] * 1e3:g} ms" if slo.get("tbt") is not None else ""]
    parts = [p for p in parts if p]
    return f" ({', '.join(parts)})" if parts else " (no SLO given: every finished request counts)"


def write_html(path: Path, report: dict, runs: dict[str, list[RequestRecord]],
               controls: dict[str, list[RequestRecord]] | None = None) -> None:
    table = format_table(report["results"], report.get("ratios"))
    classes = priority_table(report["results"])
    if classes:
        table += f"\n\nby priority (lower runs sooner):\n{classes}"
    targets = format_targets(report)
    if targets:
        table += "\n\n" + "\n".join(targets)
    meta = {k: report.get(k) for k in ("date", "commit", "command", "target")}
    figs = "\n".join(f"<figure>{fig}</figure>" for fig in plots(report, runs, controls))
    notes = "".join(f"<li>{escape(n)}</li>" for n in report.get("notes", []))
    html = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>seawall bench</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}} pre{{background:#f6f6f6;padding:1em;
overflow-x:auto}} figure{{display:inline-block;margin:0.5em}}</style></head><body>
<h1>seawall bench</h1>
<p>{escape(report['workload']['description'])}</p>
<pre>{escape(json.dumps(meta, indent=1))}</pre>
<h2>Results</h2><pre>{escape(table)}</pre>
{f'<ul>{notes}</ul>' if notes else ''}
<h2>Plots</h2>
{figs}
</body></html>
"""
    Path(path).write_text(html)
