"""FastServe against FCFS request by request, in the simulator, on `seawall bench`'s long-tail workload.

The same workload `seawall bench` sends (``seawall.bench.workload``, same seed: same arrivals and lengths) runs
through the scheduler core under ``fcfs`` and each variant, on a linear step-time model shaped like the
built-in tiny model behind the live mesh (a step's fixed cost dominates). The core keeps its default
step-time model, as the live scheduler does. Per variant and seed it prints the mean-E2E gain over fcfs
(fcfs mean / variant mean) and how many requests took more than 1.5x their own fcfs E2E, with the worst.

    .venv/bin/python bench/fastserve_fairness.py --seeds 0 1 2 3 4 \\
        --variants fastserve fastserve:max_wait_ratio=0.5 fastserve:max_wait_ratio=0.25,wait_slack_s=0.05

A variant is ``POLICY[:FIELD=VALUE,...]``, the fields being ``MLFQConfig``'s (``none`` for None).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fastserve_oracles import ClairvoyantMLFQ, ExactCreditMLFQ  # noqa: E402

from seawall.bench.arrivals import ArrivalSpec  # noqa: E402
from seawall.bench.workload import WorkloadSpec, build  # noqa: E402
from seawall.sim.cost_model import LinearCostModel  # noqa: E402
from seawall.sim.loop import SimConfig, Simulation  # noqa: E402
from seawall.sim.workloads import RequestSpec  # noqa: E402
from services.scheduler.core.config import MLFQConfig  # noqa: E402
from services.scheduler.core.step_time import StepTimeModel  # noqa: E402

BASELINE = "fcfs"


def parse_variant(text: str) -> tuple[str, MLFQConfig]:
    policy, _, fields = text.partition(":")
    types = {f.name: f.type for f in dataclasses.fields(MLFQConfig)}
    values = {}
    for item in filter(None, fields.split(",")):
        name, _, raw = item.partition("=")
        if name not in types:
            raise SystemExit(f"unknown MLFQConfig field {name!r} in {text!r}")
        kind = str(types[name])  # the annotation, as text
        if raw.lower() == "none" and "None" in kind:
            values[name] = None
        elif kind.startswith("bool"):
            values[name] = raw.lower() in ("1", "true", "yes")
        elif kind.startswith("int"):
            values[name] = int(raw)
        elif kind.startswith("str"):
            values[name] = raw
        else:
            values[name] = float(raw)
    return policy, MLFQConfig(**values)


def workload(args: argparse.Namespace, seed: int) -> list[RequestSpec]:
    spec = WorkloadSpec(arrivals=ArrivalSpec(process="gamma", rate=args.rate, cv=args.cv),
                        num_requests=args.num_requests, seed=seed, lengths="pareto", prompt_len=args.prompt_len,
                        pareto_alpha=args.pareto_alpha, pareto_min=args.pareto_min,
                        max_output_len=args.max_output_len)
    return [RequestSpec(r.arrival, len(r.prompt), r.max_tokens) for r in build(spec).requests]


def run(args: argparse.Namespace, specs: list[RequestSpec], policy: str, mlfq: MLFQConfig,
        oracle=None) -> dict[str, dict]:
    """Per-request records of one simulation; ``oracle(mlfq)`` replaces the fastserve policy's MLFQ."""
    cost = LinearCostModel(args.step_base_ms / 1e3, args.step_per_token_ms / 1e3)
    cfg = SimConfig(policy=policy, max_num_seqs=args.max_num_seqs, num_gpu_blocks=args.num_gpu_blocks,
                    mlfq=mlfq, step_time=StepTimeModel(), record_requests=True)
    sim = Simulation(cfg, specs, cost)
    if oracle is not None:
        sim.core.policy.mlfq = oracle(sim.core.policy.mlfq)
    return {r["id"]: r for r in sim.run()["requests"]}


def e2e(args: argparse.Namespace, specs: list[RequestSpec], policy: str, mlfq: MLFQConfig,
        oracle=None) -> dict[str, float]:
    return {rid: r["e2e"] for rid, r in run(args, specs, policy, mlfq, oracle).items()}


def oracles(args: argparse.Namespace, fcfs: dict[str, dict]) -> dict[str, object]:
    wait = {rid: r["sched_delay"] for rid, r in fcfs.items()}
    latency = {rid: r["e2e"] for rid, r in fcfs.items()}
    step_s = args.step_base_ms / 1e3
    return {
        "oracle:exact-credit": lambda m: ExactCreditMLFQ(m, wait),
        "oracle:clairvoyant": lambda m: ClairvoyantMLFQ(m, latency, step_s, 0.0),
        "oracle:clairvoyant,margin=0.1s": lambda m: ClairvoyantMLFQ(m, latency, step_s, 0.1),
        "oracle:srpt": lambda m: ClairvoyantMLFQ(m, latency, step_s, -float("inf")),
    }


def compare(base: dict[str, float], other: dict[str, float]) -> dict[str, float]:
    """``gain``: fcfs mean E2E over the variant's; ``worse``: requests over 1.5x their own fcfs E2E."""
    ratios = [other[rid] / base[rid] for rid in base]
    mean = statistics.fmean(other.values())
    return {"mean": mean, "gain": statistics.fmean(base.values()) / mean, "worse": sum(x > 1.5 for x in ratios),
            "worst": max(ratios)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["fastserve"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--rate", type=float, default=16.0)
    p.add_argument("--cv", type=float, default=4.0)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--pareto-alpha", type=float, default=1.1)
    p.add_argument("--pareto-min", type=int, default=8)
    p.add_argument("--max-output-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--num-gpu-blocks", type=int, default=8192, help="KV pool (default: no block pressure)")
    p.add_argument("--step-base-ms", type=float, default=6.2, help="fixed cost of a step (the live mesh: ~6-7 ms)")
    p.add_argument("--step-per-token-ms", type=float, default=0.06, help="cost per token in a step")
    p.add_argument("--oracles", action="store_true",
                   help="also run schedulers that know each request's FCFS latency (and length): fastserve_oracles.py")
    args = p.parse_args()

    variants = [(v, *parse_variant(v)) for v in args.variants]
    width = max(len(v) for v in [*args.variants, "oracle:clairvoyant,margin=0.1s"])
    sys.stdout.write(f"{'variant':{width}s}  {'seed':>4s}  {'E2E s':>6s}  {'gain':>6s}  {'>1.5x':>5s}  {'worst':>6s}\n")
    totals: dict[str, list[dict]] = {}
    for seed in args.seeds:
        specs = workload(args, seed)
        fcfs = run(args, specs, BASELINE, MLFQConfig())
        base = {rid: r["e2e"] for rid, r in fcfs.items()}
        sys.stdout.write(f"{BASELINE:{width}s}  {seed:4d}  {statistics.fmean(base.values()):6.2f}\n")
        runs = [(name, policy, mlfq, None) for name, policy, mlfq in variants]
        if args.oracles:
            runs += [(name, "fastserve", MLFQConfig(), o) for name, o in oracles(args, fcfs).items()]
        for name, policy, mlfq, oracle in runs:
            c = compare(base, e2e(args, specs, policy, mlfq, oracle))
            totals.setdefault(name, []).append(c)
            sys.stdout.write(f"{name:{width}s}  {seed:4d}  {c['mean']:6.2f}  {c['gain']:5.2f}x  {c['worse']:5d}  "
                             f"{c['worst']:5.2f}x\n")
    sys.stdout.write("\nover all seeds: min gain, mean gain, requests > 1.5x (total), worst\n")
    for name, rows in totals.items():
        sys.stdout.write(f"{name:{width}s}  {min(r['gain'] for r in rows):5.2f}x  "
                         f"{statistics.fmean(r['gain'] for r in rows):5.2f}x  {sum(r['worse'] for r in rows):5d}  "
                         f"{max(r['worst'] for r in rows):5.2f}x\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
