"""What an activated LoRA (aLoRA) saves: the base model's cached context serves it up to its invocation, where a
plain LoRA of the same weights recomputes the whole prompt under the adapter.

``--contexts`` (8) contexts of ``--context-len`` (2048) random token ids are run once on the base model (a
conversation so far); then each gets a turn under an adapter: the context, the adapter's invocation tokens and
``--turn-len`` (16) more, one output token. The same rank-``--rank`` weights are written twice in PEFT's format,
once as an aLoRA (``alora_invocation_tokens``) and once as a plain LoRA; rounds alternate the two (each round on
a fresh engine, the contexts cached first). Prints each one's median time for the turns, prompt tokens served
from the cache, and the ratio.

    .venv/bin/python bench/alora.py [--contexts 8] [--context-len 2048] [--rounds 3] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lora import write_adapter  # noqa: E402
from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.common.step import LoraRef  # noqa: E402
from services.engine.builtin_model import ensure_default_model  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.engine.model_config import ModelConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402

INVOCATION = [301, 302, 303]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=int, default=8)
    p.add_argument("--context-len", type=int, default=2048)
    p.add_argument("--turn-len", type=int, default=16)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=None, help="a checkpoint directory (default: the built-in model)")
    args = p.parse_args()
    model = args.model or ensure_default_model()
    shape = ModelConfig.from_dir(model).lora_shape
    rng = random.Random(0)
    contexts = [[rng.randrange(400, 4000) for _ in range(args.context_len)] for _ in range(args.contexts)]
    turns = [c + INVOCATION + [rng.randrange(400, 4000) for _ in range(args.turn_len)] for c in contexts]
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        plain = write_adapter(Path(tmp) / "plain", shape, args.rank, seed=1)
        activated = Path(tmp) / "activated"
        shutil.copytree(plain, activated)
        cfg = json.loads((activated / "adapter_config.json").read_text())
        (activated / "adapter_config.json").write_text(json.dumps({**cfg, "alora_invocation_tokens": INVOCATION}))
        refs = {"aLoRA": LoraRef("activated", str(activated)), "plain LoRA": LoraRef("plain", str(plain))}
        times: dict[str, list[float]] = {name: [] for name in refs}
        cached: dict[str, int] = {}
        for r in range(args.rounds):
            for name in (list(refs) if r % 2 else list(refs)[::-1]):
                engine = OfflineEngine(EngineConfig(model=str(model), kv_cache_bytes=512 << 20),
                                       SchedulerConfig(chunk_size=512))
                engine.generate(contexts, [one] * len(contexts))  # the conversations so far, on the base model
                t = time.perf_counter()
                outs = engine.generate(turns, [one] * len(turns), [refs[name]] * len(turns))
                times[name].append(time.perf_counter() - t)
                cached[name] = sum(o.num_cached_prompt_tokens for o in outs)
    print(f"({args.contexts} contexts of {args.context_len} tokens cached by the base model, then a turn of "
          f"{len(INVOCATION)} + {args.turn_len} tokens each under the adapter; median of {args.rounds} rounds)")
    print(f"{'adapter':12} {'turns (s)':>10} {'cached tokens':>14} {'speed-up':>9}")
    slow = statistics.median(times["plain LoRA"])
    for name in refs:
        median = statistics.median(times[name])
        print(f"{name:12} {median:10.3f} {cached[name]:14d} {slow / median:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
