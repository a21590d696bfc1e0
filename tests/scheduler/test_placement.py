"""Placement by token load (papers.md §4.5): plain numbers in, the chosen worker out."""

from __future__ import annotations

import pytest

from services.scheduler.placement import (
    DECODE_SLACK,
    READ_HORIZON_S,
    EngineLoad,
    ReadMeter,
    StepMeter,
    pick_decode,
    pick_prefill,
    pick_read_side,
    recompute_sooner,
)


def _names(e: EngineLoad | None) -> str | None:
    return None if e is None else e.name


# --- prefill ---------------------------------------------------------------------------------------------------


def test_prefill_goes_to_the_fewest_tokens():
    engines = [EngineLoad("a", 900, seqs=1), EngineLoad("b", 300, seqs=5), EngineLoad("c", 600)]
    assert _names(pick_prefill(engines)) == "b"  # tokens, not requests
    assert pick_prefill([]) is None


def test_prefill_never_goes_over_the_cap_and_waits_when_all_are():
    engines = [EngineLoad("a", 500), EngineLoad("b", 2000)]
    assert _names(pick_prefill(engines, max_tokens=1000)) == "a"
    assert _names(pick_prefill([EngineLoad("a", 1500, read_queue_s=0.0), EngineLoad("b", 1200)],
                               max_tokens=1300)) == "b"
    assert pick_prefill([EngineLoad("a", 1500), EngineLoad("b", 2000)], max_tokens=1000) is None


def test_prefill_prefers_a_node_whose_storage_reads_drain_soon():
    backed_up = EngineLoad("a", 100, read_queue_s=READ_HORIZON_S + 1)
    idle_soon = EngineLoad("b", 800, read_queue_s=READ_HORIZON_S)
    assert _names(pick_prefill([backed_up, idle_soon])) == "b"
    unmeasured = EngineLoad("c", 900)  # no read has finished there: nothing says it is backed up
    assert _names(pick_prefill([backed_up, unmeasured])) == "c"
    # Every node backed up: the fewest tokens among them.
    assert _names(pick_prefill([backed_up, EngineLoad("d", 50, read_queue_s=10.0)])) == "d"


def test_prefill_counts_its_own_prefix_cache_as_work_spared():
    engines = [EngineLoad("a", 400), EngineLoad("b", 600, cached_tokens=300)]
    assert _names(pick_prefill(engines)) == "b"


# --- decode ----------------------------------------------------------------------------------------------------


def test_decode_goes_to_the_group_with_the_fewest_tokens():
    engines = [EngineLoad("a1", 100, group="A", free_tokens=10_000), EngineLoad("a2", 900, group="A", free_tokens=10_000),
               EngineLoad("b1", 400, group="B", free_tokens=10_000), EngineLoad("b2", 400, group="B", free_tokens=10_000)]
    # Group A holds 1000 tokens, B 800: B, although a1 alone is the lightest worker.
    assert _names(pick_decode(engines, 50)).startswith("b")


def test_decode_within_the_mean_picks_the_fewest_requests():
    group = [EngineLoad("x", 1000, seqs=9, free_tokens=5000), EngineLoad("y", 1040, seqs=2, free_tokens=5000),
             EngineLoad("z", 3000, seqs=1, free_tokens=5000)]
    # limit = 1.05 * (100 + 5040) / 3 = 1799: x and y stay within, z does not; y has fewer requests.
    assert DECODE_SLACK * (100 + 5040) / 3 == pytest.approx(1799)
    assert _names(pick_decode([EngineLoad(e.name, e.tokens, e.seqs, free_tokens=e.free_tokens, group="g")
                               for e in group], 100)) == "y"


def test_decode_skips_groups_without_room():
    engines = [EngineLoad("small", 0, free_tokens=100), EngineLoad("big1", 500, group="B", free_tokens=9000),
               EngineLoad("big2", 700, group="B", free_tokens=50)]
    assert _names(pick_decode(engines, 50)) == "small"
    assert _names(pick_decode(engines, 400)) == "big1"  # the lighter group cannot hold it; in B only big1 can
    assert pick_decode(engines, 10_000) is None


def test_decode_over_the_mean_picks_the_fewest_tokens_among_those_with_room():
    group = [EngineLoad("x", 1000, seqs=1, free_tokens=50, group="g"),
             EngineLoad("y", 1000, seqs=1, free_tokens=5000, group="g")]
    # 1.05 * (4000 + 2000) / 2 = 3150 < 1000 + 4000: nobody stays within; x has no room for 4000 tokens.
    assert _names(pick_decode(group, 4000)) == "y"
    assert pick_decode([EngineLoad("x", 0, free_tokens=10, group="g")], 4000) is None  # waits for room
    assert pick_decode([], 10) is None


def test_a_lone_decode_worker_with_room_is_chosen():
    assert _names(pick_decode([EngineLoad("only", 7000, seqs=30, free_tokens=200)], 200)) == "only"


# --- read side ---------------------------------------------------------------------------------------------------


def test_the_read_goes_to_the_shorter_storage_queue_ties_to_pe_read():
    assert pick_read_side(prefill_queue=512, decode_queue=256) == "de-read"
    assert pick_read_side(prefill_queue=256, decode_queue=512) == "pe-read"
    assert pick_read_side(prefill_queue=256, decode_queue=256) == "pe-read"
    assert pick_read_side(prefill_queue=256, decode_queue=None) == "pe-read"


def test_read_meter_measures_the_rate_while_busy():
    m = ReadMeter()
    assert m.rate(0.0) is None and m.queue_s(0.0) == 0.0
    m.start(100, now=10.0)
    m.start(100, now=10.5)
    assert m.queue_s(11.0) is None  # nothing finished: no rate yet
    m.finish(100, now=11.0)
    assert m.rate(11.0) == pytest.approx(100.0)  # 100 tokens in 1 busy second
    m.finish(100, now=12.0)
    assert m.rate(12.0) == pytest.approx(100.0) and m.queued == 0
    m.start(300, now=50.0)  # the idle 38 s do not count
    assert m.rate(50.0) == pytest.approx(100.0)
    assert m.queue_s(50.0) == pytest.approx(3.0)
    m.finish(300, now=52.0, ok=False)  # a failed read adds time, not tokens
    assert m.rate(52.0) == pytest.approx(200 / 4)


# --- load or recompute -------------------------------------------------------------------------------------------


def test_step_meter_fits_fixed_and_per_token_costs():
    m = StepMeter()
    assert m.line() is None and m.seconds(100, 64) is None
    m.step(256, 0.010 + 256 * 0.001)
    m.step(256, 0.010 + 256 * 0.001)
    assert m.line() is None  # one step size: fixed and per-token costs cannot be told apart
    for tokens in (16, 100, 256, 40):
        m.step(tokens, 0.010 + tokens * 0.001)
    fixed, per_token = m.line()
    assert fixed == pytest.approx(0.010) and per_token == pytest.approx(0.001)
    # 600 tokens in chunks of 256: three steps.
    assert m.seconds(600, 256) == pytest.approx(3 * 0.010 + 600 * 0.001)


def test_step_meter_follows_a_change_in_speed():
    m = StepMeter(memory=0.5)
    for tokens in (10, 200) * 5:
        m.step(tokens, tokens * 0.002)
    for tokens in (10, 200) * 20:
        m.step(tokens, tokens * 0.001)
    assert m.line()[1] == pytest.approx(0.001, rel=1e-3)


def test_recompute_only_when_measured_to_end_sooner():
    # Reading 1000 tokens at 500 tok/s behind 2 s of queued reads: done in 4 s.
    assert recompute_sooner(1000, read_queue_s=2.0, read_rate=500.0, backlog_s=1.0, recompute_s=1.5)
    assert not recompute_sooner(1000, read_queue_s=2.0, read_rate=500.0, backlog_s=3.0, recompute_s=1.5)
    assert not recompute_sooner(1000, read_queue_s=0.0, read_rate=5000.0, backlog_s=0.0, recompute_s=0.5)
    # Anything unmeasured: load.
    assert not recompute_sooner(1000, read_queue_s=None, read_rate=500.0, backlog_s=0.0, recompute_s=0.1)
    assert not recompute_sooner(1000, read_queue_s=2.0, read_rate=None, backlog_s=0.0, recompute_s=0.1)
    assert not recompute_sooner(1000, read_queue_s=2.0, read_rate=500.0, backlog_s=0.0, recompute_s=None)
