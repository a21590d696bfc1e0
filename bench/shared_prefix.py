"""A burst sharing one system prompt, in process: tokens the forward passes computed, prefix-cache hits, time.

16 requests of one 512-token system prompt + 32 tokens of their own arrive together and decode 16 tokens
each, under the policies whose admission puts several prompts in one step. Requests that share blocks a
request in the same step computes wait a step for them (services/scheduler/core/shared_prefix.py); the
tokens computed show what that saves, deterministically (the seconds are this box's).

    .venv/bin/python bench/shared_prefix.py [--requests 16] [--system-len 512]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.builtin_model import ensure_default_model  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--system-len", type=int, default=512)
    args = p.parse_args()
    rng = random.Random(0)
    system = [rng.randrange(3, 4000) for _ in range(args.system_len)]
    prompts = [system + [rng.randrange(3, 4000) for _ in range(32)] for _ in range(args.requests)]
    params = [SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)] * args.requests
    print(f"{args.requests} requests x ({args.system_len} shared + 32) prompt tokens, 16 output tokens")
    for policy, chunk in (("vllm", None), ("sarathi", 2048), ("sarathi", 512)):
        engine = OfflineEngine(EngineConfig(model=str(ensure_default_model()), kv_cache_bytes=64 << 20),
                               SchedulerConfig(chunk_size=chunk, policy=policy, num_decode_steps=1))
        computed = 0
        execute = engine.runner.execute

        def counted(plan, execute=execute):
            nonlocal computed
            computed += sum(plan.num_scheduled_tokens.values())
            return execute(plan)

        engine.runner.execute = counted
        t = time.perf_counter()
        engine.generate(prompts, params)
        print(f"{policy:8} chunk {chunk!s:>5}: {computed:6d} tokens computed, "
              f"{engine.scheduler.prefix_stats.hit_blocks:4d} blocks from the prefix cache, "
              f"{time.perf_counter() - t:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
