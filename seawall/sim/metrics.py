"""Per-request records kept by the event loop, and the summary metrics computed from them.

Definitions (all times in seconds of simulated time):

* TTFT: arrival → first output token. TBT: every gap between consecutive output tokens of a request,
  pooled over requests (so a stall during a long prefill shows up in the tail). E2E: arrival → last token.
* scheduling delay: arrival → first step that runs any of the request (Sarathi-Serve's stability metric).
* queueing: time a request spends waiting or swapped out (before its first step and after each
  preemption until it runs again); ``queueing_frac`` is total queueing / total E2E.
* per-token latency: E2E / output tokens, averaged (vLLM's and FastServe's "normalized latency").
* KV waste: allocated KV slots that hold no token, time-weighted over the run (paging leaves only each
  sequence's partly filled last block).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestRecord:
    arrival: float
    prompt_len: int
    output_len: int
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finish: float | None = None
    num_output: int = 0
    queueing: float = 0.0
    queued_since: float | None = None  # set while waiting or swapped out
    max_gap: float = 0.0  # longest gap between two of its tokens
    num_preemptions: int = 0
    priority: int = 0

    def as_dict(self, rid: str) -> dict:
        return {"id": rid, "arrival": self.arrival, "prompt_len": self.prompt_len, "output_len": self.output_len,
                "ttft": _sub(self.first_token, self.arrival), "e2e": _sub(self.finish, self.arrival),
                "sched_delay": _sub(self.first_scheduled, self.arrival), "queueing": self.queueing,
                "max_tbt": self.max_gap, "num_output": self.num_output}


def _sub(a: float | None, b: float) -> float | None:
    return None if a is None else a - b


@dataclass
class RunTotals:
    """Step-level accumulators of one run."""

    num_steps: int = 0
    busy_s: float = 0.0
    swap_s: float = 0.0  # time spent copying KV blocks between host and device
    swap_exposed_s: float = 0.0  # the part of it that lengthened steps (not hidden behind compute)
    swapped_blocks: int = 0
    max_running: int = 0
    running_time: float = 0.0  # integral of len(running) dt
    saturated_running_time: float = 0.0  # the same, only while some request waits to be admitted
    saturated_s: float = 0.0
    kv_used_slot_time: float = 0.0  # integral of allocated KV slots dt
    kv_token_time: float = 0.0  # integral of tokens held in KV dt
    tbt: array = field(default_factory=lambda: array("d"))  # every inter-token gap
    tbt_end: array = field(default_factory=lambda: array("d"))  # when each gap ended (same order)


def _pct(values, q: float) -> float | None:
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None


def summarize(records: dict[str, RequestRecord], totals: RunTotals, preemptions: dict[str, int]) -> dict:
    done = [r for r in records.values() if r.finish is not None]
    ttft = [r.first_token - r.arrival for r in done]
    e2e = [r.finish - r.arrival for r in done]
    delay = [r.first_scheduled - r.arrival for r in done]
    per_token = [(r.finish - r.arrival) / max(r.num_output, 1) for r in done]
    out_tokens = sum(r.num_output for r in records.values())
    prompt_tokens = sum(r.prompt_len for r in done)
    start = min((r.arrival for r in records.values()), default=0.0)
    end = max((r.finish for r in done), default=start)
    span = max(end - start, 1e-12)
    total_e2e = sum(e2e)
    return {
        "num_requests": len(records),
        "num_finished": len(done),
        "ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99), "ttft_mean": _mean(ttft),
        "tbt_p50": _pct(totals.tbt, 50), "tbt_p99": _pct(totals.tbt, 99), "tbt_mean": _mean(totals.tbt),
        "tbt_max": max(totals.tbt) if len(totals.tbt) else None,
        "e2e_p50": _pct(e2e, 50), "e2e_p99": _pct(e2e, 99), "e2e_mean": _mean(e2e),
        "sched_delay_p50": _pct(delay, 50), "sched_delay_p99": _pct(delay, 99),
        "per_token_latency_mean": _mean(per_token), "per_token_latency_p95": _pct(per_token, 95),
        "queueing_frac": sum(r.queueing for r in done) / total_e2e if total_e2e > 0 else 0.0,
        "throughput_tok_s": out_tokens / span,
        "throughput_total_tok_s": (out_tokens + prompt_tokens) / span,
        "throughput_req_s": len(done) / span,
        "makespan_s": span,
        "busy_frac": totals.busy_s / span,
        "max_concurrent_seqs": totals.max_running,
        "mean_concurrent_seqs": totals.running_time / span,
        "saturated_concurrent_seqs": (totals.saturated_running_time / totals.saturated_s
                                      if totals.saturated_s > 0 else None),
        "preemptions": sum(preemptions.values()),
        "preemptions_by_mode": dict(preemptions),
        "swap_time_s": totals.swap_s,
        "swap_time_frac": totals.swap_s / span,
        "swap_exposed_frac": totals.swap_exposed_s / span,
        "swapped_blocks": totals.swapped_blocks,
        "kv_waste_frac": (max(0.0, 1.0 - totals.kv_token_time / totals.kv_used_slot_time)
                          if totals.kv_used_slot_time > 0 else 0.0),
        "num_steps": totals.num_steps,
        **({"by_priority": {str(p): _class_summary([r for r in done if r.priority == p])
                            for p in sorted({r.priority for r in done})}}
           if len({r.priority for r in done}) > 1 else {}),
    }


def _class_summary(done: list[RequestRecord]) -> dict:
    """What one priority class of finished requests saw."""
    ttft = [r.first_token - r.arrival for r in done]
    e2e = [r.finish - r.arrival for r in done]
    per_token = [(r.finish - r.arrival) / max(r.num_output, 1) for r in done]
    return {"num_finished": len(done), "ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99),
            "e2e_mean": _mean(e2e), "per_token_latency_mean": _mean(per_token),
            "per_token_latency_p95": _pct(per_token, 95), "max_gap": max((r.max_gap for r in done), default=None),
            "preempted_requests": sum(r.num_preemptions > 0 for r in done)}
