"""What speculative decoding (n-gram drafts, ``--speculative-tokens``) gains or costs: tokens/s of one workload
with and without it, in process, in the same run, outputs compared token for token.

``--batch`` concurrent requests (1, 8, 64 by default) of ``--prompt-len`` (64) random token ids, each generating
greedily ``--output-len`` (256) tokens (``ignore_eos``), through ``OfflineEngine`` (the engine a worker runs),
with ``num_speculative_tokens`` 0 and ``--k`` (5), on two models:

* ``tiny`` — the built-in model: random weights, output with little repetition, so drafts are rare and
  mostly rejected: what speculating costs when it does not pay;
* ``looping`` — the same weights without attention output (o_proj zero), whose greedy output falls into a
  loop within a few tokens: what it gains when drafts are right (a stand-in for outputs that copy their
  context, such as code edits, which a random-weight model cannot produce).

Rounds alternate the two settings; the median tokens/s of each is printed with the ratio, the share of drafts
kept and the engine steps each took (prompt steps included). Multi-step decoding is off in both, so the ratio is speculation's own.

    .venv/bin/python bench/speculative.py [--batch 1,8,64] [--k 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.builtin_model import ensure_default_model, without_attention_output  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.scheduler import DraftStats, SchedulerConfig  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="1,8,64", help="concurrent requests, comma-separated")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--k", type=int, default=5, help="most drafts per decode per step")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tiny = ensure_default_model()
    with tempfile.TemporaryDirectory() as tmp:
        models = {"tiny": tiny, "looping": without_attention_output(tiny, Path(tmp) / "looping")}
        print(f"(batch x ({args.prompt_len} + {args.output_len}) tokens, greedy; k = {args.k}; median of "
              f"{args.rounds} rounds)")
        print(f"{'model':8} {'batch':>5} {'off tok/s':>10} {'on tok/s':>10} {'on/off':>7} {'kept':>6} "
              f"{'steps off/on':>12}  outputs")
        for name, model_dir in models.items():
            engines = {k: OfflineEngine(EngineConfig(model=str(model_dir), kv_cache_bytes=128 << 20),
                                        SchedulerConfig(chunk_size=512, enable_prefix_caching=False,
                                                        num_speculative_tokens=k)) for k in (0, args.k)}
            for batch in (int(b) for b in args.batch.split(",")):
                rng = random.Random(batch)
                prompts = [[rng.randrange(3, 4000) for _ in range(args.prompt_len)] for _ in range(batch)]
                params = [SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)] * batch
                rates: dict[int, list[float]] = {k: [] for k in engines}
                outputs, steps = {}, {}
                for r in range(args.rounds + 1):  # round 0 warms up
                    for k in (list(engines) if r % 2 else list(engines)[::-1]):
                        engine = engines[k]
                        engine.scheduler.draft_stats = DraftStats()  # this round's
                        step0 = engine.scheduler._step_id
                        t = time.perf_counter()
                        out = engine.generate(prompts, params)
                        elapsed = time.perf_counter() - t
                        outputs[k], steps[k] = [c.token_ids for c in out], engine.scheduler._step_id - step0
                        if r:
                            rates[k].append(sum(map(len, outputs[k])) / elapsed)
                off, on = (statistics.median(rates[k]) for k in engines)
                spec = engines[args.k]
                kept = spec.scheduler.draft_stats.kept / max(1, spec.scheduler.draft_stats.drafted)
                same = "identical" if outputs[0] == outputs[args.k] else "DIFFERENT"
                print(f"{name:8} {batch:5} {off:10.0f} {on:10.0f} {on / off:6.2f}x {kept:6.0%} "
                      f"{steps[0]:>5} / {steps[args.k]:<5}  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
