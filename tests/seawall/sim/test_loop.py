"""The event loop drives the real scheduler core: every request finishes, metrics agree with each other, and
the policies differ where the papers say they do."""

from __future__ import annotations

import json

import pytest

from seawall.sim import loop, reproduce
from seawall.sim.cost_model import MEASURED_FORMAT
from seawall.sim.loop import PolicyUnavailable, SimConfig, Simulation, available_policies, simulate
from seawall.sim.workloads import RequestSpec, WorkloadConfig, make_workload
from services.common.errors import InvalidArgument


def _small(n=60, qps=4.0, seed=0):
    return make_workload(WorkloadConfig("sharegpt", "poisson", n, qps, seed=seed, max_total_len=2048))


@pytest.mark.parametrize("policy", available_policies())
def test_every_policy_finishes_every_request_with_consistent_metrics(policy):
    specs = _small()
    sim = Simulation(SimConfig("Mistral-7B", "A100-80GB", 1, policy, num_gpu_blocks=2000), specs)
    m = sim.run()
    sim.core.check_integrity()
    assert not sim.core.has_work
    assert m["num_finished"] == m["num_requests"] == len(specs)
    assert all(r.num_output == r.output_len for r in sim.records.values())
    assert len(sim.totals.tbt) == sum(s.output_len - 1 for s in specs)  # one gap per token after the first
    assert 0 < m["ttft_p50"] <= m["e2e_p50"] and m["ttft_p99"] <= m["e2e_p99"]
    assert m["tbt_p50"] <= m["tbt_p99"] <= m["tbt_max"]
    assert m["throughput_tok_s"] == pytest.approx(sum(s.output_len for s in specs) / m["makespan_s"])
    assert 0 <= m["queueing_frac"] < 1 and 0 <= m["kv_waste_frac"] < 0.05
    assert 1 <= m["max_concurrent_seqs"] <= 128
    assert m["sched_delay_p50"] <= m["ttft_p50"]


def test_a_tight_pool_preempts_and_still_finishes():
    sim = Simulation(SimConfig("Mistral-7B", "A100-80GB", 1, "sarathi", num_gpu_blocks=300),
                     _small(80, qps=50.0))
    m = sim.run()
    assert m["num_finished"] == 80 and m["preemptions"] > 0
    assert any(r.num_preemptions for r in sim.records.values())


def test_a_float8_kv_cache_holds_a_burst_that_a_16_bit_one_preempts():
    """64 prompts of 2,048 tokens at once on Llama-2-7B (multi-head: 0.5 MiB a token) in an A100-40GB: in fp8 the
    pool holds twice the tokens, so fewer requests are preempted and the burst's first tokens come sooner."""
    burst = make_workload(WorkloadConfig("fixed", "burst", 64, prompt_len=2048, output_len=512))
    runs = {dtype: Simulation(SimConfig("Llama-2-7B", "A100-40GB", 1, "sarathi", kv_cache_dtype=dtype), burst)
            for dtype in ("auto", "fp8")}
    assert runs["fp8"].num_gpu_blocks >= 2 * runs["auto"].num_gpu_blocks
    m = {dtype: sim.run() for dtype, sim in runs.items()}
    assert m["auto"]["num_finished"] == m["fp8"]["num_finished"] == 64
    assert m["fp8"]["preemptions"] < m["auto"]["preemptions"]
    assert m["fp8"]["ttft_p99"] < m["auto"]["ttft_p99"] and m["fp8"]["throughput_tok_s"] > m["auto"]["throughput_tok_s"]
    with pytest.raises(InvalidArgument, match="--kv-cache-dtype must be one of auto, fp8"):
        SimConfig(kv_cache_dtype="int8")

def test_swap_preemption_moves_blocks_over_pcie():
    m = simulate(SimConfig("Mistral-7B", "A100-80GB", 1, "sarathi", num_gpu_blocks=300, preemption_mode="swap"),
                 _small(80, qps=50.0))
    assert m["num_finished"] == 80
    assert m["preemptions_by_mode"]["swap"] > 0 and m["swapped_blocks"] > 0 and m["swap_time_s"] > 0


def test_vllm_stalls_decodes_behind_long_prompts_and_sarathi_does_not():
    users = [RequestSpec(0.0, 200, 400) for _ in range(40)]
    burst = [RequestSpec(2.0, 8000, 8) for _ in range(2)]
    stalls = {}
    for policy in ("vllm", "sarathi"):
        sim = Simulation(SimConfig("Mistral-7B", "A100-80GB", 1, policy), users + burst)
        sim.run()
        stalls[policy] = max(g for g, e in zip(sim.totals.tbt, sim.totals.tbt_end, strict=True) if e >= 2.0)
    assert stalls["vllm"] > 0.5  # two whole 8K prefills while every user waits
    assert stalls["sarathi"] < 0.15  # one 512-token chunk per step
    assert stalls["vllm"] > 5 * stalls["sarathi"]


def test_mooncake_prefixes_hit_the_prefix_cache():
    specs = make_workload(WorkloadConfig("mooncake-conv", "trace", 40, None, time_scale=0.01))
    sim = Simulation(SimConfig("Llama-3-8B", "H100", 1, "sarathi", enable_prefix_caching=True), specs)
    assert sim.run()["num_finished"] == 40
    assert sim.core.prefix_stats.hit_blocks > 0


def test_measured_cost_model_drives_the_loop(tmp_path):
    samples = [{"num_tokens": t, "num_seqs": 1, "context": t, "seconds": 0.01 + 1e-4 * t} for t in (1, 128, 1024)]
    samples += [{"num_tokens": 32, "num_seqs": 32, "context": 32 * 500, "seconds": 0.02}]
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"format": MEASURED_FORMAT, "samples": samples}))
    m = simulate(SimConfig("Llama-2-7B", "A100-80GB", 1, "sarathi", cost_model="measured",
                           measured_file=str(path)), _small(30))
    assert m["num_finished"] == 30 and m["cost_model"] == "measured"
    assert 0.005 < m["tbt_p50"] < 0.1


def test_a_request_that_can_never_fit_is_rejected_not_stalled():
    specs = [RequestSpec(0.0, 100, 10), RequestSpec(0.0, 5000, 10)]
    m = simulate(SimConfig("Mistral-7B", "A100-80GB", 1, "sarathi", num_gpu_blocks=64), specs)
    assert m["rejected"] == 1 and m["num_finished"] == 1


def test_unknown_policy_is_reported_and_reproduce_rows_degrade(monkeypatch):
    with pytest.raises(PolicyUnavailable, match="not available"):
        simulate(SimConfig(policy="nope"), _small(5))
    monkeypatch.setattr(reproduce, "available_policies", lambda: ("sarathi", "vllm"))
    rows = {r["id"]: r for r in reproduce.run_reproductions(["fastserve-vs-fcfs-mean-latency",
                                                            "fcfs-queueing-share"])}
    assert all(r["ours"] is None and "policy not available" in r["note"] for r in rows.values())
    assert loop.available_policies() == tuple(loop.core_scheduler.POLICIES)


def test_a_linear_cost_model_and_the_cores_own_mlfq_and_step_time_drive_the_loop():
    """What bench/fastserve_fairness.py runs: one's own MLFQConfig and the core's step-time model (as a live
    scheduler has it) on a linear cost model; a 1-token step costs base + per token."""
    from seawall.sim.cost_model import LinearCostModel, StepShape
    from services.scheduler.core.config import MLFQConfig
    from services.scheduler.core.step_time import StepTimeModel

    cost = LinearCostModel(base_s=0.006, per_token_s=1e-4, swap_per_block_s=1e-3)
    assert cost.step_time(StepShape.of([(64, 0)])) == pytest.approx(0.006 + 64e-4)
    assert cost.step_time(StepShape()) == 0.0 and cost.swap_time(3) == pytest.approx(3e-3)
    mlfq, step_time = MLFQConfig(max_wait_ratio=0.5, wait_credit="none"), StepTimeModel()
    specs = [RequestSpec(0.01 * i, 64, 8 + 40 * (i % 3)) for i in range(30)]
    sim = Simulation(SimConfig(policy="fastserve", max_num_seqs=4, num_gpu_blocks=1024, mlfq=mlfq,
                               step_time=step_time), specs, cost)
    m = sim.run()
    assert m["num_finished"] == 30
    assert sim.core.config.mlfq is mlfq and sim.core.config.step_time is step_time
    assert 0.006 <= m["tbt_p50"] < 0.01
