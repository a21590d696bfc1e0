"""Capacity search: the highest arrival rate a configuration serves within its SLOs (Sarathi-Serve §5).

A probe simulates the workload at one QPS and passes when P99 TBT <= ``slo_tbt_p99`` and the P50 scheduling
delay (arrival → first scheduled) <= ``slo_sched_delay_p50`` (the stability condition). The search doubles the
upper bound while probes pass, then bisects until the bracket is within ``tolerance`` of its top or
``max_probes`` probes ran; every probe uses the same request lengths and the same random arrival pattern,
only stretched (common random numbers), so the pass/fail boundary does not move with sampling noise.
"""

from __future__ import annotations

import dataclasses

from seawall.sim.loop import SimConfig, Simulation, build_cost_model
from seawall.sim.workloads import WorkloadConfig, make_workload
from services.common.errors import InvalidArgument


def probe(cfg: SimConfig, wl: WorkloadConfig, qps: float, slo_tbt_p99: float, slo_sched_delay_p50: float,
          cost=None) -> dict:
    m = Simulation(cfg, make_workload(dataclasses.replace(wl, qps=qps)), cost).run()
    tbt = m["tbt_p99"] or 0.0
    delay = m["sched_delay_p50"] if m["sched_delay_p50"] is not None else float("inf")
    passed = m["num_finished"] == m["num_requests"] and tbt <= slo_tbt_p99 and delay <= slo_sched_delay_p50
    return {"qps": qps, "passed": passed, "tbt_p99": m["tbt_p99"], "sched_delay_p50": m["sched_delay_p50"],
            "ttft_p50": m["ttft_p50"], "throughput_tok_s": m["throughput_tok_s"], "sim_wall_s": m["sim_wall_s"]}


def capacity_search(cfg: SimConfig, wl: WorkloadConfig, slo_tbt_p99: float, slo_sched_delay_p50: float = 2.0,
                    start_qps: float = 1.0, tolerance: float = 0.025, max_probes: int = 20) -> dict:
    if slo_tbt_p99 <= 0 or slo_sched_delay_p50 <= 0 or start_qps <= 0:
        raise InvalidArgument("SLOs and --start-qps must be > 0")
    if wl.arrival in ("burst", "trace") and wl.qps is None:
        raise InvalidArgument("capacity search needs a rate-driven arrival process (poisson, gamma, onoff, trace)")
    cost = build_cost_model(cfg)
    probes: list[dict] = []

    def passes(qps: float) -> bool:
        probes.append(probe(cfg, wl, qps, slo_tbt_p99, slo_sched_delay_p50, cost))
        return probes[-1]["passed"]

    lo, hi = 0.0, 2.0 * start_qps
    while len(probes) < max_probes and passes(hi):
        lo, hi = hi, 2.0 * hi
    while len(probes) < max_probes and (hi - lo) > tolerance * hi and hi > start_qps * 1e-3:
        mid = (lo + hi) / 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return {"capacity_qps": lo, "upper_qps": hi, "slo_tbt_p99": slo_tbt_p99,
            "slo_sched_delay_p50": slo_sched_delay_p50, "num_requests": wl.num_requests,
            "policy": cfg.policy, "model": cfg.model, "gpu": cfg.gpu, "tp": cfg.tp, "probes": probes}
