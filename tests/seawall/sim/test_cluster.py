"""Cluster-scale DualPath model: timelines, read paths, byte conservation, placement, the reproduction rows."""

from __future__ import annotations

import json

import pytest

from seawall.cli import main
from seawall.sim import reproduce
from seawall.sim.cluster import (
    GBIT,
    ClusterConfig,
    ClusterSimulation,
    ClusterWorkload,
    Link,
    build_workload,
    simulate_cluster,
    transfer,
)
from seawall.sim.cost_model import StepShape
from seawall.workloads.multiturn import AgenticConfig, MooncakeReplayConfig, MultiTurnRequest, TokenSeq
from services.common.errors import InvalidArgument

# Small and storage-bound: 32K-shaped sessions on 1P2D with a slow storage NIC.
SMALL = ClusterWorkload("agentic", AgenticConfig.preset("32k", sessions=24, turns=16))
SLOW = ClusterConfig(storage_gbps=100.0)


def _run(cfg=SLOW, wl=SMALL, **kw):
    import dataclasses

    reqs, hits, closed = build_workload(wl)
    sim = ClusterSimulation(dataclasses.replace(cfg, **kw), reqs, hits, closed)
    return sim, sim.run()


def test_links_queue_fifo_and_a_transfer_holds_both_ends():
    a, b = Link("a", 10.0), Link("b", 5.0, log=True)
    assert transfer(0.0, 50.0, [a]) == 5.0
    assert transfer(1.0, 10.0, [a, b]) == 7.0  # waits for a, then runs at b's rate
    assert a.free_at == b.free_at == 7.0 and b.log == [(5.0, 7.0, 10.0)]
    assert a.queued_bytes(6.0) == 10.0 and transfer(3.0, 0.0, [a]) == 3.0


def test_one_request_follows_the_timeline():
    req = MultiTurnRequest("r", "s", 1, TokenSeq([("p", 1000)]), 10, 0.0)
    sim = ClusterSimulation(ClusterConfig(), [req], [0], closed_loop=False)
    m = sim.run()
    kvb = sim.model.kv_bytes_per_token
    prefill = sim.cost.step_time(StepShape.of([(1000, 0)]))
    h2d = 1000 * kvb / (400 * GBIT)
    assert m["ttft_mean"] == pytest.approx(prefill)
    dt = sim.cost.step_time(StepShape(1, 1, 1, 0, 0.0, 0, 1, 1001 + 4))  # mid-run context of 9 decode steps
    assert m["ttst_mean"] == pytest.approx(prefill + h2d + dt)
    assert m["e2e_mean"] == pytest.approx(prefill + h2d + 9 * dt)
    assert m["bytes"]["storage_read"] == 0 and m["bytes"]["h2d"] == 1000 * kvb


def test_requests_joining_a_running_batch_decode_exactly_their_tokens():
    reqs = [MultiTurnRequest(f"r{i}", f"s{i}", 1, TokenSeq([(f"p{i}", 2000 + 50 * i)]), 20 + 7 * i, 0.013 * i)
            for i in range(12)]
    sim = ClusterSimulation(ClusterConfig(prefill_nodes=1, decode_nodes=1, gpus_per_node=1), reqs, [0] * 12,
                            closed_loop=False)
    m = sim.run()
    assert m["num_finished"] == 12
    single = sim.cost.step_time(StepShape(1, 1, 1, 0, 0.0, 0, 1, 2000))
    for j in sim.jobs:
        assert j.decoded == j.output - 1 and j.t_second > j.t_join
        assert (j.t_finish - j.t_join) >= (j.output - 1) * single * 0.99  # never faster than running alone


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("p", "d"), [(1, 1), (1, 2), (2, 1)])
def test_dual_is_never_worse_than_pe_read_when_storage_bound(seed, p, d):
    import dataclasses

    wl = dataclasses.replace(SMALL, agentic=dataclasses.replace(SMALL.agentic, seed=seed))
    jct = {pol: _run(SLOW, wl, prefill_nodes=p, decode_nodes=d, read_policy=pol)[1]["jct_s"]
           for pol in ("pe-read", "dual", "oracle")}
    assert jct["oracle"] <= jct["dual"] <= jct["pe-read"]


def test_dual_beats_pe_read_clearly_on_a_storage_bound_run():
    basic, dual = (_run(read_policy=pol)[1] for pol in ("pe-read", "dual"))
    assert max(basic["snic_util"].values()) > 0.8  # storage-bound
    assert basic["jct_s"] / dual["jct_s"] > 1.4
    assert basic["ttft_mean"] > dual["ttft_mean"] and 0.2 < dual["de_read_frac"] < 0.8


def test_de_read_moves_storage_traffic_to_the_decode_nodes():
    _, pe = _run(read_policy="pe-read")
    de_sim, de = _run(read_policy="de-read")
    assert pe["snic_read_bytes"]["pe0"] > 0 and pe["snic_read_bytes"]["de0"] == pe["snic_read_bytes"]["de1"] == 0
    assert de["snic_read_bytes"]["pe0"] == 0 and de["snic_read_bytes"]["de0"] > 0 and de["snic_read_bytes"]["de1"] > 0
    assert sum(pe["snic_read_bytes"].values()) == pytest.approx(sum(de["snic_read_bytes"].values()))
    assert de["de_read_frac"] == 1 and pe["de_read_frac"] == 0
    # DE-read sends the hit KV decode -> prefill and only the new KV back; PE-read sends it all forward.
    assert de["bytes"]["de_to_pe"] > 0 and pe["bytes"]["de_to_pe"] == 0
    assert pe["bytes"]["pe_to_de"] == pytest.approx(pe["bytes"]["h2d"])
    misses = sum(j.miss for j in de_sim.jobs) * de_sim.kvb
    assert de["bytes"]["pe_to_de"] == pytest.approx(misses) and misses < 0.1 * de["bytes"]["h2d"]


@pytest.mark.parametrize("policy", ["pe-read", "de-read", "dual"])
def test_bytes_are_conserved(policy):
    sim, m = _run(read_policy=policy)
    kvb = sim.kvb
    jobs = sim.jobs
    assert m["num_finished"] == len(jobs) and m["rejected"] == 0
    hit_pe = sum(j.hit for j in jobs if j.side == "pe") * kvb
    hit_de = sum(j.hit for j in jobs if j.side == "de") * kvb
    b = m["bytes"]
    assert sum(m["snic_read_bytes"].values()) == pytest.approx(b["storage_read"]) == pytest.approx(hit_pe + hit_de)
    assert sum(n.snic.bytes for n in sim.nodes if n.kind == "pe") == pytest.approx(hit_pe)
    assert b["pe_local_load"] == pytest.approx(hit_pe) and b["de_to_pe"] == pytest.approx(hit_de)
    # Every request's whole prompt KV reaches its decode engine once, by either path.
    assert b["h2d"] == pytest.approx(sum(j.prompt for j in jobs) * kvb)
    assert b["pe_to_de"] + b["de_to_pe"] == pytest.approx(b["h2d"])  # hit + miss forward, or hit back + miss
    assert b["storage_write"] == pytest.approx(sum(j.miss + j.output for j in jobs) * kvb)
    # Every buffer and every KV slot is given back.
    assert all(abs(n.dram_used) < 1 for n in sim.nodes) and all(e.kv_used == 0 and e.tok == 0 for e in sim.des)
    assert all(e.tok == 0 and e.seq == 0 for e in sim.pes)
    assert all(n.dram_peak <= n.dram_cap for n in sim.nodes)


def test_turns_of_a_session_run_one_after_another():
    sim, m = _run(SLOW, read_policy="dual")
    by_id = {j.req.request_id: j for j in sim.jobs}
    for j in sim.jobs:
        assert j.t_first <= j.t_join <= j.t_finish and j.decoded == j.output - 1
        if j.req.prev_request_id:
            assert j.release >= by_id[j.req.prev_request_id].t_finish
    assert m["hit_rate"] > 0.9 and m["num_sessions"] == 24


def test_round_robin_alternates_the_read_side_and_balances_worse():
    _, rr = _run(read_policy="dual", placement="round-robin")
    _, load = _run(read_policy="dual")
    assert rr["de_read_frac"] == pytest.approx(0.5, abs=0.01)
    assert rr["snic_max_avg_total"] == pytest.approx(1.5, abs=0.1)  # 1 PE node takes half of 3 nodes' reads
    assert load["snic_max_avg"] < rr["snic_max_avg"]


def test_mooncake_replay_runs_open_loop_on_the_trace_times():
    wl = ClusterWorkload("mooncake-conv", mooncake=MooncakeReplayConfig(limit=150, time_scale=0.05))
    sim, m = _run(ClusterConfig(), wl, read_policy="dual")
    assert m["num_finished"] == 150 and 0 < m["hit_rate"] < 0.5
    assert all(j.release == j.req.arrival_s for j in sim.jobs)


def test_small_dram_buffers_hold_work_back_but_everything_finishes():
    sim, m = _run(SLOW, dram_gb=20.0, read_policy="dual")
    assert m["num_finished"] == len(sim.jobs)
    assert all(n.dram_peak <= 20e9 for n in sim.nodes)


def test_requests_too_big_are_rejected_and_bad_configs_say_what_to_fix():
    big = MultiTurnRequest("big", "s", 1, TokenSeq([("p", 500_000)]), 10, 0.0)
    ok = MultiTurnRequest("ok", "t", 1, TokenSeq([("q", 100)]), 10, 0.0)
    m = ClusterSimulation(ClusterConfig(), [big, ok], [0, 0], closed_loop=False).run()
    assert m["rejected"] == 1 and m["num_finished"] == 1
    with pytest.raises(InvalidArgument, match="read-policy"):
        ClusterSimulation(ClusterConfig(read_policy="both"), [ok], [0])
    with pytest.raises(InvalidArgument, match="tp"):
        ClusterSimulation(ClusterConfig(tp=3), [ok], [0])
    with pytest.raises(InvalidArgument, match="unknown cluster workload"):
        simulate_cluster(ClusterConfig(), ClusterWorkload("sharegpt"))


def test_reproduction_rows_produce_numbers(monkeypatch):
    monkeypatch.setattr(reproduce, "DP_AGENTS", 24)
    monkeypatch.setattr(reproduce, "DP_PD_AGENTS", 12)
    monkeypatch.setattr(reproduce, "DP_PRESET", "32k")
    monkeypatch.setattr(reproduce, "DP_TURNS", 6)
    monkeypatch.setattr(reproduce, "_DP_CACHE", {})
    rows = {r["id"]: r for r in reproduce.run_reproductions(["dualpath-offline-jct", "dualpath-snic-balance",
                                                            "dualpath-pd-ratio"])}
    assert set(rows) == {"dualpath-offline-jct", "dualpath-snic-balance", "dualpath-pd-ratio"}
    assert rows["dualpath-offline-jct"]["paper"] == 1.87 and rows["dualpath-offline-jct"]["ours"] > 1
    assert rows["dualpath-snic-balance"]["paper"] == 1.18 and rows["dualpath-snic-balance"]["ours"] >= 1
    assert rows["dualpath-pd-ratio"]["ours"] >= 1
    assert "oracle" in rows["dualpath-offline-jct"]["note"] and "round robin" in rows["dualpath-snic-balance"]["note"]


def test_cli_dualpath_and_workload(tmp_path, capsys):
    out = tmp_path / "dp.json"
    assert main(["sim", "dualpath", "--prefill", "1", "--decode", "2", "--storage-gbps", "100",
                 "--read-policy", "pe-read", "dual", "--preset", "32k", "--sessions", "8", "--turns", "4",
                 "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["read_policy"] for r in runs] == ["pe-read", "dual"] and runs[0]["num_finished"] == 32
    text = capsys.readouterr().out
    assert "JCT pe-read / dual" in text and "storage-NIC utilisation" in text
    one = tmp_path / "one.json"
    assert main(["sim", "dualpath", "--workload", "mooncake-conv", "--num-requests", "40", "--time-scale", "0.01",
                 "--per-request", "--json", str(one)]) == 0
    data = json.loads(one.read_text())
    assert data["workload"] == "mooncake-conv" and len(data["requests"]) == 40
    wl = tmp_path / "w.jsonl"
    assert main(["sim", "workload", "--sessions", "2", "--turns", "5", "--scale", "0.0625", "--out", str(wl)]) == 0
    assert len(wl.read_text().splitlines()) == 10
    assert "prefix hit rate" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["sim", "dualpath", "--read-policy", "nope"])
    with pytest.raises(SystemExit):
        main(["sim", "dualpath", "--prefill", "0"])
    assert "argument --prefill: expected a whole number >= 1, got '0'" in capsys.readouterr().err


def test_a_float8_kv_cache_halves_what_a_turn_loads_from_storage():
    """--kv-cache-dtype fp8 in the cluster model: a token's KV is half the bytes, so the storage NICs that
    DualPath balances carry about half the load (here 0.24 busy on average against 0.45), reads wait less and
    the same sessions finish sooner."""
    _, wide = _run()
    _, narrow = _run(kv_cache_dtype="fp8")
    assert 2 * narrow["kv_bytes_per_token"] == wide["kv_bytes_per_token"]
    assert narrow["decode_kv_tokens_per_engine"] > 1.9 * wide["decode_kv_tokens_per_engine"]
    assert sum(narrow["snic_util"].values()) < 0.6 * sum(wide["snic_util"].values())
    assert narrow["read_wait_mean"] < wide["read_wait_mean"] and narrow["jct_s"] < wide["jct_s"]
