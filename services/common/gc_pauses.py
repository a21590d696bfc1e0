"""Python's garbage collector in long-running service processes: keep its pauses short, and measure them.

A full (generation 2) collection walks every object the collector tracks. After imports, model loading and
server start-up a service holds 190-300k of them (the decode worker of the built-in model: ~300k), almost all
alive until exit, and each full collection walked them all: 100-134 ms in the decode worker and the scheduler
of a live mesh (bench/README.md, "Garbage-collector pauses"). The worker's pause stalls every decode it runs;
the scheduler's stalls every stream. ``gc.freeze()`` once start-up is over moves those objects to a permanent
generation that collections skip, so a full collection only walks what was made since (the approach of
Instagram's servers and of vLLM's engine core). Cycles made later are still collected.
"""

from __future__ import annotations

import gc
import time

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily

PAUSE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def freeze_startup_heap() -> int:
    """Collects once, then moves every object alive now out of the collector's reach. Call it when the process
    has finished starting (model loaded, servers up), just before it serves. Returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauseMetrics:
    """``seawall_gc_pause_seconds{generation}``: how long each collection stopped the process, and
    ``seawall_gc_frozen_objects``: how many objects ``freeze_startup_heap`` put out of its reach."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pause_seconds = Histogram("seawall_gc_pause_seconds", "Wall time of one garbage collection",
                                       ("generation",), registry=registry, buckets=PAUSE_BUCKETS)
        self._by_generation = [self.pause_seconds.labels(str(g)) for g in range(3)]
        self._started = 0.0
        registry.register(_FrozenCollector())
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        # The collector never starts a collection while one runs, so each "start" pairs with the next "stop".
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._by_generation[info["generation"]].observe(time.perf_counter() - self._started)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


class _FrozenCollector:
    def collect(self):
        yield GaugeMetricFamily("seawall_gc_frozen_objects", "Objects moved out of the garbage collector's reach "
                                "at start-up (gc.freeze)", value=gc.get_freeze_count())


def after_startup(registry: CollectorRegistry) -> GcPauseMetrics:
    """What a service process calls once it is up: freeze the start-up heap, then time every collection."""
    freeze_startup_heap()
    return GcPauseMetrics(registry)
