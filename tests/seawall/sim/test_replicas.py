"""Replicas behind one placement with live migration between them: a replica short of KV memory moves a
decode (its KV crossing the link) or a queued request to a peer with room instead of preempting, and every
request still produces every token."""

from __future__ import annotations

import dataclasses

import pytest

from seawall.sim.loop import SimConfig, Simulation, simulate
from seawall.sim.models import get_model
from seawall.sim.replicas import GBIT, ReplicaConfig, ReplicaSimulation, simulate_replicas
from seawall.sim.workloads import RequestSpec, WorkloadConfig, make_workload
from services.common.errors import InvalidArgument

# 20 blocks of 16 tokens a replica: two requests growing to 300 tokens each do not fit in one.
TIGHT = SimConfig("Mistral-7B", "A100-80GB", 1, "sarathi", num_gpu_blocks=20)


def _finished_cleanly(sim: ReplicaSimulation, specs: list[RequestSpec]) -> None:
    for rep in sim.reps:
        rep.core.check_integrity()
        assert not rep.core.has_work and not rep.core.handed_off and not rep.core.arriving
        assert rep.core.blocks.num_free == rep.core.blocks.num_blocks  # no block leaked by a move
    assert not sim.landings and not any(sim.waiting_room) and not sim.moving
    assert sorted(r.num_output for r in sim.records.values()) == sorted(s.output_len for s in specs)
    assert sum(len(rep.totals.tbt) for rep in sim.reps) == sum(s.output_len - 1 for s in specs)


def test_one_replica_is_the_single_replica_simulation():
    specs = make_workload(WorkloadConfig("longtail", "poisson", 120, 6.0, seed=3, max_prompt_len=1024,
                                         pareto_min=64))
    cfg = SimConfig("Llama-2-7B", "A40", 1, "sarathi", num_gpu_blocks=300)
    single = simulate(cfg, specs)
    replicas = simulate_replicas(cfg, ReplicaConfig(replicas=1), specs)
    assert {k: v for k, v in replicas.items() if k in single and k != "sim_wall_s"} == \
        {k: v for k, v in single.items() if k != "sim_wall_s"}
    assert single["preemptions"] > 0  # the run is not trivially empty of the events that matter


def test_arrivals_go_to_the_replica_with_the_fewest_tokens():
    specs = [RequestSpec(0.0, 200, 4), RequestSpec(0.0, 100, 4), RequestSpec(0.0, 50, 4)]
    sim = ReplicaSimulation(TIGHT, ReplicaConfig(replicas=2, migration_headroom=0), specs)
    for i, spec in enumerate(specs):
        sim._place(i, spec)
    assert sorted(sim.reps[0].core.requests) == ["r0"] and sorted(sim.reps[1].core.requests) == ["r1", "r2"]


def test_a_replica_short_of_memory_moves_a_decode_to_the_peer_with_room_instead_of_preempting():
    """Placement stacks the two long outputs on replica 0 (the short one goes to replica 1 and soon ends): 600
    tokens in 320 preempts without migration; with it, one of them moves and neither is preempted."""
    specs = [RequestSpec(0.0, 100, 200), RequestSpec(0.0, 100, 10), RequestSpec(0.0, 100, 200)]
    runs = {}
    for headroom in (0, 32):
        sim = ReplicaSimulation(TIGHT, ReplicaConfig(replicas=2, migration_headroom=headroom), specs)
        runs[headroom] = sim.run()
        _finished_cleanly(sim, specs)
    off, on = runs[0], runs[32]
    assert off["preemptions"] > 0 and off["migrations"] == 0
    assert on["preemptions"] == 0 and on["migrations"] == 1 and on["queued_moves"] == 0
    # The move pauses its stream for the copy of its blocks over the link, and that pause is one of its gaps.
    rc = ReplicaConfig()
    block_bytes = 16 * get_model("Mistral-7B").kv_bytes_per_token
    pause = rc.migration_latency_s + on["migrated_blocks"] * block_bytes / (rc.migration_gbps * GBIT)
    assert 0 < on["migrated_blocks"] <= 20
    assert on["migration_pause_max"] == pytest.approx(pause)
    assert on["tbt_max"] >= pause
    assert on["e2e_mean"] < off["e2e_mean"]


def test_a_replica_getting_short_copies_a_decode_ahead_and_its_move_pulls_only_the_rest():
    """The stacked pair again, with prefix caching (the copy is kept as the receiver's prefix cache): while
    replica 0 is getting short the mover's full blocks cross the link with the request still decoding, so the
    move that follows, once the replica is short, pulls only what it computed since."""
    specs = [RequestSpec(0.0, 100, 200), RequestSpec(0.0, 100, 10), RequestSpec(0.0, 100, 200)]
    cfg = dataclasses.replace(TIGHT, enable_prefix_caching=True)
    runs = {}
    for copy in (False, True):
        sim = ReplicaSimulation(cfg, ReplicaConfig(replicas=2, migration_precopy=copy), specs)
        runs[copy] = sim.run()
        _finished_cleanly(sim, specs)
        assert not sim.precopies
    stop, ahead = runs[False], runs[True]
    assert stop["precopied_blocks"] == 0 and ahead["precopied_blocks"] >= 4
    assert stop["migrations"] == ahead["migrations"] == 1 and stop["preemptions"] == ahead["preemptions"] == 0
    # What was copied ahead is not pulled again: the same blocks travel, fewer of them while the request waits.
    assert ahead["migrated_blocks"] + ahead["precopied_blocks"] == stop["migrated_blocks"]
    rc = ReplicaConfig()
    block_bytes = 16 * get_model("Mistral-7B").kv_bytes_per_token
    assert ahead["migration_pause_max"] == pytest.approx(
        rc.migration_latency_s + ahead["migrated_blocks"] * block_bytes / (rc.migration_gbps * GBIT))
    assert ahead["migration_pause_max"] < stop["migration_pause_max"]


def test_copying_ahead_under_memory_pressure_finishes_every_request_and_leaks_no_block():
    specs = make_workload(WorkloadConfig("longtail", "poisson", 150, 12.0, seed=1, max_prompt_len=512,
                                         pareto_min=64, pareto_alpha=1.0))
    cfg = SimConfig("Llama-2-7B", "A40", 1, "sarathi", num_gpu_blocks=200, enable_prefix_caching=True)
    sim = ReplicaSimulation(cfg, ReplicaConfig(replicas=3, migration_precopy=True), specs)
    m = sim.run()
    _finished_cleanly(sim, specs)
    assert m["num_finished"] == 150 and m["migrations"] > 0 and m["precopied_blocks"] > 0 and not sim.precopies


def test_a_replica_short_of_memory_gives_a_queued_request_to_a_peer_with_room():
    """r0 (290 tokens) fills replica 0, r1 is on replica 1 briefly; r2 lands on replica 0 (fewer tokens) and
    waits there for blocks. Once replica 1 is free, r2 moves there without any copy (r0 is too big to)."""
    specs = [RequestSpec(0.0, 290, 20), RequestSpec(0.0, 300, 2), RequestSpec(0.001, 100, 5)]
    sim = ReplicaSimulation(TIGHT, ReplicaConfig(replicas=2), specs)
    m = sim.run()
    _finished_cleanly(sim, specs)
    assert m["queued_moves"] == 1 and m["migrations"] == 0 and m["migrated_blocks"] == 0
    # It finished before r0 did: it did not wait on replica 0 for r0's blocks.
    assert sim.records["r2"].finish < sim.records["r0"].finish


@pytest.mark.parametrize("policy", ["sarathi", "fastserve", "vllm"])
def test_replicas_under_memory_pressure_finish_every_request_and_leak_no_block(policy):
    specs = make_workload(WorkloadConfig("longtail", "poisson", 150, 12.0, seed=1, max_prompt_len=512,
                                         pareto_min=64, pareto_alpha=1.0))
    cfg = SimConfig("Llama-2-7B", "A40", 1, policy, num_gpu_blocks=200)
    sim = ReplicaSimulation(cfg, ReplicaConfig(replicas=3), specs)
    m = sim.run()
    _finished_cleanly(sim, specs)
    assert m["num_finished"] == 150 and m["migrations"] > 0
    assert m["replicas"] == 3 and 0 < m["busy_frac"] <= 1


def test_arrivals_keep_away_from_a_replica_holding_a_high_priority_request():
    """r0 (high priority, 100 tokens) on replica 0, r1 (200) on replica 1: r2 goes to replica 0, the fewer
    tokens, unless replica 0 keeps 256 tokens for r0 (Llumnix's headroom for it)."""
    specs = [RequestSpec(0.0, 100, 4, priority=-1), RequestSpec(0.0, 200, 4), RequestSpec(0.0, 50, 4)]
    for headroom, where in ((0, 0), (256, 1)):
        sim = ReplicaSimulation(TIGHT, ReplicaConfig(replicas=2, priority_headroom=headroom), specs)
        for i, spec in enumerate(specs):
            sim._place(i, spec)
        assert "r2" in sim.reps[where].core.requests and sim.reps[0].core.requests["r0"].priority == -1


def test_a_replica_keeps_room_for_its_high_priority_request_by_moving_a_normal_one_out():
    """r0 (high priority) and r2 (30 + 200) grow out of replica 0 (r1's 300-token prompt keeps r2 away from
    replica 1, and ends soon): r2 moves out, not r0; with 64 tokens kept for r0 it moves sooner, and r0 runs
    alone sooner."""
    specs = [RequestSpec(0.0, 100, 200, priority=-1), RequestSpec(0.0, 300, 5), RequestSpec(0.0, 30, 200)]
    moved_at = {}
    for headroom in (0, 64):
        sim = ReplicaSimulation(TIGHT, ReplicaConfig(replicas=2, priority_headroom=headroom), specs)
        moves = []
        move = sim._move
        sim._move = lambda src, dst, rid, now, move=move, moves=moves: (moves.append((rid, now)), move(src, dst, rid, now))
        m = sim.run()
        _finished_cleanly(sim, specs)
        assert m["preemptions"] == 0 and [rid for rid, _ in moves] == ["r2"]
        assert set(m["by_priority"]) == {"-1", "0"} and m["by_priority"]["-1"]["num_finished"] == 1
        moved_at[headroom] = moves[0][1]
    assert moved_at[64] < moved_at[0]


def test_a_replica_config_that_cannot_run_is_refused():
    with pytest.raises(InvalidArgument, match="--replicas must be >= 1"):
        ReplicaConfig(replicas=0)
    with pytest.raises(InvalidArgument, match="--migration-headroom must be >= 0"):
        ReplicaConfig(migration_headroom=-1)
    with pytest.raises(InvalidArgument, match="--priority-headroom must be >= 0"):
        ReplicaConfig(priority_headroom=-1)
    with pytest.raises(InvalidArgument, match="--migration-gbps must be > 0"):
        ReplicaConfig(migration_gbps=0)
    with pytest.raises(InvalidArgument, match=r"receiver's prefix cache: turn prefix caching on \(--prefix-caching\)"):
        ReplicaSimulation(TIGHT, ReplicaConfig(replicas=2, migration_precopy=True), [])


def test_each_replica_is_a_full_simulation_of_the_config():
    sim = ReplicaSimulation(TIGHT, ReplicaConfig(replicas=3), [RequestSpec(0.0, 10, 2)])
    assert all(isinstance(rep, Simulation) and rep.num_gpu_blocks == 20 for rep in sim.reps)
    assert len({id(rep.core) for rep in sim.reps}) == 3 and all(rep.records is sim.records for rep in sim.reps)


def test_a_prompt_no_replica_has_room_for_gets_it_by_a_decode_moving_out():
    """De-fragmentation: one 96-token decode on each replica leaves 13 free blocks on each, and a 220-token
    prompt needs 14. The prompt's tokens count against its replica's freeness, so a decode moves out to make
    room for it; without migration it waits for a decode to finish."""
    specs = [RequestSpec(0.0, 96, 60), RequestSpec(0.0, 96, 60), RequestSpec(0.05, 220, 20)]
    ttft = {}
    for headroom in (0, 32):
        sim = ReplicaSimulation(TIGHT, ReplicaConfig(replicas=2, migration_headroom=headroom), specs)
        m = sim.run()
        _finished_cleanly(sim, specs)
        assert m["preemptions"] == 0 and m["queued_moves"] == 0 and (m["migrations"] > 0) == (headroom > 0)
        r2 = sim.records["r2"]
        ttft[headroom] = r2.first_token - r2.arrival
        assert (r2.first_token < sim.records["r0"].finish) == (headroom > 0)
    assert ttft[32] < ttft[0] / 5
