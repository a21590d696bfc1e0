"""Capacity: the highest arrival rate a live mesh serves within the SLOs (Sarathi-Serve's capacity search).

A probe runs the workload at one rate and passes when every request finished, the p99 TBT is within
``slo_tbt`` and the p50 TTFT within ``slo_ttft`` (each when given; the TTFT bound plays the part of
Sarathi-Serve's "p50 scheduling delay <= 2 s" stability condition). The search is the simulator's
(``seawall.sim.capacity``): double the rate while probes pass, then bisect until the bracket is within
``tolerance`` of its top or ``max_probes`` probes ran. Every probe is the same workload stretched in time
(same seed), so the boundary does not move with sampling noise; on a live mesh it still moves with the noise
of the machine, so the result is a bracket, reported with every probe.
"""

from __future__ import annotations

from collections.abc import Callable

from services.common.errors import InvalidArgument


def passes(summary: dict, slo_ttft: float | None, slo_tbt: float | None) -> bool:
    if summary["num_finished"] < summary["num_requests"]:
        return False
    if slo_tbt is not None and (summary["tbt_p99"] is None or summary["tbt_p99"] > slo_tbt):
        return False
    return slo_ttft is None or (summary["ttft_p50"] is not None and summary["ttft_p50"] <= slo_ttft)


def capacity_search(probe: Callable[[float], dict], *, slo_ttft: float | None, slo_tbt: float | None,
                    start_rate: float = 1.0, tolerance: float = 0.1, max_probes: int = 8) -> dict:
    """``probe(rate)`` runs the workload at ``rate`` and returns its summary (``metrics.summarize``)."""
    if slo_ttft is None and slo_tbt is None:
        raise InvalidArgument("--capacity needs an SLO: --slo-tbt and/or --slo-ttft")
    if start_rate <= 0 or max_probes < 1:
        raise InvalidArgument("--start-rate must be > 0 and --capacity-probes >= 1")
    probes: list[dict] = []

    def ok(rate: float) -> bool:
        summary = probe(rate)
        passed = passes(summary, slo_ttft, slo_tbt)
        probes.append({"rate": rate, "passed": passed, **{k: summary.get(k) for k in (
            "ttft_p50", "ttft_p99", "tbt_p99", "throughput_tok_s", "goodput", "num_finished", "num_requests")}})
        return passed

    lo, hi = 0.0, start_rate
    while len(probes) < max_probes and ok(hi):
        lo, hi = hi, 2.0 * hi
    while len(probes) < max_probes and (hi - lo) > tolerance * hi:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    upper_failed = any(p["rate"] == hi and not p["passed"] for p in probes)
    return {"capacity_rate": lo, "upper_rate": hi, "upper_failed": upper_failed, "slo_ttft": slo_ttft,
            "slo_tbt": slo_tbt, "probes": probes}
