"""Workloads: synthetic prompts, lengths from fixed values, Pareto tails and traces, the burst scenario."""

from __future__ import annotations

import dataclasses
import re

import pytest

from seawall.bench.arrivals import ArrivalSpec
from seawall.bench.workload import (
    WorkloadSpec,
    build,
    nominal_rate,
    parse_priority_mix,
    with_rate,
    without_bursts,
)
from services.common.errors import InvalidArgument


def test_fixed_workload_has_exact_lengths_and_valid_token_ids():
    wl = build(WorkloadSpec(num_requests=20, prompt_len=50, output_len=7, vocab_size=100))
    assert [len(r.prompt) for r in wl.requests] == [50] * 20
    assert {r.max_tokens for r in wl.requests} == {7}
    assert all(3 <= t < 100 for r in wl.requests for t in r.prompt)
    assert len({r.prompt for r in wl.requests}) == 20
    assert wl.num_output_tokens == 140


def test_same_seed_same_workload_and_salt_changes_only_the_prompts():
    spec = WorkloadSpec(arrivals=ArrivalSpec("gamma", rate=3.0, cv=2.0), num_requests=30, lengths="pareto")
    a, b = build(spec), build(spec)
    assert a == b
    salted = build(dataclasses.replace(spec, prompt_salt=1))
    assert [(r.arrival, r.max_tokens, len(r.prompt)) for r in salted.requests] == \
        [(r.arrival, r.max_tokens, len(r.prompt)) for r in a.requests]
    assert all(x.prompt != y.prompt for x, y in zip(salted.requests, a.requests, strict=True))


def test_pareto_outputs_have_a_long_tail_within_the_bounds():
    wl = build(WorkloadSpec(num_requests=2000, lengths="pareto", pareto_alpha=1.1, pareto_min=8,
                            max_output_len=400))
    outs = sorted(r.max_tokens for r in wl.requests)
    assert outs[0] >= 8 and outs[-1] == 400
    assert outs[len(outs) // 2] < 20 < outs[int(0.95 * len(outs))]


def test_trace_lengths_are_scaled_and_fit_the_context():
    wl = build(WorkloadSpec(num_requests=300, lengths="sharegpt", length_scale=0.5, max_model_len=1024))
    assert all(len(r.prompt) + r.max_tokens <= 1023 and r.max_tokens >= 1 for r in wl.requests)


def test_trace_timestamps_are_replayed_time_scaled_or_at_a_rate():
    base = WorkloadSpec(arrivals=ArrivalSpec("trace"), num_requests=50, lengths="azure-conv", length_scale=0.1)
    plain = build(base)
    half = build(dataclasses.replace(base, time_scale=0.5))
    assert plain.requests[0].arrival == 0.0
    assert [r.arrival for r in half.requests] == pytest.approx([r.arrival / 2 for r in plain.requests])
    fast = build(with_rate(base, 10.0))
    assert 49 / fast.requests[-1].arrival == pytest.approx(10.0)
    with pytest.raises(InvalidArgument, match="timestamped"):
        build(dataclasses.replace(base, lengths="sharegpt"))


def test_the_burst_scenario():
    spec = WorkloadSpec(kind="burst", steady_users=4, steady_output_len=100, burst_at=2.0, burst_size=3,
                        burst_prompt_len=500, burst_output_len=5, steady_ramp_s=0.4)
    wl = build(spec)
    steady = [r for r in wl.requests if r.role == "steady"]
    burst = [r for r in wl.requests if r.role == "burst"]
    assert [r.arrival for r in steady] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert {r.arrival for r in burst} == {2.0} and {len(r.prompt) for r in burst} == {500}
    assert wl.bursts == [(2.0, (4, 5, 6))]
    assert nominal_rate(spec) is None
    control = without_bursts(wl)  # the control run: the same steady users, same indices, no burst
    assert control.requests == steady and control.bursts == []
    cut = without_bursts(wl, {0: 40, 1: 500, 3: 41})  # cut where the burst's last gaps were; 2 is left out
    assert [(r.index, r.max_tokens) for r in cut.requests] == [(0, 40), (1, 100), (3, 41)]
    assert [r.prompt for r in cut.requests] == [steady[i].prompt for i in (0, 1, 3)]


def test_duration_bounds_the_workload():
    wl = build(WorkloadSpec(arrivals=ArrivalSpec("poisson", rate=10.0), duration=3.0))
    assert wl.requests[-1].arrival < 3.0 and len(wl.requests) == pytest.approx(30, abs=18)


def test_with_rate_keeps_the_pattern():
    spec = WorkloadSpec(arrivals=ArrivalSpec("bursts", burst_size=4, burst_interval=2.0), num_requests=12)
    assert nominal_rate(spec) == 2.0
    faster = build(with_rate(spec, 8.0))
    assert [r.arrival for r in faster.requests][::4] == [0.0, 0.5, 1.0]


def test_mooncake_sessions_share_prefixes():
    pytest.importorskip("seawall.workloads.multiturn")
    wl = build(WorkloadSpec(kind="mooncake", num_requests=40, block_tokens=8, time_scale=0.01))
    assert len(wl.requests) > 0 and all(r.session_id for r in wl.requests)
    assert all(len(r.prompt) + r.max_tokens <= 4096 for r in wl.requests)


def test_a_shared_prefix_starts_every_prompt_and_the_rest_is_each_requests_own():
    spec = WorkloadSpec(num_requests=6, prompt_len=20, output_len=3, shared_prefix_len=48, vocab_size=500)
    wl = build(spec)
    system = wl.requests[0].prompt[:48]
    assert {len(r.prompt) for r in wl.requests} == {68}
    assert all(r.prompt[:48] == system for r in wl.requests)
    assert len({r.prompt[48:] for r in wl.requests}) == 6
    assert "48-token system prompt" in wl.description
    # Salted runs (the next policy on one mesh) get another system prompt: no cache hits across runs.
    salted = build(dataclasses.replace(spec, prompt_salt=1))
    assert salted.requests[0].prompt[:48] != system
    # The context bounds the whole prompt; at least one token stays the request's own.
    short = build(dataclasses.replace(spec, max_model_len=40))
    assert all(len(r.prompt) + r.max_tokens <= 39 and r.prompt[:-1] == short.requests[0].prompt[:-1]
               for r in short.requests)
    assert len({r.prompt for r in short.requests}) == 6


def test_shared_prefix_groups_split_the_requests_in_arrival_order():
    spec = WorkloadSpec(arrivals=ArrivalSpec("bursts", burst_size=4, burst_interval=1.0), num_requests=12,
                        prompt_len=8, shared_prefix_len=32, shared_prefix_groups=3)
    wl = build(spec)
    systems = [r.prompt[:32] for r in wl.requests]
    assert [systems.index(s) for s in systems] == [0] * 4 + [4] * 4 + [8] * 4  # one system prompt per burst
    assert [r.arrival for r in wl.requests[::4]] == [0.0, 1.0, 2.0]
    assert "3 32-token system prompts" in wl.description


def test_a_shared_prefix_in_the_burst_scenario_is_the_burst_prompts_system_prompt():
    spec = WorkloadSpec(kind="burst", steady_users=3, burst_size=4, burst_prompt_len=30, shared_prefix_len=64)
    wl = build(spec)
    steady = [r for r in wl.requests if r.role == "steady"]
    burst = [r for r in wl.requests if r.role == "burst"]
    assert {len(r.prompt) for r in burst} == {94} and len({r.prompt[:64] for r in burst}) == 1
    assert {len(r.prompt) for r in steady} == {spec.steady_prompt_len}
    assert all(r.prompt[:64] != burst[0].prompt[:64] for r in steady)


def test_a_shared_prefix_is_refused_where_it_has_no_meaning():
    with pytest.raises(InvalidArgument, match="shared-prefix-len must be >= 0"):
        build(WorkloadSpec(shared_prefix_len=-1))
    with pytest.raises(InvalidArgument, match="shared-prefix-groups >= 1"):
        build(WorkloadSpec(shared_prefix_len=16, shared_prefix_groups=0))
    with pytest.raises(InvalidArgument, match="Mooncake"):
        build(WorkloadSpec(kind="mooncake", shared_prefix_len=16))


def test_a_priority_mix_gives_exact_shares_drawn_from_the_seed():
    spec = WorkloadSpec(num_requests=40, priority_mix=parse_priority_mix("-1:0.2, 2:0.25"))
    wl = build(spec)
    counts = {p: sum(r.priority == p for r in wl.requests) for p in (-1, 0, 2)}
    assert counts == {-1: 8, 0: 22, 2: 10}
    assert "8 at priority -1, 10 at priority 2" in wl.description
    # the same requests in each class for every run of the seed (every policy of a comparison), others for
    # another seed, and nothing else about the requests changes
    assert build(spec) == wl
    other = build(dataclasses.replace(spec, seed=1))
    assert [r.priority for r in other.requests] != [r.priority for r in wl.requests]
    plain = build(dataclasses.replace(spec, priority_mix=()))
    assert {r.priority for r in plain.requests} == {0}
    assert [dataclasses.replace(r, priority=0) for r in wl.requests] == plain.requests
    # the burst scenario's requests get classes too, and its control run keeps them
    burst = build(dataclasses.replace(spec, kind="burst", steady_users=6, burst_size=2, priority_mix=((-1, 0.5),)))
    assert sum(r.priority == -1 for r in burst.requests) == 4
    kept = {r.index: r.priority for r in without_bursts(burst).requests}
    assert kept == {r.index: r.priority for r in burst.requests if r.role == "steady"}


@pytest.mark.parametrize("text, message", [
    ("-1", "not PRIORITY:SHARE"), ("x:0.2", "not PRIORITY:SHARE"), ("-1:half", "not PRIORITY:SHARE"),
    ("-1:0.6,1:0.6", "together at most 1"), ("-1:0", "in (0, 1]"), ("0:0.5", "not 0"),
    ("1:0.2,1:0.3", "each priority once"),
])
def test_a_bad_priority_mix_says_what_to_fix(text, message):
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        build(WorkloadSpec(num_requests=4, priority_mix=parse_priority_mix(text)))


def test_lora_adapters_are_drawn_from_the_seed_the_same_for_every_build():
    spec = WorkloadSpec(num_requests=40, lora_names=("a", "b", "c"))
    models = [r.model for r in build(spec).requests]
    assert models == [r.model for r in build(spec).requests] and set(models) == {"a", "b", "c"}
    assert "3 LoRA adapters" in build(spec).description
    assert {r.model for r in build(WorkloadSpec(num_requests=5)).requests} == {""}
