"""``seawall sim``: simulate the scheduler core on modeled GPUs (see docs/sim.md).

seawall sim run --model M --gpu G [--tp N] --policy P --workload W [--arrival A] --qps X [--num-requests N]
                [--seed S] --json OUT
seawall sim capacity ... --slo-tbt-p99 S [--slo-sched-delay-p50 2.0] --json OUT
seawall sim reproduce [--only ID ...] [--json OUT]
seawall sim calibration [--json OUT]
seawall sim list
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from services.common.errors import InvalidArgument


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
    g.add_argument("--swap-space-gib", type=float, default=4.0, help="host memory per GPU for swapped KV")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--num-gpu-blocks", type=int, default=None, help="override the KV pool size (blocks)")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--prefix-caching", action="store_true", help="reuse KV of shared prefixes (mooncake-conv)")
    g.add_argument("--mlfq", choices=("paper", "code"), default="paper",
                   help="FastServe's MLFQ constants: the core's paper defaults or the released code's")
    g.add_argument("--cost-model", nargs="+", default=["roofline"], metavar="KIND",
                   help="'roofline' (default) or 'measured FILE' (a seawall-step-times/v1 JSON)")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default="sharegpt", choices=LENGTH_SOURCES, help="length source")
    w.add_argument("--arrival", default=None, choices=ARRIVALS,
                   help="arrival process (default: trace for azure-conv/mooncake-conv, else poisson)")
    w.add_argument("--qps", type=float, default=None, help="mean arrival rate, requests/s")
    w.add_argument("--num-requests", type=int, default=256)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--cv", type=float, default=1.0, help="gamma arrivals: coefficient of variation")
    w.add_argument("--on-s", type=float, default=10.0, help="onoff arrivals: burst length, s")
    w.add_argument("--off-s", type=float, default=30.0, help="onoff arrivals: gap between bursts, s")
    w.add_argument("--time-scale", type=float, default=1.0, help="trace arrivals without --qps: stretch time")
    w.add_argument("--trace-offset", type=int, default=0, help="first row of a timestamped trace")
    w.add_argument("--prompt-len", type=int, default=512, help="fixed workload: prompt tokens")
    w.add_argument("--output-len", type=int, default=128, help="fixed workload: output tokens")
    w.add_argument("--max-total-len", type=int, default=None, help="drop requests longer than this")
    w.add_argument("--max-prompt-len", type=int, default=None, help="sharegpt/longtail: shorter prompts only")
    w.add_argument("--pareto-alpha", type=float, default=1.2, help="longtail: Pareto shape of output lengths")
    w.add_argument("--pareto-min", type=int, default=8, help="longtail: the shortest output")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="simulate the scheduler core on modeled GPUs", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    sim_sub = p.add_subparsers(dest="sim_command", required=True, metavar="ACTION")

    run = sim_sub.add_parser("run", help="simulate one workload and write its metrics")
    _add_common(run)
    run.add_argument("--per-request", action="store_true", help="include one record per request in the JSON")
    run.add_argument("--json", default=None, help="write the metrics here")
    run.set_defaults(func=_run)

    cap = sim_sub.add_parser("capacity", help="highest QPS within the SLOs (Sarathi-Serve's capacity search)")
    _add_common(cap)
    cap.add_argument("--slo-tbt-p99", type=float, required=True, help="P99 time-between-tokens SLO, s")
    cap.add_argument("--slo-sched-delay-p50", type=float, default=2.0, help="P50 scheduling delay SLO, s")
    cap.add_argument("--start-qps", type=float, default=1.0, help="first upper bound is twice this")
    cap.add_argument("--max-probes", type=int, default=20)
    cap.add_argument("--json", default=None)
    cap.set_defaults(func=_capacity, per_request=False)

    rep = sim_sub.add_parser("reproduce", help="the paper reproductions, as a table (docs/sim.md)")
    rep.add_argument("--only", nargs="+", default=None, metavar="ID", help="run only these rows")
    rep.add_argument("--json", default=None)
    rep.set_defaults(func=_reproduce)

    cal = sim_sub.add_parser("calibration", help="the cost model against its calibration anchors")
    cal.add_argument("--json", default=None)
    cal.set_defaults(func=_calibration)

    lst = sim_sub.add_parser("list", help="models, GPUs, policies and workloads the simulator knows")
    lst.set_defaults(func=_list)


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
        enable_prefix_caching=args.prefix_caching, num_gpu_blocks=args.num_gpu_blocks, cost_model=kind,
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
    )
    return sim, wl


def _write(path: str | None, data: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2) + "\n")


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _run(args: argparse.Namespace) -> int:
    from seawall.sim.loop import simulate
    from seawall.sim.workloads import make_workload

    sim, wl = _configs(args)
    m = simulate(sim, make_workload(wl))
    m["workload"] = {"lengths": wl.lengths, "arrival": wl.arrival, "qps": wl.qps, "num_requests": wl.num_requests,
                     "seed": wl.seed}
    _write(args.json, m)
    keys = ("num_finished", "ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "e2e_p50", "e2e_p99",
            "sched_delay_p50", "throughput_tok_s", "max_concurrent_seqs", "preemptions", "kv_waste_frac",
            "queueing_frac", "num_steps", "sim_wall_s")
    sys.stdout.write("".join(f"{k:22s} {_fmt(m[k])}\n" for k in keys))
    return 0


def _capacity(args: argparse.Namespace) -> int:
    from seawall.sim.capacity import capacity_search

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

    rows = run_reproductions(args.only)
    _write(args.json, {"rows": rows})
    sys.stdout.write(format_table(rows))
    return 0


def _calibration(args: argparse.Namespace) -> int:
    from seawall.sim.calibration import evaluate

    rows = evaluate()
    _write(args.json, {"anchors": rows})
    sys.stdout.write(f"{'anchor':34s} {'measured':>10s} {'ours':>10s} {'ratio':>6s}  within\n")
    for r in rows:
        ok = {True: "yes", False: "NO", None: "known miss"}[r["ok"]]
        sys.stdout.write(f"{r['id']:34s} {r['measured']:10.4g} {r['ours']:10.4g} {r['ratio']:6.2f}  {ok}\n")
    return 0


def _list(args: argparse.Namespace) -> int:
    from seawall.sim.hardware import GPUS
    from seawall.sim.loop import available_policies
    from seawall.sim.models import MODELS
    from seawall.sim.workloads import ARRIVALS, LENGTH_SOURCES

    sys.stdout.write(f"models:    {', '.join(m.name for m in MODELS.values())}\n"
                     f"gpus:      {', '.join(g.name for g in GPUS.values())}\n"
                     f"policies:  {', '.join(available_policies())}\n"
                     f"workloads: {', '.join(LENGTH_SOURCES)}\n"
                     f"arrivals:  {', '.join(ARRIVALS)}\n")
    return 0
