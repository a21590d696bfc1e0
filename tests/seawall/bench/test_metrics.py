"""Summaries on hand-made timelines: percentiles, stalls around a burst, goodput, stats, comparisons."""

from __future__ import annotations

import pytest

from seawall.bench.metrics import (
    CONTROL_MARGIN_TOKENS,
    RequestRecord,
    StatsSample,
    control_metrics,
    control_tokens,
    meets_slo,
    paired,
    pct,
    ratios,
    summarize,
)


def rec(index, sent, times, role="", error=None, queue_delay=None, priority=0):
    return RequestRecord(index, sent, 10, len(times), role, sent=sent, chunk_times=list(times),
                         chunk_tokens=[1] * len(times), error=error, queue_delay=queue_delay, priority=priority)


def test_percentiles_interpolate_like_numpy():
    assert pct([1, 2, 3, 4], 50) == 2.5
    assert pct([5.0], 99) == 5.0
    assert pct([], 50) is None


def test_ttft_tbt_e2e_throughput():
    records = [rec(0, 0.0, [0.5, 0.6, 0.7, 0.8], queue_delay=0.1), rec(1, 1.0, [1.2, 1.5, 2.0])]
    s = summarize(records)
    assert s["ttft_p50"] == pytest.approx(0.35)
    assert s["tbt_mean"] == pytest.approx((0.1 * 3 + 0.3 + 0.5) / 5)
    assert s["tbt_max"] == pytest.approx(0.5)
    assert s["e2e_mean"] == pytest.approx((0.8 + 1.0) / 2)
    assert s["queue_delay_p50"] == pytest.approx(0.1)
    assert s["throughput_tok_s"] == pytest.approx(7 / 2.0)
    assert s["throughput_req_s"] == pytest.approx(1.0)
    assert s["max_stall"] == pytest.approx(0.5)  # no bursts: the longest gap of any request


def test_stalls_of_requests_decoding_when_the_burst_arrived():
    steady = [0.1 * k for k in range(1, 11)]  # one token every 100 ms until t = 1.0 (the burst)
    a = rec(0, 0.0, steady + [1.8, 1.9, 2.0], role="steady")  # stalled 800 ms by the burst
    b = rec(1, 0.0, steady + [1.1, 1.2], role="steady")
    late = rec(2, 1.5, [1.6, 1.7], role="steady")  # started after the burst: not "decoding at the burst"
    burst = rec(3, 1.0, [1.7, 2.5], role="burst")  # its first token ends the burst's window at 1.7
    s = summarize([a, b, late, burst], bursts=[(1.0, (3,))])
    assert s["num_decoding_at_burst"] == 2
    assert s["max_stall"] == pytest.approx(0.8)
    assert s["steady_tbt_p50"] == pytest.approx(0.1)
    assert s["burst_windows"] == [[1.0, pytest.approx(1.7)]]
    # gaps overlapping (1.0, 1.7): a's 1.0 -> 1.8 and b's 1.0 -> 1.1 and 1.1 -> 1.2
    assert s["burst_tbt_p50"] == pytest.approx(0.1)
    assert s["burst_tbt_p99"] == pytest.approx(pct([0.8, 0.1, 0.1], 99))
    assert s["burst_tbt_ratio"] == pytest.approx(s["burst_tbt_p99"] / 0.1)


def test_the_control_run_is_read_at_the_bursts_own_request_and_token_positions():
    # Gaps grow with the context: 100 ms early on, 200 ms by the time the burst comes. Before it the steady
    # state looks like 100 ms; the control run (no burst) shows what these very tokens take without one.
    burst_run = rec(0, 0.0, [0.1, 0.2, 0.3, 0.5, 0.9, 1.1], role="steady")  # tokens 1-6
    burst_run.chunk_tokens = [1, 1, 1, 1, 1, 1]
    burst = rec(1, 0.4, [0.95], role="burst")  # window (0.4, 0.95): the gaps ending at tokens 4, 5, 6 overlap it
    control = rec(0, 0.0, [0.1, 0.2, 0.3, 0.5, 0.7, 0.9], role="steady")
    other = rec(7, 0.0, [0.1, 0.9])  # another request's gaps are never used
    c = control_metrics([burst_run, burst], [control, other], bursts=[(0.4, (1,))])
    assert c["control_gaps"] == 3  # the control's gaps ending at tokens 4, 5 and 6: 200 ms each
    assert c["control_tbt_p50"] == pytest.approx(0.2) and c["control_tbt_p99"] == pytest.approx(0.2)
    burst_p99 = pct([0.2, 0.4, 0.2], 99)
    assert c["burst_tbt_ratio_control"] == pytest.approx(burst_p99 / 0.2)
    # the control only has to reach token 6 (+ a margin): the last one whose gap overlapped the window
    assert control_tokens([burst_run, burst], bursts=[(0.4, (1,))]) == {0: 6 + CONTROL_MARGIN_TOKENS}
    assert control_tokens([burst_run, burst], bursts=[]) == {}
    s = summarize([burst_run, burst], bursts=[(0.4, (1,))])
    assert s["steady_tbt_p50"] == pytest.approx(0.1)  # before the burst: shorter contexts
    assert s["burst_tbt_ratio"] == pytest.approx(burst_p99 / 0.1)


def test_a_chunk_of_several_tokens_is_matched_by_the_token_it_ends_on():
    run = RequestRecord(0, 0.0, 10, 4, "steady", sent=0.0, chunk_times=[0.1, 0.2, 0.6], chunk_tokens=[1, 2, 1])
    burst = rec(1, 0.3, [0.55], role="burst")
    control = RequestRecord(0, 0.0, 10, 4, "steady", sent=0.0, chunk_times=[0.1, 0.2, 0.3, 0.4],
                            chunk_tokens=[1, 1, 1, 1])
    c = control_metrics([run, burst], [control], bursts=[(0.3, (1,))])
    # the burst's gap 0.2 -> 0.6 ends on token 4; the control's gap ending on token 4 is 0.3 -> 0.4
    assert c["control_gaps"] == 1 and c["control_tbt_p50"] == pytest.approx(0.1)
    assert control_metrics([run, burst], [], bursts=[(0.3, (1,))])["burst_tbt_ratio_control"] is None


def test_goodput_counts_requests_within_both_slos():
    fast = rec(0, 0.0, [0.1, 0.2, 0.3])
    slow_start = rec(1, 0.0, [2.0, 2.1, 2.2])
    stalled = rec(2, 0.0, [0.1, 1.1, 1.2])
    failed = rec(3, 0.0, [], error="Unavailable: gone")
    assert meets_slo(fast, 1.0, 0.2) and not meets_slo(slow_start, 1.0, 0.2)
    assert not meets_slo(stalled, 1.0, 0.2) and meets_slo(stalled, 1.0, None)
    s = summarize([fast, slow_start, stalled, failed], slo_ttft=1.0, slo_tbt=0.2)
    assert s["num_finished"] == 3 and s["num_errors"] == 1
    assert s["goodput_frac"] == pytest.approx(0.25)
    assert s["goodput"] == pytest.approx(1 / 2.2)
    assert summarize([fast, slow_start])["goodput_frac"] == 1.0  # no SLO: every finished request counts


def test_stats_give_preemptions_during_the_run_and_peak_blocks():
    stats = [StatsSample(0.0, 5, 10, 100, 0, 1, 0, 0), StatsSample(0.1, 7, 60, 100, 8, 4, 3, 1),
             StatsSample(0.2, 9, 20, 100, 0, 2, 0, 0)]
    s = summarize([rec(0, 0.0, [0.1])], stats=stats)
    assert s["preemptions"] == 4 and s["kv_blocks_peak"] == 60 and s["host_blocks_peak"] == 8
    assert s["kv_blocks_total"] == 100 and s["max_waiting"] == 3
    assert summarize([rec(0, 0.0, [0.1])])["preemptions"] is None


def test_prefix_hits_are_the_runs_share_of_the_meshs_counters():
    stats = [StatsSample(0.0, 0, 0, 100, 0, 0, 0, 0, prefix_queried_blocks=40, prefix_hit_blocks=10),
             StatsSample(0.1, 0, 0, 100, 0, 0, 0, 0, prefix_queried_blocks=90, prefix_hit_blocks=40),
             StatsSample(0.2, 0, 0, 100, 0, 0, 0, 0, prefix_queried_blocks=140, prefix_hit_blocks=85)]
    s = summarize([rec(0, 0.0, [0.1])], stats=stats)
    assert s["prefix_hit_blocks"] == 75 and s["prefix_hit_rate"] == pytest.approx(0.75)
    idle = [StatsSample(0.0, 0, 0, 100, 0, 0, 0, 0, 40, 10)] * 2  # nothing looked up during the run
    assert summarize([rec(0, 0.0, [0.1])], stats=idle)["prefix_hit_rate"] is None
    # A worker that died took its counters along: never a negative share.
    gone = [StatsSample(0.0, 0, 0, 100, 0, 0, 0, 0, 90, 40), StatsSample(0.1, 0, 0, 50, 0, 0, 0, 0, 30, 5)]
    assert summarize([rec(0, 0.0, [0.1])], stats=gone)["prefix_hit_blocks"] == 0


def test_draft_acceptance_is_the_runs_share_of_the_meshs_counters():
    stats = [StatsSample(0.0, 0, 0, 100, 0, 0, 0, 0, draft_tokens=50, accepted_draft_tokens=10),
             StatsSample(0.2, 0, 0, 100, 0, 0, 0, 0, draft_tokens=250, accepted_draft_tokens=160)]
    s = summarize([rec(0, 0.0, [0.1])], stats=stats)
    assert s["draft_tokens"] == 200 and s["draft_acceptance"] == pytest.approx(0.75)
    assert summarize([rec(0, 0.0, [0.1])], stats=stats[:1] * 2)["draft_acceptance"] is None  # no speculation


def test_migrations_are_the_runs_share_of_the_meshs_counter():
    stats = [StatsSample(0.0, 0, 0, 100, 0, 0, 0, 0, migrations=3, queued_moves=1),
             StatsSample(0.2, 0, 0, 100, 0, 0, 0, 0, migrations=8, queued_moves=4)]
    s = summarize([rec(0, 0.0, [0.1])], stats=stats)
    assert s["migrations"] == 5 and s["queued_moves"] == 3
    assert summarize([rec(0, 0.0, [0.1])])["migrations"] is None


def test_paired_and_ratios():
    base = [rec(0, 0.0, [1.0]), rec(1, 0.0, [2.0])]
    other = [rec(0, 0.0, [2.0]), rec(1, 0.0, [1.0])]
    assert paired(other, base) == {"worst_e2e_ratio": 2.0, "median_e2e_ratio": 1.25, "num_worse_1_5x": 1}
    results = {"a": summarize(base), "b": summarize(other)}
    r = ratios(results, "a")
    assert r["a"]["e2e_mean"] == 1.0 and r["b"]["e2e_mean"] == 1.0
    assert r["b"]["ttft_p99"] == pytest.approx(pct([2.0, 1.0], 99) / pct([1.0, 2.0], 99))


def test_latencies_per_priority_class_when_the_run_has_several():
    records = [rec(0, 0.0, [0.1, 0.2], priority=-1), rec(1, 0.0, [0.3, 0.5], priority=-1),
               rec(2, 0.0, [1.0, 1.1, 1.2]), rec(3, 0.0, [2.0, 2.5], error="boom")]
    s = summarize(records, slo_ttft=0.5)
    urgent, normal = s["by_priority"]["-1"], s["by_priority"]["0"]
    assert (urgent["num_requests"], urgent["num_finished"]) == (2, 2)
    assert urgent["ttft_p50"] == pytest.approx(0.2) and urgent["e2e_mean"] == pytest.approx(0.35)
    assert urgent["tbt_p50"] == pytest.approx(0.15) and urgent["goodput_frac"] == 1.0
    assert (normal["num_requests"], normal["num_finished"]) == (2, 1)
    assert normal["ttft_p50"] == pytest.approx(1.0) and normal["goodput_frac"] == 0.0
    assert "by_priority" not in summarize([rec(0, 0.0, [0.1]), rec(1, 0.0, [0.2])])
