import gc

import pytest
from prometheus_client import CollectorRegistry

from services.common.gc_pauses import GcPauseMetrics, freeze_startup_heap


def _count(registry: CollectorRegistry, generation: str) -> float:
    return registry.get_sample_value("seawall_gc_pause_seconds_count", {"generation": generation}) or 0.0


@pytest.fixture
def registry():
    return CollectorRegistry()


def test_each_collection_is_timed_under_its_generation_until_closed(registry):
    metrics = GcPauseMetrics(registry)
    try:
        gc.collect(2)
        gc.collect(0)
        assert _count(registry, "2") == 1 and _count(registry, "0") == 1
        assert registry.get_sample_value("seawall_gc_pause_seconds_sum", {"generation": "2"}) > 0
    finally:
        metrics.close()
    gc.collect(2)
    assert _count(registry, "2") == 1
    assert metrics._on_gc not in gc.callbacks


def test_freezing_puts_live_objects_out_of_reach_and_reports_how_many(registry):
    GcPauseMetrics(registry).close()
    kept = [[i] for i in range(1000)]  # tracked containers, alive across the freeze
    try:
        frozen = freeze_startup_heap()
        assert frozen >= len(kept)
        assert registry.get_sample_value("seawall_gc_frozen_objects") == frozen
        assert not any(obj is kept[0] for obj in gc.get_objects(2))  # a full collection no longer walks them
    finally:
        gc.unfreeze()
    assert registry.get_sample_value("seawall_gc_frozen_objects") == 0
