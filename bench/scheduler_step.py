"""Scheduler-core decision time per step with many running requests (target: <= 2 ms at 512 running).

Drives the pure core with hand-made step results (no model): 512 requests decode while a stream of new
prompts arrives, with prefix caching on; prints the median and p99 of ``schedule()`` + ``on_result()``.
Usage: .venv/bin/python bench/scheduler_step.py [--running 512] [--steps 300] [--json OUT]
"""

from __future__ import annotations

import argparse
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
from services.scheduler.core.scheduler import Scheduler, SchedulerConfig  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--running", type=int, default=512)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    s = Scheduler(SchedulerConfig(chunk_size=512, max_num_seqs=args.running + 64, max_model_len=1 << 20),
                  BlockManager(num_blocks=200_000, block_size=16))
    params = SamplingParams(max_tokens=1 << 20, temperature=0, ignore_eos=True)
    for i in range(args.running):
        s.add(Request(f"r{i}", [i % 50] * 64 + list(range(i, i + 64)), params, float(i)))
    _step(s)  # admit everything
    times = []
    for k in range(args.steps):
        if k % 10 == 0:  # a prompt arrives every 10 steps and finishes at once
            s.add(Request(f"n{k}", list(range(k, k + 300)), SamplingParams(max_tokens=1), float(args.running + k)))
        started = time.perf_counter()
        _step(s)
        times.append(time.perf_counter() - started)
    s.check_integrity()
    times.sort()
    med, p99 = statistics.median(times) * 1e3, times[int(0.99 * (len(times) - 1))] * 1e3
    print(f"running={len(s.running)}  schedule+on_result per step: median {med:.2f} ms, p99 {p99:.2f} ms "
          f"(target <= 2 ms) -> {'OK' if med <= 2 else 'NOT MET'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"running": len(s.running), "median_ms": med, "p99_ms": p99}))
    return 0


def _step(s: Scheduler) -> None:
    plan = s.schedule()
    result = StepResult(plan.step_id)
    for rid, n in plan.num_scheduled_tokens.items():
        req = s.requests[rid]
        if req.num_computed_tokens + n == req.num_tokens:
            result.sampled[rid] = SampledToken(7)
    s.on_result(plan, result)


if __name__ == "__main__":
    sys.exit(main())
