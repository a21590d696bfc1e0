"""Arrival processes: when each request of a benchmark is sent, in seconds from the start of the run.

``poisson``, ``gamma`` (coefficient of variation ``cv`` of the gaps; 1 is Poisson, larger is burstier, as
``vllm bench serve --burstiness 1/cv²``) and ``onoff`` (Poisson arrivals during ``on_s``-second periods
separated by ``off_s`` seconds of silence, the same mean rate) are the simulator's own
(``seawall.sim.workloads``), so a live run and a simulated run with the same seed send at the same times.
This module adds ``bursts`` (``burst_size`` requests at once every ``burst_interval`` seconds; the rate
follows) and ``burst`` (everything at t = 0). Trace timestamps are handled in ``workload``.

For every process, the same seed at another rate gives the same pattern stretched in time (common random
numbers), which keeps capacity probes and rate sweeps comparable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from seawall.sim.workloads import WorkloadConfig, make_workload
from services.common.errors import InvalidArgument

PROCESSES = ("poisson", "gamma", "onoff", "bursts", "burst", "trace")


@dataclass(frozen=True)
class ArrivalSpec:
    process: str = "poisson"
    rate: float = 4.0  # mean requests/s (poisson, gamma, onoff)
    cv: float = 1.0  # gamma: coefficient of variation of the gaps
    on_s: float = 2.0  # onoff: length of an on-period
    off_s: float = 4.0  # onoff: silence between on-periods
    burst_size: int = 8  # bursts: requests per burst
    burst_interval: float = 5.0  # bursts: seconds between bursts (the first at t = 0)


def arrival_times(spec: ArrivalSpec, n: int, seed: int = 0) -> list[float]:
    """``n`` non-decreasing arrival times for ``spec``."""
    if n < 1:
        raise InvalidArgument(f"need at least one request, got {n}")
    if spec.process == "burst":
        return [0.0] * n
    if spec.process == "bursts":
        if spec.burst_size < 1 or spec.burst_interval < 0:
            raise InvalidArgument("--burst-size must be >= 1 and --burst-interval >= 0")
        return [(i // spec.burst_size) * spec.burst_interval for i in range(n)]
    if spec.process in ("poisson", "gamma", "onoff"):
        if spec.rate <= 0:
            raise InvalidArgument(f"--rate must be > 0 for {spec.process} arrivals, got {spec.rate}")
        cfg = WorkloadConfig(lengths="fixed", arrival=spec.process, num_requests=n, qps=spec.rate, seed=seed,
                             cv=spec.cv, on_s=spec.on_s, off_s=spec.off_s)
        return [r.arrival for r in make_workload(cfg)]
    raise InvalidArgument(f"unknown arrival process {spec.process!r}; known: {', '.join(PROCESSES)}")


def burst_groups(spec: ArrivalSpec, times: list[float]) -> list[tuple[float, tuple[int, ...]]]:
    """The bursts of ``times``, for the stall metrics: (when the burst began, indices of its requests), for
    every burst (or on-period) with an arrival; empty for processes without bursts."""
    if spec.process in ("burst", "bursts"):
        key = {t: t for t in times}
    elif spec.process == "onoff":
        period = spec.on_s + spec.off_s
        key = {t: (t // period) * period for t in times}
    else:
        return []
    groups: dict[float, list[int]] = {}
    for i, t in enumerate(times):
        groups.setdefault(key[t], []).append(i)
    return [(min(times[i] for i in idx), tuple(idx)) for _, idx in sorted(groups.items())]


def count_for_duration(spec: ArrivalSpec, duration: float) -> int:
    """Enough requests that a ``duration``-second run of ``spec`` is not cut short by running out of them."""
    if spec.process == "bursts":
        return spec.burst_size * (int(duration // spec.burst_interval) + 1) if spec.burst_interval > 0 \
            else spec.burst_size
    if spec.process in ("poisson", "gamma", "onoff"):
        mean = spec.rate * duration
        return int(mean + 6 * math.sqrt(max(mean, 1.0)) * max(spec.cv, 1.0)) + 16
    raise InvalidArgument(f"--duration needs a rate-driven arrival process, not {spec.process!r}")


def describe(times: list[float]) -> dict:
    """The measured rate (requests/s) and coefficient of variation of the gaps of ``times``."""
    if len(times) < 2:
        return {"rate": None, "cv": None, "span_s": 0.0}
    gaps = np.diff(np.asarray(times, dtype=float))
    span = float(times[-1] - times[0])
    mean = float(gaps.mean())
    return {"rate": (len(times) - 1) / span if span > 0 else math.inf,
            "cv": float(gaps.std()) / mean if mean > 0 else None, "span_s": span}
