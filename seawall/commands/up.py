"""``seawall up``: start Seawall on the built-in model (or ``--model DIR``).

Until the gRPC mesh lands (scheduler, prefill, decode and kvcache as processes), this runs the same engine
and scheduler core in one process and streams completions for prompts typed on stdin (or given with
``--prompt``), so the quick start shows the real model, tokenizer, chunked prefill and sampling at work.
"""

from __future__ import annotations

import argparse
import sys
import time

from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.scheduler.core.scheduler import SchedulerConfig

EXAMPLES = ["The quick brown fox", "def fibonacci(n):", "Burst traffic is"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start Seawall on the built-in model (in-process until the mesh lands)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="Hugging Face checkpoint dir (default: the built-in model)")
    p.add_argument("--prompt", action="append", default=None, help="prompt to complete (repeatable)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--chunk-size", type=int, default=256, help="prompt tokens per step (default 256)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from seawall.offline.engine import OfflineEngine

    started = time.perf_counter()
    engine = OfflineEngine(EngineConfig(model=args.model), SchedulerConfig(chunk_size=args.chunk_size))
    print(f"seawall: model {engine.checkpoint.path} ready in {time.perf_counter() - started:.1f}s "
          f"({engine.runner.kv.num_blocks} KV blocks of {engine.runner.config.block_size} tokens, "
          f"{engine.runner.device})")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    prompts = args.prompt or (EXAMPLES if not sys.stdin.isatty() else [])
    if prompts:
        _complete(engine, prompts, params)
        return 0
    print("type a prompt and press Enter (Ctrl-D to quit)")
    for line in sys.stdin:
        if line.strip():
            _complete(engine, [line.rstrip("\n")], params)
    return 0


def _complete(engine, prompts: list[str], params: SamplingParams) -> None:
    started = time.perf_counter()
    outs = engine.generate([engine.encode(p) for p in prompts], [params] * len(prompts))
    elapsed = time.perf_counter() - started
    for prompt, out in zip(prompts, outs, strict=True):
        print(f"\n>>> {prompt}\n{out.text!r}  [{len(out.token_ids)} tokens, {out.finish_reason}]")
    total = sum(len(o.token_ids) for o in outs)
    print(f"\n{total} tokens in {elapsed:.2f}s ({total / max(elapsed, 1e-9):.0f} tok/s, batched)")
