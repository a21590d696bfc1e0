"""What freeing the blocks behind a sliding window buys: the same workload on a sliding-window model with a
small KV pool, once with the core freeing each request's blocks as they fall out of the window (what the
engine does) and once keeping every block (what an engine does that only masks the window), in process, in
the same run.

The built-in model's weights as a Mistral checkpoint attending within ``--window`` (256) keys; ``--batch``
(24) requests of ``--prompt-len`` (1024) random token ids each generate ``--output-len`` (128) tokens
greedily (``ignore_eos``) on a pool of ``--pool-blocks`` (256) blocks of 16 tokens, chunked prefill of
``--chunk-size`` (256). Kept whole, a request needs 72 blocks, so 3 run at once; freed behind its window,
about 20. Rounds alternate the settings; printed per setting: the median tokens/s (ratio to keeping every
block), the most requests running in one step, the most blocks in use, and the preemptions. Outputs must be
identical in both settings (they are checked).

    .venv/bin/python bench/sliding_window.py [--window 256] [--pool-blocks 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.watched_run import alternating_rounds  # noqa: E402
from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.block_hash import hash_seed  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.builtin_model import ensure_default_model, with_sliding_window  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.block_manager import BlockManager  # noqa: E402
from services.scheduler.core.scheduler import Scheduler, SchedulerConfig  # noqa: E402


def keep_every_block(engine: OfflineEngine) -> None:
    """The engine's core rebuilt without the window: attention is still windowed, no block is freed."""
    old = engine.scheduler
    engine.blocks = BlockManager(engine.runner.kv.num_blocks, old.blocks.block_size)
    engine.scheduler = Scheduler(replace(old.config, sliding_window=None), engine.blocks, old.host_blocks,
                                 hash_seed=hash_seed(str(engine.checkpoint.path), old.blocks.block_size))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--batch", type=int, default=24)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--pool-blocks", type=int, default=256)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 4000) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    params = [SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)] * args.batch
    with tempfile.TemporaryDirectory() as tmp:
        model = with_sliding_window(ensure_default_model(), Path(tmp) / "windowed", args.window,
                                    max_position_embeddings=8192)
        probe = OfflineEngine(EngineConfig(model=str(model), kv_cache_bytes=1 << 20))
        pool = args.pool_blocks * probe.runner.layout.bytes_per_block
        # No prefix caching: every round computes its prompts, whichever setting ran before.
        config = SchedulerConfig(chunk_size=args.chunk_size, enable_prefix_caching=False)
        engines = {name: OfflineEngine(EngineConfig(model=str(model), kv_cache_bytes=pool), config)
                   for name in ("blocks kept", "window freed")}
        keep_every_block(engines["blocks kept"])
        results, outputs = alternating_rounds(engines, prompts, params, args.rounds)
    if outputs["blocks kept"] != outputs["window freed"]:
        print("outputs differ between the settings", file=sys.stderr)
        return 1
    base = statistics.median(f[0] for f in results["blocks kept"])
    print(f"({args.batch} x ({args.prompt_len} + {args.output_len}) tokens, window {args.window}, pool "
          f"{args.pool_blocks} blocks of 16, chunk {args.chunk_size}; median of {args.rounds} rounds; outputs "
          "identical)")
    print(f"{'setting':14} {'tok/s':>8} {'ratio':>7} {'running':>8} {'blocks':>7} {'preempted':>10}")
    for name, figures in results.items():
        rate = statistics.median(f[0] for f in figures)
        running, blocks, preempted = (max(f[i] for f in figures) for i in (1, 2, 3))
        print(f"{name:14} {rate:8.0f} {rate / base:6.2f}x {running:8} {blocks:7} {preempted:10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
