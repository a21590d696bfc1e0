"""Multi-turn conversations on a hybrid model (linear attention), in process: prefix caching by saved states
against none, in one run on the same weights.

Each of ``--conversations`` conversations starts from a system prompt of its own, and each turn's prompt is
the turn before's prompt, its output and a new message, as an agent's context grows. A model with linear
layers resumes a cached prefix only from a state its worker saved there (services/scheduler/core/
state_checkpoints.py): the end of each prompt's last full block, and the latest block its outputs filled. The
run with ``--state-checkpoints`` slots is compared with one without any (0: every turn runs its whole
context), for the tokens the forward passes computed and the seconds it took; outputs must be identical.

    .venv/bin/python bench/hybrid_checkpoint.py /tmp/q35
    .venv/bin/python bench/hybrid_prefix.py --model /tmp/q35 [--shared-system]

With ``--shared-system`` every conversation starts from the same system prompt: the prompts part after it, and
the state saved at that branch point spares the other conversations' first turns its tokens.
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
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402


def run(model: str, checkpoints: int, args: argparse.Namespace) -> tuple[int, int, float, list[list[int]]]:
    """(tokens computed, prompt tokens served from the cache, seconds, every turn's output)."""
    engine = OfflineEngine(EngineConfig(model=model, dtype="float32", kv_cache_bytes=256 << 20,
                                        state_checkpoints=checkpoints,
                                        host_state_checkpoints=args.host_state_checkpoints if checkpoints else 0),
                           SchedulerConfig(enable_prefix_caching=True, chunk_size=args.chunk_size))
    computed = 0
    execute = engine.runner.execute

    def counted(plan):
        nonlocal computed
        computed += sum(plan.num_scheduled_tokens.values())
        return execute(plan)

    engine.runner.execute = counted
    rng = random.Random(0)
    contexts = [[rng.randrange(3, 4000) for _ in range(args.system_len)] for _ in range(args.conversations)]
    if args.shared_system:  # one system prompt for all: they part after it (a branch point, state_checkpoints.py)
        contexts = [list(contexts[0]) for _ in contexts]
    params = [SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)] * args.conversations
    outputs, cached = [], 0
    started = time.perf_counter()
    for _ in range(args.turns):
        prompts = [c + [rng.randrange(3, 4000) for _ in range(args.message_len)] for c in contexts]
        done = engine.generate(prompts, params)
        cached += sum(c.num_cached_prompt_tokens for c in done)
        outputs += [c.token_ids for c in done]
        contexts = [p + c.token_ids for p, c in zip(prompts, done, strict=True)]
    return computed, cached, time.perf_counter() - started, outputs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a hybrid checkpoint (bench/hybrid_checkpoint.py writes one)")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-len", type=int, default=512)
    p.add_argument("--message-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--state-checkpoints", type=int, default=16)
    p.add_argument("--shared-system", action="store_true", help="every conversation starts from one system prompt")
    p.add_argument("--host-state-checkpoints", type=int, default=64,
                   help="more saved states in host memory, where the device's least recently used go (default 64)")
    args = p.parse_args()
    print(f"{args.conversations} conversations x {args.turns} turns: system {args.system_len}"
          f"{' (shared)' if args.shared_system else ''}, +{args.message_len} a turn, {args.output_len} out")
    base = run(args.model, 0, args)
    saved = run(args.model, args.state_checkpoints, args)
    with_slots = f"{args.state_checkpoints} + {args.host_state_checkpoints} host"
    for name, (computed, cached, seconds, _) in (("no state checkpoints", base), (with_slots, saved)):
        print(f"{name:22}: {computed:6d} tokens computed, {cached:6d} prompt tokens cached, {seconds:6.2f} s")
    print(f"tokens computed {base[0] / saved[0]:.2f}x fewer, {base[2] / saved[2]:.2f}x faster; "
          f"outputs identical: {base[3] == saved[3]}")
    return 0 if base[3] == saved[3] else 1


if __name__ == "__main__":
    sys.exit(main())
