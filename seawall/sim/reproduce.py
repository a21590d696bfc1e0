"""``seawall sim reproduce``: the papers' headline figures, re-measured on the simulator.

Each row runs the real scheduler core under the roofline cost model and compares one figure with the
paper's (papers.md; the issue names the rows). Rows whose policy the core does not have yet report
"policy not available" instead of a number. Setups, request counts and the reasons our figures differ
are in docs/sim.md; every row's ``note`` says what was run.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from seawall.sim.capacity import capacity_search
from seawall.sim.loop import SimConfig, Simulation, available_policies
from seawall.sim.workloads import RequestSpec, WorkloadConfig, make_workload


@dataclass
class Row:
    id: str
    paper: float | None
    ours: float | None
    unit: str
    note: str
    paper_range: tuple[float, float] | None = None  # the paper gives a range, not a point
    wall_s: float = 0.0

    def as_dict(self) -> dict:
        ratio = None if self.ours is None or not self.paper else self.ours / self.paper
        if self.ours is None:
            status = "n/a"
        elif self.paper_range is not None:
            status = "in range" if self.paper_range[0] <= self.ours <= self.paper_range[1] else "out of range"
        else:
            status = "within 20%" if ratio is not None and abs(ratio - 1) <= 0.2 else "differs (docs/sim.md)"
        d = {"id": self.id, "paper": self.paper, "ours": self.ours, "unit": self.unit, "note": self.note,
             "ratio": ratio, "status": status, "wall_s": round(self.wall_s, 2)}
        if self.paper_range is not None:
            d["paper_range"] = list(self.paper_range)
        return d


def _missing(*policies: str) -> list[str]:
    return [p for p in policies if p not in available_policies()]


def _unavailable(row_id: str, unit: str, paper: float | None, missing: list[str], **kw) -> Row:
    return Row(row_id, paper, None, unit, f"policy not available: {', '.join(missing)} (not in this core yet)", **kw)


# --- paged KV vs max-length reservation -------------------------------------------------------------------

PAGED_MODEL, PAGED_GPU, PAGED_MAX_LEN = "Llama-2-7B", "A100-40GB", 2048


def paged_capacity() -> Row:
    """Sequences held at once when KV-bound: paged blocks (measured) vs reserving the max length (computed)."""
    policy = "vllm" if "vllm" in available_policies() else available_policies()[0]
    wl = make_workload(WorkloadConfig("azure-conv", "burst", 400, None, max_total_len=PAGED_MAX_LEN))
    sim = Simulation(SimConfig(PAGED_MODEL, PAGED_GPU, 1, policy, max_num_seqs=4096), wl)
    m = sim.run()
    paged = m["saturated_concurrent_seqs"]
    reserved = m["kv_capacity_tokens"] // PAGED_MAX_LEN
    mean_len = statistics.mean(s.prompt_len + s.output_len for s in wl)
    note = (f"{PAGED_MODEL} on {PAGED_GPU}: {m['kv_capacity_tokens']} KV slots; paged holds {paged:.1f} sequences "
            f"(time-averaged while requests wait; azure-conv lengths, mean {mean_len:.0f} tokens, KV waste "
            f"{100 * m['kv_waste_frac']:.2f}%) vs {reserved} reserving {PAGED_MAX_LEN} tokens each "
            f"(waste {100 * (1 - mean_len / PAGED_MAX_LEN):.0f}% at completion); the seed says ~50 vs ~20")
    return Row("paged-capacity-a100-40gb", 50 / 20, paged / reserved, "x", note)


# --- decode stall under a burst of 32K prompts ----------------------------------------------------------

STALL_MODEL, STALL_GPU = "Mistral-7B", "H100"
STALL_USERS, STALL_BURST, STALL_PROMPT, STALL_AT = 200, 4, 32_000, 10.0


def _stall_workload() -> list[RequestSpec]:
    users = [RequestSpec(0.0, 300, 2000) for _ in range(STALL_USERS)]
    burst = [RequestSpec(STALL_AT, STALL_PROMPT, 16) for _ in range(STALL_BURST)]
    return users + burst


def _stall(policy: str) -> tuple[float, float, dict]:
    """(longest gap between two tokens after the burst arrives, steady gap before it, metrics)."""
    sim = Simulation(SimConfig(STALL_MODEL, STALL_GPU, 1, policy, max_num_seqs=256, max_sim_time=STALL_AT + 40),
                     _stall_workload())
    m = sim.run()
    gaps, ends = sim.totals.tbt, sim.totals.tbt_end
    after = [g for g, e in zip(gaps, ends, strict=True) if e >= STALL_AT]
    before = [g for g, e in zip(gaps, ends, strict=True) if STALL_AT - 3 <= e < STALL_AT]
    return max(after), statistics.median(before), m


def prefill_stall_vllm() -> Row:
    if missing := _missing("vllm"):
        return _unavailable("prefill-stall-32k-vllm", "s", 5.0, missing, paper_range=(2.0, 8.0))
    stall, steady, m = _stall("vllm")
    note = (f"{STALL_MODEL} on 1x {STALL_GPU}: {STALL_BURST} prompts of {STALL_PROMPT} tokens arrive at t={STALL_AT:g}s "
            f"while {STALL_USERS} users decode (steady gap {1e3 * steady:.0f} ms); the longest gap between two "
            f"tokens of a running request; the seed says 2-8 s (1 token in 5-10 s)")
    return Row("prefill-stall-32k-vllm", 5.0, stall, "s", note, paper_range=(2.0, 8.0))


def prefill_stall_sarathi() -> Row:
    if missing := _missing("sarathi"):
        return _unavailable("prefill-stall-32k-sarathi", "s", None, missing)
    stall, steady, m = _stall("sarathi")
    note = (f"same burst under sarathi (tau={m['chunk_size']}): longest gap {stall / steady:.1f}x the steady "
            f"{1e3 * steady:.0f} ms; 'paper' is the design target, 2x the steady gap (DESIGN.md §7; no paper "
            f"gives this figure)")
    return Row("prefill-stall-32k-sarathi", 2 * steady, stall, "s", note)


# --- Sarathi-Serve capacity vs vLLM ------------------------------------------------------------------------

CAPACITY_REQUESTS = 256  # the paper runs 2048 per probe; docs/sim.md shows how the ratio moves with this


def _capacity_ratio(row_id: str, model: str, gpu: str, tp: int, slo: float, paper: float) -> Row:
    if missing := _missing("sarathi", "vllm"):
        return _unavailable(row_id, "x", paper, missing)
    wl = WorkloadConfig("sharegpt", "poisson", CAPACITY_REQUESTS, 1.0, seed=0, max_total_len=8192)
    caps = {}
    for policy in ("sarathi", "vllm"):
        cfg = SimConfig(model, gpu, tp, policy, max_num_seqs=128, max_num_batched_tokens=None
                        if policy == "sarathi" else 8192)
        caps[policy] = capacity_search(cfg, wl, slo, 2.0, start_qps=1.0)["capacity_qps"]
    ratio = caps["sarathi"] / caps["vllm"] if caps["vllm"] else None
    note = (f"{model} on {tp}x {gpu}, ShareGPT lengths, Poisson, P99 TBT <= {slo:g} s and P50 scheduling delay "
            f"<= 2 s: sarathi (tau=512) {caps['sarathi']:.3g} QPS vs vllm {caps['vllm']:.3g} QPS; "
            f"{CAPACITY_REQUESTS} requests per probe (paper: 2048); paper: up to {paper}x")
    return Row(row_id, paper, ratio, "x", note)


def sarathi_capacity_mistral() -> Row:
    return _capacity_ratio("sarathi-capacity-mistral-7b", "Mistral-7B", "A100-80GB", 1, 0.1, 2.6)


def sarathi_capacity_yi() -> Row:
    return _capacity_ratio("sarathi-capacity-yi-34b", "Yi-34B", "A100-80GB", 2, 0.2, 3.7)


# --- FastServe vs FCFS ------------------------------------------------------------------------------------

FS_MODEL, FS_GPU, FS_REQUESTS, FS_LOAD, FS_CV, FS_SEEDS = "OPT-13B", "A100-40GB", 400, 0.8, 4.0, (0, 1, 2)
# Chat-turn prompts (ShareGPT's, up to 512 tokens) and long-tailed outputs: Pareto(1.0) from 16 tokens,
# capped by OPT's 2048-token context.
FS_MAX_PROMPT, FS_PARETO_ALPHA, FS_PARETO_MIN = 512, 1.0, 16


def _fastserve_config(policy: str, mlfq: str = "paper") -> SimConfig:
    # FastServe's artifact: one A100, OPT-13B, max batch 16, 2048 tokens per batch, large host swap space.
    return SimConfig(FS_MODEL, FS_GPU, 1, policy, max_num_seqs=16, max_num_batched_tokens=2048,
                     swap_space_gib=56.0, mlfq=mlfq)


def _fastserve_runs() -> dict:
    """Per seed: fcfs and fastserve (the core's paper constants, and the released code's) on one bursty
    long-tail workload at FS_LOAD of fcfs's saturated rate (measured with every request at t=0)."""
    runs = []
    for seed in FS_SEEDS:
        base = WorkloadConfig("longtail", "gamma", FS_REQUESTS, 1.0, seed=seed, cv=FS_CV, max_total_len=2048,
                              max_prompt_len=FS_MAX_PROMPT, pareto_alpha=FS_PARETO_ALPHA,
                              pareto_min=FS_PARETO_MIN)
        burst = make_workload(dataclasses.replace(base, arrival="burst", qps=None))
        qps = FS_LOAD * Simulation(_fastserve_config("fcfs"), burst).run()["throughput_req_s"]
        wl = make_workload(dataclasses.replace(base, qps=qps))
        runs.append({"qps": qps, "fcfs": Simulation(_fastserve_config("fcfs"), wl).run(),
                     "fastserve": Simulation(_fastserve_config("fastserve"), wl).run(),
                     "fastserve-code": Simulation(_fastserve_config("fastserve", "code"), wl).run()})
    return {"runs": runs}


def _pooled(runs: list[dict], policy: str, key: str) -> float:
    """Mean of a per-request mean over the seeds (every seed runs the same number of requests)."""
    return statistics.mean(r[policy][key] for r in runs)


def _pooled_queueing(runs: list[dict], policy: str) -> float:
    total = sum(r[policy]["e2e_mean"] * r[policy]["num_finished"] for r in runs)
    waited = sum(r[policy]["queueing_frac"] * r[policy]["e2e_mean"] * r[policy]["num_finished"] for r in runs)
    return waited / total


_FS_CACHE: dict = {}


def _fastserve_cached() -> dict:
    if not _FS_CACHE:
        _FS_CACHE.update(_fastserve_runs())
    return _FS_CACHE


def fastserve_vs_fcfs() -> Row:
    if missing := _missing("fcfs", "fastserve"):
        return _unavailable("fastserve-vs-fcfs-mean-latency", "x", 3.0, missing, paper_range=(2.0, 4.0))
    runs = _fastserve_cached()["runs"]
    fcfs = _pooled(runs, "fcfs", "per_token_latency_mean")
    paper_k, code_k = (_pooled(runs, p, "per_token_latency_mean") for p in ("fastserve", "fastserve-code"))
    per_seed = ", ".join(f"{r['fcfs']['per_token_latency_mean'] / r['fastserve']['per_token_latency_mean']:.2g}"
                         for r in runs)
    note = (f"{FS_MODEL} on 1x {FS_GPU}, max batch 16: ShareGPT prompts <= {FS_MAX_PROMPT} tokens, Pareto("
            f"{FS_PARETO_ALPHA:g}) outputs from {FS_PARETO_MIN} tokens, gamma arrivals CV {FS_CV:g} at {FS_LOAD:.0%} "
            f"of fcfs's saturated rate, {FS_REQUESTS} requests x seeds {list(FS_SEEDS)} (per seed: {per_seed}); "
            f"mean per-token latency fcfs {fcfs:.3g} s, fastserve {paper_k:.3g} s with the core's paper constants "
            f"(swap {100 * _pooled(runs, 'fastserve', 'swap_time_frac'):.0f}% of the run), {code_k:.3g} s "
            f"({fcfs / code_k:.2f}x) with the released code's constants; paper: 2-4x vs FastServe-FCFS (ShareGPT), "
            f"up to 8.9x in the skip-join ablation")
    return Row("fastserve-vs-fcfs-mean-latency", 3.0, fcfs / paper_k, "x", note, paper_range=(2.0, 4.0))


def fcfs_queueing_share() -> Row:
    if missing := _missing("fcfs", "fastserve"):
        return _unavailable("fcfs-queueing-share", "frac", 0.9, missing)
    runs = _fastserve_cached()["runs"]
    per_seed = ", ".join(f"{r['fcfs']['queueing_frac']:.2f}" for r in runs)
    note = (f"share of end-to-end latency spent waiting (queued, or preempted until resumed) under fcfs in the "
            f"runs above (per seed: {per_seed}); fastserve: {100 * _pooled_queueing(runs, 'fastserve'):.0f}%; "
            f"paper: up to 90% on real traces")
    return Row("fcfs-queueing-share", 0.9, _pooled_queueing(runs, "fcfs"), "frac", note)


# --- DualPath: cluster scale, KV loaded from storage ---------------------------------------------------------

# DualPath's headline setup (papers.md §4.6-4.7) with the one of its models our cost model has: Qwen2.5-32B
# (dense, FP16 KV) as DP engines on 8-GPU Hopper nodes (H200: the 64K sessions need its HBM), 2P4D, a
# 400 Gbps storage NIC per node and a 400 Gbps compute NIC per GPU, 320 GB of DRAM buffer per node, the 64K
# agentic dataset shape, every agent starting at once (offline). 256 agents instead of the paper's
# 1024-2048 keeps a run near two seconds; docs/sim.md shows how the ratio moves with the count.
DP_AGENTS, DP_PRESET, DP_P, DP_D = 256, "64k", 2, 4
DP_PD_AGENTS, DP_PD_CONFIGS = 128, ((1, 1), (2, 1), (1, 2))
DP_TURNS: int | None = None  # the preset's (tests shorten the sessions)
_DP_CACHE: dict = {}


def _dualpath(policy: str, placement: str = "load", p: int = DP_P, d: int = DP_D,
              agents: int = DP_AGENTS) -> dict:
    from seawall.sim.cluster import ClusterConfig, ClusterWorkload, simulate_cluster
    from seawall.workloads.multiturn import AgenticConfig

    key = (policy, placement, p, d, agents)
    if key not in _DP_CACHE:
        turns = {} if DP_TURNS is None else {"turns": DP_TURNS}
        wl = ClusterWorkload("agentic", AgenticConfig.preset(DP_PRESET, sessions=agents, **turns))
        _DP_CACHE[key] = simulate_cluster(ClusterConfig(prefill_nodes=p, decode_nodes=d, read_policy=policy,
                                                        placement=placement), wl)
    return _DP_CACHE[key]


def _dp_setup(m: dict) -> str:
    return (f"{m['model']} DP engines on {m['prefill_nodes']}P{m['decode_nodes']}D x {m['gpus_per_node']} "
            f"{m['gpu']}, SNIC {m['storage_gbps']:g} Gbps/node, CNIC {m['compute_gbps']:g} Gbps/GPU, DRAM "
            f"{m['dram_gb']:g} GB/node; {m['num_sessions']} agents x the {DP_PRESET} agentic shape "
            f"({m['num_finished']} turns, hit rate {100 * m['hit_rate']:.1f}%), all starting at t=0")


def dualpath_offline_jct() -> Row:
    basic, dual, oracle = _dualpath("pe-read"), _dualpath("dual"), _dualpath("oracle")
    ratio = basic["jct_s"] / dual["jct_s"]
    note = (f"{_dp_setup(dual)}: JCT pe-read {basic['jct_s']:.0f} s, dual {dual['jct_s']:.0f} s, oracle (free KV "
            f"movement) {oracle['jct_s']:.0f} s: dual is {dual['jct_s'] / oracle['jct_s']:.2f}x oracle; "
            f"pe-read's SNICs at {100 * max(basic['snic_util'].values()):.0f}%, dual reads "
            f"{100 * dual['de_read_frac']:.0f}% on the decode side; a storage-bound ceiling is "
            f"(P+D)/P = {(DP_P + DP_D) / DP_P:g}x. Paper: up to 1.87x over Basic (DS 660B, 2P4D, 64K), which "
            f"also counts layer-wise prefill (-17%) and the scheduler; the dual path alone took JCT from 0.83 "
            f"to 0.62 of Basic's")
    return Row("dualpath-offline-jct", 1.87, ratio, "x", note)


def dualpath_snic_balance() -> Row:
    dual, rr = _dualpath("dual"), _dualpath("dual", "round-robin")
    note = (f"{_dp_setup(dual)}: Max/Avg over the 6 nodes of storage-NIC read bytes per {dual['window_s']:g} s "
            f"window (weighted by bytes) under dual: {dual['snic_max_avg']:.2f} (whole run "
            f"{dual['snic_max_avg_total']:.2f}); round robin (engines cycled, read side alternated): "
            f"{rr['snic_max_avg']:.2f} (whole run {rr['snic_max_avg_total']:.2f}; JCT {rr['jct_s']:.0f} s vs "
            f"{dual['jct_s']:.0f} s). Paper: 1.18 vs 1.53 round robin")
    return Row("dualpath-snic-balance", 1.18, dual["snic_max_avg"], "x", note)


def dualpath_pd_ratio() -> Row:
    ratios, jct = [], {}
    for p, d in DP_PD_CONFIGS:
        for policy in ("pe-read", "dual"):
            jct[(p, d, policy)] = _dualpath(policy, p=p, d=d, agents=DP_PD_AGENTS)["jct_s"]
        ratios.append(jct[(p, d, "pe-read")] / jct[(p, d, "dual")])
    per = ", ".join(f"{p}P{d}D {r:.2f}x" for (p, d), r in zip(DP_PD_CONFIGS, ratios, strict=True))
    note = (f"JCT pe-read / dual per P/D ratio, {DP_PD_AGENTS} agents, the setup above: {per}; Basic-2P1D / "
            f"DualPath-1P1D {jct[(2, 1, 'pe-read')] / jct[(1, 1, 'dual')]:.2f} (paper: about 1), DualPath-2P1D / "
            f"DualPath-1P2D {jct[(2, 1, 'dual')] / jct[(1, 2, 'dual')]:.2f} (paper: about 1). Paper (DS 27B): "
            f"mean 1.64x, up to 2.46x")
    return Row("dualpath-pd-ratio", 1.64, statistics.mean(ratios), "x", note)


ROWS: dict[str, Callable[[], Row]] = {
    "paged-capacity-a100-40gb": paged_capacity,
    "prefill-stall-32k-vllm": prefill_stall_vllm,
    "prefill-stall-32k-sarathi": prefill_stall_sarathi,
    "sarathi-capacity-mistral-7b": sarathi_capacity_mistral,
    "sarathi-capacity-yi-34b": sarathi_capacity_yi,
    "fastserve-vs-fcfs-mean-latency": fastserve_vs_fcfs,
    "fcfs-queueing-share": fcfs_queueing_share,
    "dualpath-offline-jct": dualpath_offline_jct,
    "dualpath-snic-balance": dualpath_snic_balance,
    "dualpath-pd-ratio": dualpath_pd_ratio,
}


def run_reproductions(only: list[str] | None = None) -> list[dict]:
    unknown = set(only or ()) - set(ROWS)
    if unknown:
        from services.common.errors import InvalidArgument

        raise InvalidArgument(f"unknown reproduction ids {sorted(unknown)}; known: {', '.join(ROWS)}")
    rows = []
    for row_id, fn in ROWS.items():
        if only and row_id not in only:
            continue
        started = time.perf_counter()
        row = fn()
        row.wall_s = time.perf_counter() - started
        rows.append(row.as_dict())
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'id':32s} {'paper':>10s} {'ours':>10s} {'ratio':>6s}  status", "-" * 80]
    for r in rows:
        paper = "-" if r["paper"] is None else f"{r['paper']:.3g}"
        if "paper_range" in r:
            paper = f"{r['paper_range'][0]:g}-{r['paper_range'][1]:g}"
        ours = "-" if r["ours"] is None else f"{r['ours']:.3g}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"{r['id']:32s} {paper:>10s} {ours:>10s} {ratio:>6s}  {r['status']} ({r['unit']})")
        lines.append(f"    {r['note']}")
    return "\n".join(lines) + "\n"
