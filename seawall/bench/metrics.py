"""Per-request timelines seen by the client, and their summaries.

Times are seconds on the client's clock, from the start of the run. A request is *sent* when the client
opens its stream (its scheduled ``arrival``, or later under ``--max-concurrency``); each streamed chunk is
stamped when it arrives. The mesh streams one response per step, so a chunk is normally one token; when a
chunk carries several tokens (a slow client), its gap counts once, as ``vllm bench serve`` does.

* TTFT: sent → first chunk. TBT: every gap between consecutive chunks of a request, pooled over requests, so a
  stall of the running decodes shows in the tail. E2E: sent → last chunk. Queueing delay: as the server
  reports it (arrival at the scheduler → first step that ran the request; gRPC only).
* Around bursts (``bursts``: when each began, and which requests came with it): the requests *decoding when a burst arrived* are those with a
  token before the burst and another after it. Their gaps before the first burst are the steady state
  (``steady_tbt_*``); their gaps that overlap a burst's window (from the burst until the last of its requests
  has its first token) are ``burst_tbt_*``; ``burst_tbt_ratio`` is the burst p99 over the steady p50
  (``burst_tbt_ratio_p99``: over the steady p99); ``max_stall`` is their longest gap ending after a burst began.
  Without bursts, ``max_stall`` is the longest gap of any request. ``control_metrics`` reads a second run
  without the bursts at the burst's own (request, token) positions: ``burst_tbt_ratio_control``.
* Goodput: requests per second (over the run's makespan) that finished, with TTFT <= ``slo_ttft`` and the
  p99 of their own gaps <= ``slo_tbt`` (each when given); ``goodput_frac`` is their share of the requests.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestRecord:
    index: int
    arrival: float  # scheduled send time
    prompt_len: int
    max_tokens: int
    role: str = ""
    sent: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # when each chunk with tokens arrived
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each chunk
    queue_delay: float | None = None  # server-reported, seconds
    finish_reason: str | None = None
    error: str | None = None
    priority: int = 0  # as sent (lower runs sooner)

    @property
    def num_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.ok and self.sent is not None else None

    @property
    def e2e(self) -> float | None:
        return self.chunk_times[-1] - self.sent if self.ok and self.sent is not None else None

    def gaps(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    def as_dict(self) -> dict:
        gaps = self.gaps()
        return {"index": self.index, "role": self.role, "priority": self.priority, "arrival": self.arrival,
                "sent": self.sent,
                "prompt_len": self.prompt_len, "output_tokens": self.num_tokens, "ttft": self.ttft,
                "e2e": self.e2e, "tbt_mean": float(np.mean(gaps)) if gaps else None,
                "max_gap": max(gaps) if gaps else None, "queue_delay": self.queue_delay,
                "finish_reason": self.finish_reason, "error": self.error}


@dataclass
class StatsSample:
    """One GetStats poll during a run."""

    t: float
    num_preemptions: int
    blocks_used: int  # device blocks referenced by live sequences, all workers
    blocks_total: int
    host_blocks_used: int
    num_running: int
    num_waiting: int
    num_swapped: int
    prefix_queried_blocks: int = 0  # full prompt blocks looked up in the prefix caches since start, all workers
    prefix_hit_blocks: int = 0  # of those, served from a cache
    draft_tokens: int = 0  # speculative decoding: draft tokens verified since start, all workers
    accepted_draft_tokens: int = 0  # of those, kept
    migrations: int = 0  # running requests moved with their KV to a worker with more room, since start
    queued_moves: int = 0  # requests without KV yet taken over by a worker with room, since start


def pct(values, q: float) -> float | None:
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _dist(prefix: str, values) -> dict:
    return {f"{prefix}_p50": pct(values, 50), f"{prefix}_p90": pct(values, 90), f"{prefix}_p99": pct(values, 99),
            f"{prefix}_mean": mean(values)}


def meets_slo(rec: RequestRecord, slo_ttft: float | None, slo_tbt: float | None) -> bool:
    if not rec.ok:
        return False
    if slo_ttft is not None and rec.ttft > slo_ttft:
        return False
    gaps = rec.gaps()
    return slo_tbt is None or not gaps or pct(gaps, 99) <= slo_tbt


Burst = tuple[float, tuple[int, ...]]  # (when it began, indices of the requests that arrived with it)


def _burst_windows(records: list[RequestRecord], bursts: list[Burst]) -> list[tuple[float, float]]:
    """(start, end) of each burst: from the burst until the last of its requests has its first token."""
    first = {r.index: r.chunk_times[0] for r in records if r.ok}
    out = []
    for b, members in bursts:
        ends = [first[i] for i in members if i in first]
        out.append((b, max(ends, default=b)))
    return out


def _gaps_around(records: list[RequestRecord], windows: list[tuple[float, float]]):
    """The gaps of the requests decoding when a burst arrived: (steady, during, stalls, their indices).
    ``during`` holds (request index, token position, gap): the position is the count of tokens the request
    had once the gap ended, so a run without the bursts can be read at the same tokens."""
    first_burst = windows[0][0]
    steady, during, stalls, decoding = [], [], [], set()
    for r in records:
        if not r.ok:
            continue
        t = r.chunk_times
        hit = [(b, e) for b, e in windows if t[0] < b < t[-1]]
        if not hit:
            continue
        decoding.add(r.index)
        for a, z, pos in zip(t, t[1:], _token_ends(r)[1:], strict=False):
            if z <= first_burst:
                steady.append(z - a)
            if any(z > b and a < e for b, e in hit):
                during.append((r.index, pos, z - a))
            if any(z > b for b, _ in hit):
                stalls.append(z - a)
    return steady, during, stalls, decoding


def _token_ends(rec: RequestRecord) -> list[int]:
    return list(itertools.accumulate(rec.chunk_tokens))


def _during(records: list[RequestRecord], bursts: list[Burst]) -> list[tuple[int, int, float]]:
    """(request index, token position, gap) of each gap that overlapped a burst; [] without bursts."""
    if not bursts:
        return []
    return _gaps_around(records, _burst_windows(records, bursts))[1]


def burst_metrics(records: list[RequestRecord], bursts: list[Burst]) -> dict:
    """Steady-state TBT, TBT during the bursts and the longest stall of the requests decoding at a burst."""
    done = [r for r in records if r.ok]
    if not bursts:
        all_gaps = [g for r in done for g in r.gaps()]
        return {"max_stall": max(all_gaps) if all_gaps else None, "steady_tbt_p50": None, "steady_tbt_p99": None,
                "burst_tbt_p99": None, "burst_tbt_ratio": None, "burst_tbt_ratio_p99": None,
                "num_decoding_at_burst": 0}
    windows = _burst_windows(records, bursts)
    steady, during, stalls, decoding = _gaps_around(records, windows)
    during_gaps = [g for _, _, g in during]
    steady_p50, steady_p99 = pct(steady, 50), pct(steady, 99)
    burst_p99 = pct(during_gaps, 99)
    return {"max_stall": max(stalls) if stalls else None, "steady_tbt_p50": steady_p50,
            "steady_tbt_p99": steady_p99, "burst_tbt_p50": pct(during_gaps, 50), "burst_tbt_p99": burst_p99,
            "burst_tbt_ratio": _ratio(burst_p99, steady_p50), "burst_tbt_ratio_p99": _ratio(burst_p99, steady_p99),
            "num_decoding_at_burst": len(decoding), "burst_windows": [[b, e] for b, e in windows]}


def control_metrics(records: list[RequestRecord], control: list[RequestRecord], bursts: list[Burst]) -> dict:
    """The burst's gaps against the same requests' gaps at the same tokens in a run without the bursts
    (``control``: the workload minus the burst's requests, on the same mesh).

    Why: the steady state before a burst is measured at shorter contexts than the gaps during it, and on a
    CPU a decode step's time grows with its context (16 decodes of the built-in model: 3.0 ms at 150
    tokens, 6.0 ms at 900), so "before" understates what the same decodes take at the burst's tokens.
    ``control_tbt_p50``/``_p99`` are the control run's gaps at exactly the (request, token) positions of the
    burst's gaps; ``burst_tbt_ratio_control`` is the burst p99 over their p50 (``_p99``: over their p99)."""
    none = {"control_tbt_p50": None, "control_tbt_p99": None, "control_gaps": 0,
            "burst_tbt_ratio_control": None, "burst_tbt_ratio_control_p99": None}
    during = _during(records, bursts)
    at = {r.index: dict(zip(_token_ends(r)[1:], r.gaps(), strict=True)) for r in control if r.ok}
    matched = [at[i][pos] for i, pos, _ in during if pos in at.get(i, {})]
    if not matched:
        return none
    burst_p99 = pct([g for _, _, g in during], 99)
    c50, c99 = pct(matched, 50), pct(matched, 99)
    return {"control_tbt_p50": c50, "control_tbt_p99": c99, "control_gaps": len(matched),
            "burst_tbt_ratio_control": _ratio(burst_p99, c50), "burst_tbt_ratio_control_p99": _ratio(burst_p99, c99)}


CONTROL_MARGIN_TOKENS = 8


def control_tokens(records: list[RequestRecord], bursts: list[Burst]) -> dict[int, int]:
    """How far a control run must go: for each request decoding at a burst, its last token whose gap
    overlapped a burst's window, plus a margin. The requests reach those tokens within a step or two of
    each other (the window's end), so with the margin none leaves the batch before every other one is
    past its own: the control's steps up to them are those of an uncut run."""
    out: dict[int, int] = {}
    for index, pos, _ in _during(records, bursts):
        out[index] = max(out.get(index, 0), pos + CONTROL_MARGIN_TOKENS)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(records: list[RequestRecord], *, bursts: list[Burst] = (), slo_ttft: float | None = None,
              slo_tbt: float | None = None, stats: list[StatsSample] = ()) -> dict:
    done = [r for r in records if r.ok]
    ttft = [r.ttft for r in done]
    e2e = [r.e2e for r in done]
    gaps = [g for r in done for g in r.gaps()]
    per_token = [r.e2e / r.num_tokens for r in done if r.num_tokens]
    delays = [r.queue_delay for r in done if r.queue_delay is not None]
    sent = [r.sent for r in records if r.sent is not None]
    start = min(sent, default=0.0)
    end = max((r.chunk_times[-1] for r in done), default=start)
    span = max(end - start, 1e-9)
    tokens = sum(r.num_tokens for r in records)
    good = sum(meets_slo(r, slo_ttft, slo_tbt) for r in records)
    out = {
        "num_requests": len(records), "num_finished": len(done),
        "num_errors": sum(r.error is not None for r in records),
        **_dist("ttft", ttft), **_dist("tbt", gaps), "tbt_max": max(gaps) if gaps else None,
        **_dist("e2e", e2e), "per_token_latency_mean": mean(per_token),
        **_dist("queue_delay", delays),
        "throughput_tok_s": tokens / span, "throughput_req_s": len(done) / span, "output_tokens": tokens,
        "makespan_s": span, "goodput": good / span, "goodput_frac": good / len(records) if records else 0.0,
        "slo_ttft": slo_ttft, "slo_tbt": slo_tbt,
    }
    out.update(burst_metrics(records, list(bursts)))
    out.update(stats_summary(list(stats)))
    classes = sorted({r.priority for r in records})
    if len(classes) > 1:
        out["by_priority"] = {str(p): class_summary([r for r in records if r.priority == p], slo_ttft, slo_tbt)
                              for p in classes}
    return out


def class_summary(records: list[RequestRecord], slo_ttft: float | None = None, slo_tbt: float | None = None) -> dict:
    """The latencies of one class of a run's requests (e.g. one priority): what its clients saw, without the
    run-wide figures (throughput, stalls, KV) that a class does not own."""
    done = [r for r in records if r.ok]
    good = sum(meets_slo(r, slo_ttft, slo_tbt) for r in records)
    return {"num_requests": len(records), "num_finished": len(done),
            **_dist("ttft", [r.ttft for r in done]), **_dist("tbt", [g for r in done for g in r.gaps()]),
            **_dist("e2e", [r.e2e for r in done]),
            **_dist("queue_delay", [r.queue_delay for r in done if r.queue_delay is not None]),
            "goodput_frac": good / len(records) if records else 0.0}


def stats_summary(stats: list[StatsSample]) -> dict:
    if not stats:
        return {"preemptions": None, "kv_blocks_peak": None, "kv_blocks_total": None, "host_blocks_peak": None,
                "max_waiting": None, "max_swapped": None, "prefix_hit_blocks": None, "prefix_hit_rate": None,
                "draft_tokens": None, "draft_acceptance": None, "migrations": None, "queued_moves": None}
    first, last = stats[0], stats[-1]
    # Counters since the mesh started: the run's share is the difference (clamped: a worker that died takes
    # its counts with it).
    queried = max(0, last.prefix_queried_blocks - first.prefix_queried_blocks)
    hits = max(0, last.prefix_hit_blocks - first.prefix_hit_blocks)
    drafts = max(0, last.draft_tokens - first.draft_tokens)
    kept = max(0, last.accepted_draft_tokens - first.accepted_draft_tokens)
    return {"preemptions": last.num_preemptions - first.num_preemptions,
            "kv_blocks_peak": max(s.blocks_used for s in stats), "kv_blocks_total": last.blocks_total,
            "host_blocks_peak": max(s.host_blocks_used for s in stats),
            "max_waiting": max(s.num_waiting for s in stats), "max_swapped": max(s.num_swapped for s in stats),
            "prefix_hit_blocks": hits, "prefix_hit_rate": min(1.0, hits / queried) if queried else None,
            "draft_tokens": drafts, "draft_acceptance": min(1.0, kept / drafts) if drafts else None,
            "migrations": max(0, last.migrations - first.migrations),
            "queued_moves": max(0, last.queued_moves - first.queued_moves)}


def paired(records: list[RequestRecord], baseline: list[RequestRecord]) -> dict:
    """Request-by-request E2E against the same requests of a baseline run (same workload)."""
    base = {r.index: r.e2e for r in baseline if r.ok}
    ratios = [r.e2e / base[r.index] for r in records if r.ok and base.get(r.index)]
    if not ratios:
        return {"worst_e2e_ratio": None, "num_worse_1_5x": None}
    return {"worst_e2e_ratio": max(ratios), "median_e2e_ratio": pct(ratios, 50),
            "num_worse_1_5x": sum(x > 1.5 for x in ratios)}


RATIO_KEYS = ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "max_stall", "e2e_mean", "throughput_tok_s",
              "goodput", "burst_tbt_p99")


def ratios(results: dict[str, dict], baseline: str) -> dict[str, dict]:
    """Each result's figures divided by the baseline's (``x / baseline``)."""
    base = results[baseline]
    out = {}
    for name, res in results.items():
        out[name] = {k: (res[k] / base[k] if res.get(k) is not None and base.get(k) else None) for k in RATIO_KEYS}
    return out
