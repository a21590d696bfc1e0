"""``seawall sim``: simulate the scheduler core on modeled GPUs (see docs/sim.md).

seawall sim run --model M --gpu G [--tp N] --policy P --workload W [--arrival A] --qps X [--num-requests N]
                [--seed S] [--replicas R [--migration-headroom T ...] [--migration-gbps G]
                [--migration-precopy --prefix-caching]] --json OUT
seawall sim capacity ... --slo-tbt-p99 S [--slo-sched-delay-p50 2.0] --json OUT
seawall sim dualpath --prefill P --decode D [--storage-gbps X] [--compute-gbps Y] [--dram-gb Z]
                     --read-policy pe-read|de-read|dual|oracle [...] --workload agentic|mooncake-conv --json OUT
seawall sim workload --workload agentic|mooncake-conv [...] [--out FILE.jsonl]
seawall sim reproduce [--only ID ...] [--json OUT]
seawall sim calibration [--json OUT]
seawall sim list
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from seawall.commands.numbers import non_negative, positive, whole
from seawall.commands.paths import check_output_file, write_output_file
from services.common.errors import InvalidArgument
from services.engine.config import KV_CACHE_DTYPES


def _add_common(p: argparse.ArgumentParser) -> None:
    from seawall.sim.workloads import ARRIVALS, LENGTH_SOURCES

    g = p.add_argument_group("system")
    g.add_argument("--model", default="Mistral-7B", help="model name (seawall sim list), default Mistral-7B")
    g.add_argument("--gpu", default="A100-80GB", help="GPU name (seawall sim list), default A100-80GB")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--policy", default="sarathi", help="scheduler policy by name (default sarathi)")
    g.add_argument("--chunk-size", type=int, default=None,
                   help="prompt-token budget tau of chunking policies (default 512)")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per step (default: tau for chunking policies, else the longest request)")
    g.add_argument("--max-num-seqs", type=int, default=128, help="sequences per step (default 128)")
    g.add_argument("--preemption-mode", choices=("swap", "recompute"), default=None,
                   help="default: swap for fastserve*, recompute otherwise")
    g.add_argument("--swap-space-gib", type=non_negative, default=4.0, help="host memory per GPU for swapped KV")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--num-gpu-blocks", type=whole(1), default=None, help="override the KV pool size (blocks)")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="KV element type: auto (16-bit) or fp8 (one byte: 2x the blocks, half the bytes read)")
    g.add_argument("--prefix-caching", action="store_true", help="reuse KV of shared prefixes (mooncake-conv)")
    g.add_argument("--mlfq", choices=("paper", "code"), default="paper",
                   help="FastServe's MLFQ constants: the core's paper defaults or the released code's")
    g.add_argument("--cost-model", nargs="+", default=["roofline"], metavar="KIND",
                   help="'roofline' (default) or 'measured FILE' (a seawall-step-times/v1 JSON)")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default="sharegpt", choices=LENGTH_SOURCES, help="length source")
    w.add_argument("--arrival", default=None, choices=ARRIVALS,
                   help="arrival process (default: trace for azure-conv/mooncake-conv, else poisson)")
    w.add_argument("--qps", type=positive, default=None, help="mean arrival rate, requests/s")
    w.add_argument("--num-requests", type=whole(1), default=256)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--cv", type=positive, default=1.0, help="gamma arrivals: coefficient of variation")
    w.add_argument("--on-s", type=positive, default=10.0, help="onoff arrivals: burst length, s")
    w.add_argument("--off-s", type=non_negative, default=30.0, help="onoff arrivals: gap between bursts, s")
    w.add_argument("--time-scale", type=positive, default=1.0, help="trace arrivals without --qps: stretch time")
    w.add_argument("--trace-offset", type=whole(0), default=0, help="first row of a timestamped trace")
    w.add_argument("--prompt-len", type=whole(1), default=512, help="fixed workload: prompt tokens")
    w.add_argument("--output-len", type=whole(1), default=128, help="fixed workload: output tokens")
    w.add_argument("--max-total-len", type=whole(2), default=None, help="drop requests longer than this")
    w.add_argument("--max-prompt-len", type=whole(1), default=None, help="sharegpt/longtail: shorter prompts only")
    w.add_argument("--pareto-alpha", type=positive, default=1.2, help="longtail: Pareto shape of output lengths")
    w.add_argument("--pareto-min", type=whole(1), default=8, help="longtail: the shortest output")
    w.add_argument("--priority-mix", type=non_negative, default=0.0,
                   help="the fraction of requests of high priority (-1), at random (default 0); the metrics then "
                        "have each class's latencies")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="simulate the scheduler core on modeled GPUs", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    sim_sub = p.add_subparsers(dest="sim_command", required=True, metavar="ACTION")

    run = sim_sub.add_parser("run", help="simulate one workload and write its metrics")
    _add_common(run)
    r = run.add_argument_group("replicas")
    r.add_argument("--replicas", type=whole(1), default=1,
                   help="replicas behind one placement by token load (default 1)")
    r.add_argument("--migration-headroom", type=whole(0), nargs="+", default=None, metavar="TOKENS",
                   help="with --replicas 2+: live migration's headroom (the scheduler's flag; default 32, 0: off); "
                        "several: one run each, ratios against the first")
    r.add_argument("--migration-gbps", type=positive, default=200.0,
                   help="link between replicas per GPU, Gbit/s, that a moved request's KV crosses (default 200)")
    r.add_argument("--priority-headroom", type=whole(0), nargs="+", default=None, metavar="TOKENS",
                   help="Llumnix's priorities: tokens a replica keeps free for each high-priority request "
                        "(the scheduler's flag; default 0); several: one run each (with --priority-mix)")
    r.add_argument("--migration-precopy", action="store_true",
                   help="each headroom runs again copying decodes' full blocks ahead (Llumnix's multi-stage copy, "
                        "the live scheduler's default); needs --prefix-caching")
    run.add_argument("--per-request", action="store_true", help="include one record per request in the JSON")
    run.add_argument("--json", default=None, help="write the metrics here")
    run.set_defaults(func=_run)

    cap = sim_sub.add_parser("capacity", help="highest QPS within the SLOs (Sarathi-Serve's capacity search)")
    _add_common(cap)
    cap.add_argument("--slo-tbt-p99", type=positive, required=True, help="P99 time-between-tokens SLO, s")
    cap.add_argument("--slo-sched-delay-p50", type=positive, default=2.0, help="P50 scheduling delay SLO, s")
    cap.add_argument("--start-qps", type=positive, default=1.0, help="first upper bound is twice this")
    cap.add_argument("--max-probes", type=whole(1), default=20)
    cap.add_argument("--json", default=None)
    cap.set_defaults(func=_capacity, per_request=False)

    dp = sim_sub.add_parser("dualpath", help="P prefill + D decode nodes loading cached KV from storage (DualPath)")
    _add_cluster(dp)
    _add_multiturn(dp)
    dp.add_argument("--per-request", action="store_true", help="include one record per request in the JSON")
    dp.add_argument("--json", default=None, help="write the metrics here")
    dp.set_defaults(func=_dualpath)

    wk = sim_sub.add_parser("workload", help="write a multi-turn workload as JSONL and count its prefix hits")
    _add_multiturn(wk)
    wk.add_argument("--block-size", type=int, default=None,
                    help="block size of the hit count (default: --block-tokens for mooncake-conv, 16 for agentic)")
    wk.add_argument("--count-outputs", action="store_true",
                    help="agentic: the cache also holds each turn's given output (a replay of recorded outputs)")
    wk.add_argument("--out", default=None, help="write one JSON object per request here")
    wk.add_argument("--no-tokens", action="store_true", help="leave prompt_token_ids out of --out")
    wk.set_defaults(func=_workload)

    rep = sim_sub.add_parser("reproduce", help="the paper reproductions, as a table (docs/sim.md)")
    rep.add_argument("--only", nargs="+", default=None, metavar="ID", help="run only these rows")
    rep.add_argument("--json", default=None)
    rep.set_defaults(func=_reproduce)

    cal = sim_sub.add_parser("calibration", help="the cost model against its calibration anchors")
    cal.add_argument("--json", default=None)
    cal.set_defaults(func=_calibration)

    lst = sim_sub.add_parser("list", help="models, GPUs, policies and workloads the simulator knows")
    lst.set_defaults(func=_list)


def _add_cluster(p: argparse.ArgumentParser) -> None:
    from seawall.sim.cluster import PLACEMENTS, READ_POLICIES

    g = p.add_argument_group("cluster")
    g.add_argument("--model", default="Qwen2.5-32B", help="model name (seawall sim list), default Qwen2.5-32B")
    g.add_argument("--gpu", default="H200", help="GPU name (seawall sim list), default H200")
    g.add_argument("--tp", type=int, default=1, help="GPUs per engine (default 1: DP engines)")
    g.add_argument("--gpus-per-node", type=whole(1), default=8)
    g.add_argument("--prefill", type=whole(1), default=1, help="prefill nodes (default 1)")
    g.add_argument("--decode", type=whole(1), default=2, help="decode nodes (default 2)")
    g.add_argument("--storage-gbps", type=positive, default=400.0, help="storage NIC per node, Gbit/s (default 400)")
    g.add_argument("--compute-gbps", type=positive, default=400.0, help="compute NIC per GPU, Gbit/s (default 400)")
    g.add_argument("--dram-gb", type=positive, default=320.0, help="DRAM buffer per node, GB (default 320)")
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="KV element type: auto (16-bit) or fp8 (one byte: half the bytes stored, loaded and moved)")
    g.add_argument("--read-policy", nargs="+", default=["dual"], choices=READ_POLICIES, metavar="POLICY",
                   help=f"where hit KV is read: {', '.join(READ_POLICIES)} (default dual); several: one run "
                        f"each, ratios against the first")
    g.add_argument("--placement", default="load", choices=PLACEMENTS,
                   help="engine choice: by token load and read queues (papers.md §4.5) or round robin")
    g.add_argument("--prefill-quota-s", type=positive, default=0.3, help="compute budget of a prefill batch, s")
    g.add_argument("--alpha-s", type=positive, default=3.0, help="alpha: storage-read queue limit, s of SNIC")
    g.add_argument("--beta-s", type=positive, default=5.0, help="beta: engine token limit, s of prefill")
    g.add_argument("--window-s", type=positive, default=10.0, help="window of the storage-NIC balance, s")


def _add_multiturn(p: argparse.ArgumentParser) -> None:
    from seawall.workloads.multiturn import AGENTIC_PRESETS

    w = p.add_argument_group("multi-turn workload")
    w.add_argument("--workload", default="agentic", choices=("agentic", "mooncake-conv"))
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--vocab-size", type=int, default=4096, help="token ids are drawn from [3, this)")
    w.add_argument("--preset", default="64k", choices=tuple(AGENTIC_PRESETS),
                   help="agentic: DualPath's dataset shape (default 64k); the flags below override it")
    w.add_argument("--sessions", type=whole(1), default=16, help="agentic: sessions (agents)")
    w.add_argument("--turns", type=whole(1), default=None, help="agentic: turns per session, at most")
    w.add_argument("--first-prompt-len", type=whole(1), default=None, help="agentic: turn 1's prompt")
    w.add_argument("--append-len", type=whole(1), default=None, help="agentic: tokens appended per turn")
    w.add_argument("--output-len", type=whole(1), default=None, help="agentic: tokens generated per turn")
    w.add_argument("--max-len", type=whole(2), default=None, help="agentic: prompt + output never pass this")
    w.add_argument("--scale", type=positive, default=1.0, help="agentic: multiply every length (1/16: tiny model)")
    w.add_argument("--jitter", type=float, default=0.5, help="agentic: lengths uniform in mean x [1-j, 1+j]")
    w.add_argument("--think-s", type=non_negative, default=0.0, help="agentic: pause before each next turn, s")
    w.add_argument("--session-rate", type=positive, default=None,
                   help="agentic: Poisson session starts per second (default: all at t=0, offline)")
    w.add_argument("--storage-block-tokens", type=whole(1), default=64,
                   help="agentic: tokens per stored KV block (hits are whole blocks; default 64)")
    w.add_argument("--num-requests", type=whole(1), default=1000, help="mooncake-conv: records to replay")
    w.add_argument("--trace-offset", type=whole(0), default=0, help="mooncake-conv: first record")
    w.add_argument("--block-tokens", type=whole(1), default=512,
                   help="mooncake-conv: tokens per 512-token trace block (16 scales the trace down 32x)")
    w.add_argument("--time-scale", type=positive, default=1.0, help="mooncake-conv: multiply arrival times")
    w.add_argument("--spread-s", type=non_negative, default=0.0,
                   help="mooncake-conv: spread records sharing a timestamp over this many seconds (3: the grid)")


def _multiturn_configs(args: argparse.Namespace):
    from seawall.workloads.multiturn import AgenticConfig, MooncakeReplayConfig

    overrides = {k: getattr(args, k) for k in ("turns", "first_prompt_len", "append_len", "output_len", "max_len")
                 if getattr(args, k) is not None}
    agentic = AgenticConfig.preset(
        args.preset, sessions=args.sessions, jitter=args.jitter, think_s=args.think_s, vocab_size=args.vocab_size,
        seed=args.seed, session_arrival="poisson" if args.session_rate else "burst",
        session_rate=args.session_rate or 1.0, **overrides)
    if args.scale != 1.0:
        agentic = agentic.scaled(args.scale)
    mooncake = MooncakeReplayConfig(limit=args.num_requests, offset=args.trace_offset, block_tokens=args.block_tokens,
                                    vocab_size=args.vocab_size, seed=args.seed, time_scale=args.time_scale,
                                    spread_s=args.spread_s)
    return agentic, mooncake


def _dualpath(args: argparse.Namespace) -> int:
    from seawall.sim.cluster import ClusterConfig, ClusterWorkload, simulate_cluster

    check_output_file(args.json, "--json")
    agentic, mooncake = _multiturn_configs(args)
    wl = ClusterWorkload(args.workload, agentic, mooncake, args.storage_block_tokens)
    runs = []
    for policy in args.read_policy:
        cfg = ClusterConfig(
            model=args.model, gpu=args.gpu, tp=args.tp, gpus_per_node=args.gpus_per_node,
            prefill_nodes=args.prefill, decode_nodes=args.decode, storage_gbps=args.storage_gbps,
            compute_gbps=args.compute_gbps, dram_gb=args.dram_gb, read_policy=policy, placement=args.placement,
            prefill_quota_s=args.prefill_quota_s, alpha_s=args.alpha_s, beta_s=args.beta_s,
            window_s=args.window_s, record_requests=args.per_request, kv_cache_dtype=args.kv_cache_dtype)
        runs.append(simulate_cluster(cfg, wl))
    keys = ("jct_s", "ttft_mean", "ttst_mean", "tpot_mean", "throughput_req_s", "throughput_tok_s",
            "snic_max_avg", "de_read_frac", "hit_rate")
    sys.stdout.write(f"{'read policy':12s}" + "".join(f"{k:>17s}" for k in keys) + "\n")
    for policy, m in zip(args.read_policy, runs, strict=True):
        sys.stdout.write(f"{policy:12s}" + "".join(f"{_fmt(m[k]):>17s}" for k in keys) + "\n")
    for m in runs:
        util = "  ".join(f"{n} {100 * u:.0f}%" for n, u in m["snic_util"].items())
        sys.stdout.write(f"{m['read_policy']}: storage-NIC utilisation {util}\n")
    for policy, m in list(zip(args.read_policy, runs, strict=True))[1:]:
        sys.stdout.write(f"JCT {args.read_policy[0]} / {policy}: {runs[0]['jct_s'] / m['jct_s']:.3f}\n")
    _write(args.json, runs[0] if len(runs) == 1 else {"runs": runs})
    return 0


def _workload(args: argparse.Namespace) -> int:
    from seawall.workloads.multiturn import (
        agentic_sessions,
        mooncake_conversation,
        prefix_hits,
        structural_hits,
        write_jsonl,
    )

    check_output_file(args.out, "--out")
    agentic, mooncake = _multiturn_configs(args)
    reqs = agentic_sessions(agentic) if args.workload == "agentic" else mooncake_conversation(mooncake)
    block = args.block_size or (args.block_tokens if args.workload == "mooncake-conv" else 16)
    counted = prefix_hits(reqs, block, count_outputs=args.count_outputs)
    if args.out:
        write_jsonl(reqs, args.out, with_tokens=not args.no_tokens)
    sys.stdout.write(f"requests {len(reqs)}  sessions {len({r.session_id for r in reqs})}  "
                     f"prompt tokens {counted.prompt_tokens}  mean prompt {counted.prompt_tokens / len(reqs):.0f}  "
                     f"max prompt+output {max(r.prompt_len + r.max_tokens for r in reqs)}\n"
                     f"prefix hit rate (block {block}, counted on token ids) {counted.hit_rate:.4f}")
    if args.workload == "agentic" or block == args.block_tokens:
        structural = structural_hits(reqs, block, count_outputs=args.count_outputs)
        sys.stdout.write(f"; from the workload's structure {structural.hit_rate:.4f}")
    sys.stdout.write("\n")
    return 0


def _configs(args: argparse.Namespace, need_qps: bool = True):
    from seawall.sim.loop import SimConfig
    from seawall.sim.workloads import WorkloadConfig

    kind, *rest = args.cost_model
    if kind not in ("roofline", "measured") or (kind == "measured") != (len(rest) == 1) or len(rest) > 1:
        raise InvalidArgument("--cost-model takes 'roofline' or 'measured FILE'")
    sim = SimConfig(
        model=args.model, gpu=args.gpu, tp=args.tp, policy=args.policy, block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=args.max_num_seqs,
        chunk_size=args.chunk_size, max_num_batched_tokens=args.max_num_batched_tokens,
        preemption_mode=args.preemption_mode, swap_space_gib=args.swap_space_gib,
        enable_prefix_caching=args.prefix_caching, kv_cache_dtype=args.kv_cache_dtype,
        num_gpu_blocks=args.num_gpu_blocks, cost_model=kind,
        measured_file=rest[0] if rest else None, record_requests=args.per_request,
        mlfq=args.mlfq,
    )
    arrival = args.arrival or ("trace" if args.workload in ("azure-conv", "mooncake-conv") else "poisson")
    if need_qps and arrival not in ("trace", "burst") and args.qps is None:
        raise InvalidArgument(f"--qps is required with {arrival} arrivals")
    wl = WorkloadConfig(
        lengths=args.workload, arrival=arrival, num_requests=args.num_requests, qps=args.qps, seed=args.seed,
        cv=args.cv, on_s=args.on_s, off_s=args.off_s, time_scale=args.time_scale, trace_offset=args.trace_offset,
        prompt_len=args.prompt_len, output_len=args.output_len, max_total_len=args.max_total_len,
        max_prompt_len=args.max_prompt_len, pareto_alpha=args.pareto_alpha, pareto_min=args.pareto_min,
        priority_mix=args.priority_mix,
    )
    return sim, wl


def _write(path: str | None, data: dict) -> None:
    if path:
        write_output_file(path, json.dumps(data, indent=2) + "\n", "--json")


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _run(args: argparse.Namespace) -> int:
    from seawall.sim.loop import simulate
    from seawall.sim.workloads import make_workload

    check_output_file(args.json, "--json")
    if (args.migration_headroom is not None or args.migration_precopy or args.priority_headroom) and args.replicas < 2:
        raise InvalidArgument("--migration-headroom, --migration-precopy and --priority-headroom move requests "
                              "between replicas: give --replicas 2 or more")
    if args.migration_precopy and not args.prefix_caching:
        raise InvalidArgument("--migration-precopy keeps the copy in the receiver's prefix cache: add --prefix-caching")
    sim, wl = _configs(args)
    workload = make_workload(wl)
    if args.replicas > 1:
        return _run_replicas(args, sim, wl, workload)
    m = simulate(sim, workload)
    m["workload"] = _workload_fields(wl)
    _write(args.json, m)
    # rejected: requests the KV pool could never hold, refused up front (else "num_finished 0" said nothing why)
    keys = ("num_finished", "rejected", "ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "e2e_p50", "e2e_p99",
            "sched_delay_p50", "throughput_tok_s", "max_concurrent_seqs", "preemptions", "kv_waste_frac",
            "queueing_frac", "num_steps", "sim_wall_s")
    sys.stdout.write("".join(f"{k:22s} {_fmt(m[k])}\n" for k in keys))
    return 0


def _workload_fields(wl) -> dict:
    return {"lengths": wl.lengths, "arrival": wl.arrival, "qps": wl.qps, "num_requests": wl.num_requests,
            "seed": wl.seed, "priority_mix": wl.priority_mix}


def _run_replicas(args: argparse.Namespace, sim, wl, workload) -> int:
    from seawall.sim.replicas import ReplicaConfig, simulate_replicas

    headrooms = args.migration_headroom or [ReplicaConfig.migration_headroom]
    # Each headroom, then (with --migration-precopy) each one again copying ahead: "32" and "32+copy"; with
    # several --priority-headroom, each of those once per value: "32 p0", "32 p512".
    setups = [(h, False) for h in headrooms] + [(h, True) for h in headrooms if h and args.migration_precopy]
    priorities = args.priority_headroom or [0]
    setups = [(h, copy, p) for h, copy in setups for p in priorities]
    labels = [f"{h}{'+copy' if copy else ''}{f' p{p}' if len(priorities) > 1 or p else ''}" for h, copy, p in setups]
    runs = []
    for headroom, copy, priority_headroom in setups:
        rc = ReplicaConfig(replicas=args.replicas, migration_headroom=headroom, migration_gbps=args.migration_gbps,
                           migration_precopy=copy, priority_headroom=priority_headroom)
        runs.append(simulate_replicas(sim, rc, workload))
        runs[-1]["workload"] = _workload_fields(wl)
    _write(args.json, runs[0] if len(runs) == 1 else {"runs": runs})
    keys = ("num_finished", "preemptions", "migrations", "queued_moves", "precopied_blocks", "migration_pause_mean",
            "migration_pause_max", "ttft_p99", "tbt_p99", "tbt_max", "e2e_mean", "e2e_p99", "per_token_latency_mean",
            "throughput_tok_s")
    width = max(8, *map(len, labels))
    sys.stdout.write(f"{'headroom':>{width}s}" + "".join(f"  {k}" for k in keys) + "\n")
    for label, m in zip(labels, runs, strict=True):
        sys.stdout.write(f"{label:>{width}s}" + "".join(f"  {_fmt(m[k]):>{len(k)}s}" for k in keys) + "\n")
    for label, m in list(zip(labels, runs, strict=True))[1:]:
        ratios = "  ".join(f"{k} {_ratio(m[k], runs[0][k])}" for k in ("preemptions", "migration_pause_mean",
                                                                        "ttft_p99", "tbt_max", "e2e_mean", "e2e_p99",
                                                                        "per_token_latency_mean"))
        sys.stdout.write(f"headroom {label} / {labels[0]}: {ratios}\n")
    # Copying ahead against stopping for the whole copy, at the same headroom: the pause is what it shortens.
    by_label = dict(zip(labels, runs, strict=True))
    for label, m in by_label.items():
        if "+copy" in label:
            base = label.replace("+copy", "")
            ratios = "  ".join(f"{k} {_ratio(m[k], by_label[base][k])}" for k in (
                "migration_pause_mean", "migration_pause_max", "tbt_max", "per_token_latency_mean"))
            sys.stdout.write(f"headroom {label} / {base}: {ratios}\n")
    # With a --priority-mix: what each class saw (priority -1 high, 0 normal).
    class_keys = ("ttft_p99", "e2e_mean", "per_token_latency_mean", "per_token_latency_p95", "max_gap",
                  "preempted_requests")
    for label, m in by_label.items():
        for priority, c in m.get("by_priority", {}).items():
            sys.stdout.write(f"{label:>{width}s}  priority {priority:>2s}: "
                             + "  ".join(f"{k} {_fmt(c[k])}" for k in class_keys) + "\n")
    return 0


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def _capacity(args: argparse.Namespace) -> int:
    from seawall.sim.capacity import capacity_search

    check_output_file(args.json, "--json")
    sim, wl = _configs(args, need_qps=False)
    wl = dataclasses.replace(wl, qps=wl.qps or args.start_qps)
    res = capacity_search(sim, wl, args.slo_tbt_p99, args.slo_sched_delay_p50, args.start_qps,
                          max_probes=args.max_probes)
    _write(args.json, res)
    for p in res["probes"]:
        sys.stdout.write(f"qps {p['qps']:8.4g}  {'pass' if p['passed'] else 'FAIL'}  tbt_p99 {_fmt(p['tbt_p99'])}"
                         f"  sched_delay_p50 {_fmt(p['sched_delay_p50'])}\n")
    sys.stdout.write(f"capacity_qps {res['capacity_qps']:.4g}\n")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from seawall.sim.reproduce import format_table, run_reproductions

    check_output_file(args.json, "--json")
    rows = run_reproductions(args.only)
    _write(args.json, {"rows": rows})
    sys.stdout.write(format_table(rows))
    return 0


def _calibration(args: argparse.Namespace) -> int:
    from seawall.sim.calibration import evaluate

    check_output_file(args.json, "--json")
    rows = evaluate()
    _write(args.json, {"anchors": rows})
    sys.stdout.write(f"{'anchor':34s} {'measured':>10s} {'ours':>10s} {'ratio':>6s}  within\n")
    for r in rows:
        ok = {True: "yes", False: "NO", None: "known miss"}[r["ok"]]
        sys.stdout.write(f"{r['id']:34s} {r['measured']:10.4g} {r['ours']:10.4g} {r['ratio']:6.2f}  {ok}\n")
    return 0


def _list(args: argparse.Namespace) -> int:
    from seawall.sim.cluster import PLACEMENTS, READ_POLICIES
    from seawall.sim.cluster import WORKLOADS as CLUSTER_WORKLOADS
    from seawall.sim.hardware import GPUS
    from seawall.sim.loop import available_policies
    from seawall.sim.models import MODELS
    from seawall.sim.workloads import ARRIVALS, LENGTH_SOURCES

    sys.stdout.write(f"models:    {', '.join(m.name for m in MODELS.values())}\n"
                     f"gpus:      {', '.join(g.name for g in GPUS.values())}\n"
                     f"policies:  {', '.join(available_policies())}\n"
                     f"workloads: {', '.join(LENGTH_SOURCES)}\n"
                     f"arrivals:  {', '.join(ARRIVALS)}\n"
                     f"dualpath:  read policies {', '.join(READ_POLICIES)}; placements {', '.join(PLACEMENTS)}; "
                     f"workloads {', '.join(CLUSTER_WORKLOADS)}\n")
    return 0
