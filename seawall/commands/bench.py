"""``seawall bench``: load a mesh with bursty or trace-driven traffic and report client-side latency.

    seawall bench --address 127.0.0.1:50051 --rate 4 --num-requests 200        # a running mesh, over gRPC
    seawall bench --http http://127.0.0.1:8000 --arrival gamma --cv 3 --duration 60
    seawall bench --spawn --workload burst --policies vllm,sarathi --json out.json --html out.html
    seawall bench --spawn --lengths pareto --arrival bursts --burst-size 24 --policies fcfs,fastserve
    seawall bench --spawn --capacity --slo-tbt 0.1 --slo-ttft 2 --policies vllm,sarathi
    seawall bench --spawn --lengths azure-conv --arrival trace --time-scale 0.5 --length-scale 0.25

With --spawn the benchmark starts its own mesh (the `seawall up` flags below; colocated by default), one per
policy of --policies, runs the same workload (same seed: same arrivals, lengths and prompts) against each and
stops it. Requests are greedy with ignore_eos, so every output has exactly its length. Timings are printed,
never judged, except the issue's targets, which are printed as ratios when their policies ran.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from seawall.commands.numbers import fraction, non_negative, positive, whole
from seawall.commands.paths import check_output_file
from services.common.errors import InvalidArgument
from services.engine.config import add_kv_cache_dtype_flag


def _csv(kind):
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list: {exc}") from None
    return parse


def _add_target(p: argparse.ArgumentParser) -> None:
    from seawall.commands.up import add_worker_thread_flags
    from services.scheduler.main import add_lora_flags, add_scheduling_flags

    g = p.add_argument_group("target: a running mesh, or --spawn one per policy")
    g.add_argument("--address", default=None, help="gRPC address of a running mesh (HOST:PORT)")
    g.add_argument("--http", default=None, metavar="URL",
                   help="OpenAI API of a running mesh (http://HOST:PORT); stats need --address as well")
    g.add_argument("--spawn", action="store_true", help="start a mesh (per policy) with the flags below")
    g.add_argument("--api", choices=("grpc", "http"), default="grpc", help="with --spawn: which API to load")
    g.add_argument("--policies", type=_csv(str), default=None,
                   help="with --spawn: comma-separated policies, e.g. vllm,sarathi,fastserve,fastserve+sarathi; "
                   "ratios are to the first")
    g.add_argument("--model", default=None, help="checkpoint dir (default: the built-in model)")
    g.add_argument("--workers", type=int, default=1, help="hybrid workers when colocated (default 1)")
    g.add_argument("--prefill", type=int, default=1, help="prefill workers when disaggregated (default 1)")
    g.add_argument("--decode", type=int, default=1, help="decode workers when disaggregated (default 1)")
    add_scheduling_flags(g)
    g.add_argument("--device", default="auto", help="workers' torch device (default auto)")
    add_worker_thread_flags(g)
    g.add_argument("--kv-cache-bytes", type=whole(1), default=None, help="KV pool bytes per worker")
    add_kv_cache_dtype_flag(g)
    g.add_argument("--no-nixl", action="store_true", help="workers start no NIXL agent")
    g.add_argument("--no-cpu-kernels", action="store_true",
                   help="workers run CPU attention, norms and RoPE as plain torch ops, not the fused C kernels")
    g.add_argument("--kvcache", action="store_true", help="also start the kvcache service (multi-turn reuse)")
    add_lora_flags(g, runtime=False)
    g.add_argument("--mesh-log-dir", type=Path, default=None, help="where spawned services log (default: a temp dir)")
    p.set_defaults(mode="colocated")


def _add_workload(p: argparse.ArgumentParser) -> None:
    from seawall.bench.arrivals import PROCESSES
    from seawall.bench.workload import KINDS, LENGTHS

    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=KINDS, default="custom",
                   help="custom (the flags below), burst (M users decoding, then N long prompts at once) or "
                   "mooncake (the conversation trace as multi-turn sessions)")
    g.add_argument("--arrival", choices=PROCESSES, default="poisson", help="arrival process (default poisson)")
    g.add_argument("--rate", type=positive, default=None,
                   help="mean requests/s (default 4; with --arrival trace: rescale the trace to this rate)")
    g.add_argument("--cv", type=positive, default=None, help="gamma: coefficient of variation of the gaps (1 = Poisson)")
    g.add_argument("--burstiness", type=positive, default=None, help="gamma: vLLM's burstiness b, i.e. cv = 1/sqrt(b)")
    g.add_argument("--on-s", type=positive, default=2.0, help="onoff: on-period, s")
    g.add_argument("--off-s", type=non_negative, default=4.0, help="onoff: silence between on-periods, s")
    g.add_argument("--burst-size", type=whole(1), default=8,
                   help="bursts: requests per burst; burst workload: long prompts arriving at once (default 8)")
    g.add_argument("--burst-interval", type=non_negative, default=5.0, help="bursts: seconds between bursts")
    g.add_argument("--time-scale", type=positive, default=1.0, help="trace arrivals: multiply the trace's times")
    g.add_argument("--lengths", choices=LENGTHS, default="fixed", help="length source (default fixed)")
    g.add_argument("--prompt-len", type=whole(1), default=128, help="fixed/pareto: prompt tokens (default 128)")
    g.add_argument("--output-len", type=whole(1), default=64, help="fixed: output tokens (default 64)")
    g.add_argument("--pareto-alpha", type=positive, default=1.2, help="pareto/longtail: shape of output lengths")
    g.add_argument("--pareto-min", type=whole(1), default=8, help="pareto/longtail: the shortest output")
    g.add_argument("--max-output-len", type=whole(1), default=512, help="pareto/longtail: outputs capped here")
    g.add_argument("--length-scale", type=positive, default=1.0, help="trace lengths: multiply prompts and outputs")
    g.add_argument("--trace-offset", type=whole(0), default=0, help="traces: first row")
    g.add_argument("--max-model-len", type=whole(2), default=4096, help="prompt + output stay within this")
    g.add_argument("--steady-users", type=whole(1), default=16, help="burst: users decoding (default 16)")
    g.add_argument("--steady-prompt-len", type=whole(1), default=64)
    g.add_argument("--steady-output-len", type=whole(1), default=512)
    g.add_argument("--steady-ramp-s", type=non_negative, default=0.5, help="burst: the users start over this many s")
    g.add_argument("--burst-at", type=positive, default=3.0, help="burst: when the long prompts arrive, s")
    g.add_argument("--burst-prompt-len", type=whole(1), default=1024)
    g.add_argument("--burst-output-len", type=whole(1), default=16)
    g.add_argument("--block-tokens", type=whole(1), default=16, help="mooncake: tokens per 512-token trace block")
    g.add_argument("--shared-prefix-len", type=whole(0), default=0,
                   help="custom: every prompt, burst: every burst prompt starts with a system prompt of this "
                        "many tokens (default 0; vLLM bench's --random-prefix-len)")
    g.add_argument("--shared-prefix-groups", type=whole(1), default=1,
                   help="split those requests, in arrival order, into this many groups with a system prompt "
                        "each (default 1), e.g. one per burst")
    g.add_argument("--priority-mix", default="", metavar="P:SHARE,...",
                   help="send these shares of the requests (drawn from the seed) at these priorities, the "
                        "rest at 0; lower runs sooner, e.g. --priority-mix=-1:0.2 (a fifth urgent; the = keeps "
                        "the leading minus from reading as a flag). Latencies are reported per class")
    g.add_argument("--loras", type=_csv(str), default=None, metavar="NAME,...",
                   help="each request runs one of these LoRA adapters, drawn from the seed (default: with --spawn "
                        "and --lora-modules, those; else none: the base model)")
    g.add_argument("--num-requests", type=whole(1), default=64, help="requests to send (default 64)")
    g.add_argument("--duration", type=positive, default=None, help="send only for this many seconds instead")
    g.add_argument("--max-concurrency", type=whole(1), default=None, help="at most this many requests in flight")
    g.add_argument("--seed", type=int, default=0)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="load a mesh (bursts, traces) and report TTFT, TBT, stalls and goodput",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_target(p)
    _add_workload(p)
    g = p.add_argument_group("metrics, comparisons and reports")
    g.add_argument("--slo-ttft", type=positive, default=None, help="TTFT SLO, s (goodput, capacity)")
    g.add_argument("--slo-tbt", type=positive, default=None, help="TBT SLO, s: a request's p99 gap (goodput); the "
                   "run's p99 TBT (capacity)")
    g.add_argument("--rates", type=_csv(positive), default=None, help="run at each of these rates (latency vs load)")
    g.add_argument("--capacity", action="store_true", help="binary-search the highest rate within the SLOs")
    g.add_argument("--start-rate", type=positive, default=1.0, help="capacity: first probe, requests/s")
    g.add_argument("--capacity-probes", type=whole(1), default=8, help="capacity: at most this many probes")
    g.add_argument("--capacity-tolerance", type=fraction, default=0.1, help="capacity: stop within this fraction")
    g.add_argument("--hf-baseline", action="store_true",
                   help="also run the requests through transformers (continuous batching) on the same weights")
    g.add_argument("--hf-max-batch", type=whole(1), default=64, help="transformers: requests per batch")
    g.add_argument("--no-burst-control", action="store_true",
                   help="burst workload: skip the control run without the burst (it gives the steady state at "
                        "the burst's own tokens: burst_tbt_ratio_control)")
    g.add_argument("--repeats", type=whole(1), default=1,
                   help="run every policy this many times, round by round, alternating their order; the targets "
                        "are judged on the median of their per-round figures (ratios within a round), so that one "
                        "run on a busier minute does not decide them (default 1)")
    g.add_argument("--warmup", type=whole(0), default=4, help="warm-up requests before timing (default 4)")
    g.add_argument("--json", type=Path, default=None, help="write the report here")
    g.add_argument("--html", type=Path, default=None, help="write an HTML report with plots here")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def workload_spec(args: argparse.Namespace):
    from seawall.bench.arrivals import ArrivalSpec
    from seawall.bench.workload import WorkloadSpec, parse_priority_mix

    if args.cv is not None and args.burstiness is not None:
        raise InvalidArgument("give --cv or --burstiness, not both")
    cv = args.cv if args.cv is not None else (args.burstiness ** -0.5 if args.burstiness else 1.0)
    rate = args.rate if args.rate is not None else 4.0
    arrivals = ArrivalSpec(process=args.arrival, rate=rate, cv=cv, on_s=args.on_s, off_s=args.off_s,
                           burst_size=args.burst_size, burst_interval=args.burst_interval)
    return WorkloadSpec(
        kind=args.workload, arrivals=arrivals, num_requests=args.num_requests, duration=args.duration,
        seed=args.seed, max_model_len=args.max_model_len, lengths=args.lengths, prompt_len=args.prompt_len,
        output_len=args.output_len, pareto_alpha=args.pareto_alpha, pareto_min=args.pareto_min,
        max_output_len=args.max_output_len, length_scale=args.length_scale, time_scale=args.time_scale,
        trace_rate=args.rate if args.arrival == "trace" else None, trace_offset=args.trace_offset,
        steady_users=args.steady_users, steady_prompt_len=args.steady_prompt_len,
        steady_output_len=args.steady_output_len, steady_ramp_s=args.steady_ramp_s, burst_at=args.burst_at, burst_size=args.burst_size,
        burst_prompt_len=args.burst_prompt_len, burst_output_len=args.burst_output_len,
        block_tokens=args.block_tokens, shared_prefix_len=args.shared_prefix_len,
        shared_prefix_groups=args.shared_prefix_groups, priority_mix=parse_priority_mix(args.priority_mix),
        lora_names=tuple(args.loras or (name for name, _ in args.lora_modules)))


def mesh_options(args: argparse.Namespace, policy: str):
    """The spawned mesh for one policy: free ports, HTTP only with --api http, kvcache only with --kvcache."""
    from seawall.commands.up import checked_lora_flags, worker_thread_args
    from seawall.launcher import MeshOptions
    from services.scheduler.main import core_config_from, scheduling_flags

    core_config_from(args)  # a bad scheduling flag is refused before any mesh starts
    sched = scheduling_flags(args, policy) + checked_lora_flags(args)
    workers = ["--device", args.device] + (["--kv-cache-bytes", str(args.kv_cache_bytes)] if args.kv_cache_bytes
                                           else []) + (["--no-nixl"] if args.no_nixl else [])
    workers += ["--no-cpu-kernels"] if args.no_cpu_kernels else []
    workers += ["--kv-cache-dtype", args.kv_cache_dtype] + worker_thread_args(args)
    colocated = args.mode == "colocated"
    return MeshOptions(model=args.model, mode=args.mode, num_prefill=0 if colocated else args.prefill,
                       num_decode=args.workers if colocated else args.decode, grpc_port=0,
                       http_port=0 if args.api == "http" else None, scheduler_args=sched, worker_args=workers,
                       kvcache=args.kvcache, kvcache_args=["--no-nixl"] if args.no_nixl else [],
                       torch_threads=args.torch_threads)


def mesh_flags(args: argparse.Namespace) -> list[str]:
    from services.scheduler.main import chunk_size

    chunk = chunk_size(args)
    flags = [f"--mode {args.mode}", *([f"--chunk-size {chunk}"] if chunk else []), f"--max-num-seqs {args.max_num_seqs}"]
    flags.append(f"--workers {args.workers}" if args.mode == "colocated" else
                 f"--prefill {args.prefill} --decode {args.decode}")
    if args.decode_steps != 1:
        flags.append(f"--decode-steps {args.decode_steps}")
    if args.speculative_tokens:
        flags.append(f"--speculative-tokens {args.speculative_tokens}")
    for name in ("tbt_target_s", "max_num_batched_tokens", "preemption_mode", "kv_cache_bytes", "torch_threads"):
        if getattr(args, name):
            flags.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    flags += ["--no-cpu-kernels"] if args.no_cpu_kernels else []
    flags += [f"--kv-cache-dtype {args.kv_cache_dtype}"] if args.kv_cache_dtype != "auto" else []
    flags += [f"--step-thread {args.step_thread}"] if args.step_thread != "auto" else []
    flags += [f"--lora-modules {' '.join(f'{n}={p}' for n, p in args.lora_modules)}"] if args.lora_modules else []
    return (flags + (["--no-prefix-caching"] if args.no_prefix_caching else [])
            + (["--no-peer-prefix"] if args.no_peer_prefix else []))


def mesh_factory(args: argparse.Namespace):
    from seawall.launcher import LocalMesh

    logs = args.mesh_log_dir or Path(tempfile.mkdtemp(prefix="seawall-bench-"))

    starts: dict[str, int] = {}

    def start(policy: str) -> LocalMesh:
        options = mesh_options(args, policy)
        # one directory per mesh: with --repeats a policy's later meshes get -2, -3, ...
        starts[policy] = n = starts.get(policy, 0) + 1
        options.log_dir = logs / (policy.replace("+", "-") + (f"-{n}" if n > 1 else ""))
        mesh = LocalMesh(options)
        mesh.start()
        return mesh

    return start


def run(args: argparse.Namespace) -> int:
    from seawall.bench import report as rep
    from seawall.bench.session import BenchOptions, run_bench

    check_output_file(args.json, "--json")
    check_output_file(args.html, "--html")
    targets = sum(bool(x) for x in (args.address or args.http, args.spawn))
    if targets != 1:
        raise InvalidArgument("give either --spawn or the mesh to load (--address HOST:PORT and/or --http URL)")
    if args.policies and not args.spawn:
        raise InvalidArgument("--policies needs --spawn (one mesh per policy)")
    policies = args.policies or ([args.policy] if args.spawn else [])
    from services.scheduler.core.scheduler import POLICIES

    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise InvalidArgument(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    opts = BenchOptions(
        workload=workload_spec(args), address=args.address, http=args.http or ("spawn" if args.api == "http" and
                                                                              args.spawn else None),
        policies=policies, rates=args.rates or [], capacity=args.capacity, start_rate=args.start_rate,
        capacity_probes=args.capacity_probes, capacity_tolerance=args.capacity_tolerance, slo_ttft=args.slo_ttft,
        slo_tbt=args.slo_tbt, max_concurrency=args.max_concurrency, warmup=args.warmup,
        progress=not args.no_progress, burst_control=not args.no_burst_control, hf_baseline=args.hf_baseline,
        hf_max_batch=args.hf_max_batch, repeats=args.repeats,
        model_dir=args.model, mesh_flags=mesh_flags(args) if args.spawn else [])
    # A SIGTERM unwinds like Ctrl-C, so the meshes a --spawn run started are stopped, not orphaned.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)) if args.spawn else None
    try:
        report, runs, controls = run_bench(opts, mesh_factory(args) if args.spawn else None)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(f"workload: {report['workload']['description']}")
    if args.repeats > 1:
        print(f"(the tables are round 1 of {args.repeats}; the targets below are judged on all rounds)")
    print(rep.format_table(report["results"], report["ratios"]))
    classes = rep.priority_table(report["results"])
    if classes:
        print(f"\nby priority (lower runs sooner):\n{classes}")
    if any(len(s) > 1 for s in report["sweep"].values()):
        print("\nlatency vs load:")
        print(rep.format_table({f"{n} @ {s['rate']:g}/s": s for n, runs in report["sweep"].items() for s in runs}))
    for name, c in report["capacity"].items():
        upper = (f"failed at {c['upper_rate']:.3g}" if c["upper_failed"] else
                 "a lower bound: the probes ran out before one failed")
        print(f"capacity {name}: {c['capacity_rate']:.3g} req/s ({upper}; {len(c['probes'])} probes)")
    for line in rep.format_targets(report):
        print(line)
    for note in report["notes"]:
        print(f"note: {note}")
    if args.json:
        rep.write_json(args.json, report)
    if args.html:
        rep.write_html(args.html, report, runs, controls)
    if args.json or args.html:
        print(f"wrote {', '.join(str(p) for p in (args.json, args.html) if p)}", file=sys.stderr)
    return 0 if any(r["num_finished"] for r in report["results"].values()) else 1
