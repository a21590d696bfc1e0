"""Workloads: when requests arrive and how long their prompts and outputs are.

A workload is a list of ``RequestSpec`` built from a **length source** and an **arrival process**:

* lengths: ``sharegpt`` (sampled), ``azure-conv`` and ``mooncake-conv`` (a contiguous window of the trace, in
  order), ``fixed`` (``prompt_len``/``output_len``), ``longtail`` (ShareGPT prompts, Pareto output lengths);
* arrivals: ``poisson``, ``gamma`` (coefficient of variation ``cv``; cv=1 is Poisson, larger is burstier),
  ``onoff`` (Poisson bursts of ``on_s`` seconds separated by ``off_s`` seconds of silence, same mean rate),
  ``burst`` (everything at t=0) and ``trace`` (the trace's own timestamps, rescaled to ``qps`` when given,
  else multiplied by ``time_scale``; only for traces that have timestamps).

The traces are the copies in ``bench/traces`` (see its README for provenance and licences); another
directory can be named with ``$SEAWALL_TRACE_DIR``. Only the rows a workload needs are read.
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import math
import os
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from services.common.errors import InvalidArgument, NotFound

TRACE_FILES = {
    "sharegpt": "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
    "mooncake-conv": "mooncake_conversation_trace.jsonl",
}
LENGTH_SOURCES = ("sharegpt", "azure-conv", "mooncake-conv", "fixed", "longtail")
ARRIVALS = ("poisson", "gamma", "onoff", "burst", "trace")
MOONCAKE_BLOCK = 512  # tokens per hash id in the Mooncake trace


@dataclass(frozen=True)
class RequestSpec:
    arrival: float  # seconds from the start of the run
    prompt_len: int
    output_len: int
    # Mooncake's prefix-block ids (512 tokens each): equal leading ids mean a shared prompt prefix.
    prefix_ids: tuple[int, ...] = ()
    priority: int = 0  # the request's priority (lower runs sooner; -1: a high-priority request)


@dataclass(frozen=True)
class TraceRow:
    prompt_len: int
    output_len: int
    timestamp: float | None = None  # seconds from the trace's first row
    prefix_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class WorkloadConfig:
    lengths: str = "sharegpt"
    arrival: str = "poisson"
    num_requests: int = 256
    qps: float | None = 1.0  # mean arrival rate; for ``trace`` None keeps the trace's rate (x time_scale)
    seed: int = 0
    cv: float = 1.0  # gamma arrivals: coefficient of variation of inter-arrival times
    on_s: float = 10.0  # onoff arrivals: burst length
    off_s: float = 30.0  # onoff arrivals: silence between bursts
    time_scale: float = 1.0  # trace arrivals without qps: multiply the trace's inter-arrival gaps by this
    trace_offset: int = 0  # first row of the window of a timestamped trace
    prompt_len: int = 512  # fixed lengths
    output_len: int = 128
    pareto_alpha: float = 1.2  # longtail outputs: Pareto shape (smaller: heavier tail)
    pareto_min: int = 8  # longtail outputs: the smallest output
    max_output_len: int = 2048  # longtail outputs are capped here
    max_total_len: int | None = None  # drop trace rows whose prompt + output exceed this
    max_prompt_len: int | None = None  # sharegpt/longtail: sample only prompts up to this long
    priority_mix: float = 0.0  # the fraction of requests of high priority (-1), drawn at random; the rest 0


def trace_dir() -> Path:
    env = os.environ.get("SEAWALL_TRACE_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "bench" / "traces"


def _trace_path(name: str) -> Path:
    path = trace_dir() / TRACE_FILES[name]
    if not path.is_file():
        raise NotFound(f"trace {name!r} not found at {path}; set $SEAWALL_TRACE_DIR to the directory holding "
                       f"{TRACE_FILES[name]} (the repository ships it in bench/traces)")
    return path


def read_trace(name: str, limit: int | None = None, offset: int = 0) -> list[TraceRow]:
    """Rows ``offset .. offset + limit`` of a trace, in file order (all rows when ``limit`` is None).

    Only those rows are parsed; timestamps are seconds from the trace's first row.
    """
    if name not in TRACE_FILES:
        raise InvalidArgument(f"unknown trace {name!r}; known: {', '.join(TRACE_FILES)}")
    stop = None if limit is None else offset + limit
    with _trace_path(name).open(newline="") as f:
        if name == "mooncake-conv":
            rows = []
            for line in itertools.islice(f, offset, stop):
                rec = json.loads(line)
                rows.append(TraceRow(int(rec["input_length"]), int(rec["output_length"]),
                                     rec["timestamp"] / 1000.0, tuple(rec.get("hash_ids", ()))))
            return rows
        reader = csv.DictReader(f)
        if name == "sharegpt":
            return [TraceRow(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                    for r in itertools.islice(reader, offset, stop)]
        first = None
        rows = []
        for r in itertools.islice(reader, offset, stop):
            ts = _azure_time(r["TIMESTAMP"])
            first = ts if first is None else first
            rows.append(TraceRow(int(r["ContextTokens"]), int(r["GeneratedTokens"]), ts))
        return [TraceRow(r.prompt_len, r.output_len, r.timestamp - first) for r in rows] if rows else []


def _azure_time(text: str) -> float:
    # "2023-11-16 18:15:46.6805900": seven fractional digits, one more than datetime parses.
    date, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(date).timestamp() + (float("0." + frac) if frac else 0.0)


@functools.lru_cache(maxsize=4)
def _all_rows(name: str) -> tuple[TraceRow, ...]:
    return tuple(read_trace(name))


def _positive(rows: list[TraceRow]) -> list[TraceRow]:
    """Trace rows the simulator can run: at least one prompt and one output token."""
    return [r for r in rows if r.prompt_len >= 1 and r.output_len >= 1]


def _lengths(cfg: WorkloadConfig, rng: random.Random) -> list[TraceRow]:
    n = cfg.num_requests
    if cfg.lengths == "fixed":
        return [TraceRow(cfg.prompt_len, cfg.output_len)] * n
    if cfg.lengths in ("sharegpt", "longtail"):
        limit = cfg.max_total_len or math.inf
        # longtail keeps ShareGPT's prompts and draws its own outputs, so only the prompt must leave room.
        pool = [r for r in _positive(list(_all_rows("sharegpt")))
                if (r.prompt_len < limit if cfg.lengths == "longtail" else r.prompt_len + r.output_len <= limit)
                and r.prompt_len <= (cfg.max_prompt_len or math.inf)]
        if not pool:
            raise InvalidArgument("no ShareGPT request fits --max-total-len/--max-prompt-len")
        rows = [pool[i] for i in _sample_indices(len(pool), n, rng)]
        if cfg.lengths == "longtail":
            rows = [TraceRow(r.prompt_len, int(min(_pareto(cfg, rng), limit - r.prompt_len))) for r in rows]
        return rows
    # Timestamped traces: a contiguous window, read lazily, skipping rows that cannot run.
    rows: list[TraceRow] = []
    offset = cfg.trace_offset
    while len(rows) < n:
        chunk = read_trace(cfg.lengths, limit=2 * (n - len(rows)) + 16, offset=offset)
        if not chunk:
            raise InvalidArgument(f"trace {cfg.lengths!r} has fewer than {n} usable rows after row "
                                  f"{cfg.trace_offset}")
        offset += len(chunk)
        rows.extend(r for r in _positive(chunk)
                    if cfg.max_total_len is None or r.prompt_len + r.output_len <= cfg.max_total_len)
    return rows[:n]


def _sample_indices(size: int, n: int, rng: random.Random) -> list[int]:
    if n <= size:
        return rng.sample(range(size), n)
    return [rng.randrange(size) for _ in range(n)]


def _pareto(cfg: WorkloadConfig, rng: random.Random) -> int:
    return min(cfg.max_output_len, math.ceil(cfg.pareto_min * rng.paretovariate(cfg.pareto_alpha)))


def _arrivals(cfg: WorkloadConfig, rows: list[TraceRow], rng: random.Random) -> list[float]:
    n = len(rows)
    if cfg.arrival == "burst":
        return [0.0] * n
    if cfg.arrival == "trace":
        if any(r.timestamp is None for r in rows):
            raise InvalidArgument(f"{cfg.lengths!r} has no timestamps; use --arrival poisson|gamma|onoff|burst")
        t0 = rows[0].timestamp
        times = [r.timestamp - t0 for r in rows]
        scale = cfg.time_scale
        if cfg.qps:
            span = times[-1] or 1.0
            scale = (n - 1) / span / cfg.qps if n > 1 else 1.0
        return [t * scale for t in times]
    if not cfg.qps or cfg.qps <= 0:
        raise InvalidArgument(f"--qps must be > 0 for {cfg.arrival} arrivals, got {cfg.qps}")
    if cfg.arrival == "poisson":
        gaps = [rng.expovariate(cfg.qps) for _ in range(n)]
    elif cfg.arrival == "gamma":
        if cfg.cv <= 0:
            raise InvalidArgument(f"--cv must be > 0, got {cfg.cv}")
        shape = 1.0 / cfg.cv**2
        gaps = [rng.gammavariate(shape, 1.0 / (cfg.qps * shape)) for _ in range(n)]
    elif cfg.arrival == "onoff":
        return _onoff(cfg, n, rng)
    else:
        raise InvalidArgument(f"unknown arrival process {cfg.arrival!r}; known: {', '.join(ARRIVALS)}")
    return list(itertools.accumulate(gaps))


def _onoff(cfg: WorkloadConfig, n: int, rng: random.Random) -> list[float]:
    """Poisson arrivals at qps·(on+off)/on during each on-period, none during off-periods."""
    if cfg.on_s <= 0 or cfg.off_s < 0:
        raise InvalidArgument(f"--on-s must be > 0 and --off-s >= 0, got {cfg.on_s}, {cfg.off_s}")
    rate = cfg.qps * (cfg.on_s + cfg.off_s) / cfg.on_s
    out, busy = [], 0.0  # busy: time elapsed inside on-periods
    for _ in range(n):
        busy += rng.expovariate(rate)
        period, within = divmod(busy, cfg.on_s)
        out.append(period * (cfg.on_s + cfg.off_s) + within)
    return out


def make_workload(cfg: WorkloadConfig) -> list[RequestSpec]:
    if cfg.lengths not in LENGTH_SOURCES:
        raise InvalidArgument(f"unknown workload {cfg.lengths!r}; known: {', '.join(LENGTH_SOURCES)}")
    if cfg.num_requests < 1:
        raise InvalidArgument(f"--num-requests must be >= 1, got {cfg.num_requests}")
    if not 0 <= cfg.priority_mix <= 1:
        raise InvalidArgument(f"--priority-mix is a fraction of the requests, in [0, 1]; got {cfg.priority_mix}")
    rng = random.Random(cfg.seed)
    rows = _lengths(cfg, rng)
    times = _arrivals(cfg, rows, rng)
    # Drawn from a generator of their own: the same lengths and arrivals with any mix.
    high = random.Random(f"{cfg.seed}/priority")
    return [RequestSpec(t, r.prompt_len, r.output_len, r.prefix_ids,
                        priority=-1 if cfg.priority_mix and high.random() < cfg.priority_mix else 0)
            for t, r in zip(times, rows, strict=True)]
