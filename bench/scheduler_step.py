"""Scheduler-core decision time per step with many running requests, for every policy (target: <= 2 ms at
512 running).

Drives the pure core with hand-made step results (no model): 512 requests decode while a 300-token prompt
arrives every 10 steps and finishes at once, with prefix caching on and a chunk budget of 512. Times
``schedule()`` + ``on_result()`` only (building the fake result is not counted) and prints the median and
p99 per policy. Steps run on the core's logical clock (no ``now``), as the offline engine drives it.
Usage: .venv/bin/python bench/scheduler_step.py [--running 512] [--steps 300] [--policy P ...] [--freeze-gc]
       [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.sampling_params import SamplingParams  # noqa: E402
from services.common.step import SampledToken, StepResult  # noqa: E402
from services.scheduler.core.block_manager import BlockManager  # noqa: E402
from services.scheduler.core.request import Request  # noqa: E402
from services.scheduler.core.scheduler import POLICIES, Scheduler, SchedulerConfig  # noqa: E402


def measure(policy: str, running: int, steps: int, freeze_gc: bool = False, speculative_tokens: int = 0) -> dict:
    s = Scheduler(SchedulerConfig(chunk_size=512, max_num_seqs=running + 64, max_model_len=1 << 20,
                                  policy=policy, num_speculative_tokens=speculative_tokens),
                  BlockManager(num_blocks=200_000, block_size=16))
    params = SamplingParams(max_tokens=1 << 20, temperature=0, ignore_eos=True)
    for i in range(running):
        s.add(Request(f"r{i}", [i % 50] * 64 + list(range(i, i + 64)), params, float(i)))
    for _ in range(3):  # admit everything (whole prompts for the policies that do not chunk)
        _step(s)
    times = []
    gc.collect()
    if freeze_gc:
        gc.freeze()  # the setup's objects leave the collector's view: no full collection walks them
    for k in range(steps):
        if k % 10 == 0:  # a prompt arrives every 10 steps and finishes at once
            s.add(Request(f"n{k}", list(range(k, k + 300)), SamplingParams(max_tokens=1), float(running + k)))
        times.append(_step(s))
    gc.unfreeze()
    s.check_integrity()
    times.sort()
    return {"policy": policy, "running": len(s.running), "median_ms": statistics.median(times) * 1e3,
            "p99_ms": times[int(0.99 * (len(times) - 1))] * 1e3}


def _step(s: Scheduler) -> float:
    """One step; returns the seconds spent in the core."""
    started = time.perf_counter()
    plan = s.schedule()
    spent = time.perf_counter() - started
    result = StepResult(plan.step_id)
    for rid, n in plan.num_scheduled_tokens.items():
        req = s.requests[rid]
        if req.num_computed_tokens + n >= req.num_tokens:
            # A decode verifying drafts keeps half of them (speculative decoding), plus its own token.
            result.sampled[rid] = [SampledToken(7)] * (1 + (req.num_computed_tokens + n - req.num_tokens) // 2)
    started = time.perf_counter()
    s.on_result(plan, result)
    return spent + time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--running", type=int, default=512)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--policy", action="append", choices=POLICIES, help="repeatable; default: all")
    ap.add_argument("--freeze-gc", action="store_true",
                    help="gc.freeze() after setup, to see the p99 without Python's full collections")
    ap.add_argument("--speculative-tokens", type=int, default=0,
                    help="speculative decoding: each decode may verify this many drafts (half of them kept)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [measure(p, args.running, args.steps, args.freeze_gc, args.speculative_tokens)
            for p in args.policy or POLICIES]
    print(f"schedule() + on_result() per step, {args.running} running, {args.steps} steps (target <= 2 ms)"
          + (f", {args.speculative_tokens} draft tokens a decode" if args.speculative_tokens else ""))
    print(f"{'policy':<20} {'running':>7} {'median ms':>10} {'p99 ms':>8}")
    for r in rows:
        verdict = "OK" if r["median_ms"] <= 2 else "NOT MET"
        print(f"{r['policy']:<20} {r['running']:>7} {r['median_ms']:>10.2f} {r['p99_ms']:>8.2f}  {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
