"""What structured output costs: tokens/s of one workload, free text vs constrained, in process, in the same run.

``--num-requests`` (64) prompts of ``--prompt-len`` (64) random token ids, each generating greedily up to
``--output-len`` (64) tokens, through ``OfflineEngine`` (the engine a worker runs), under each constraint:

* ``free`` — no constraint (the all-greedy fast path: one fused argmax for the batch);
* ``regex`` — ``[a-z ]{200}``: letters and spaces, so every request runs its full length;
* ``json`` — a JSON schema with a free-text field long enough that no request completes it;
* ``bias`` — ``logit_bias`` on one token: the general sampler path without a grammar, to separate the
  sampler's cost from the matcher's.

Rounds alternate the systems; the median over rounds of each one's tokens/s is printed with its ratio to
``free``. The constrained outputs are checked (letters and spaces; a JSON prefix of the schema's shape).

    .venv/bin/python bench/structured_output.py [--num-requests 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.builtin_model import ensure_default_model  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402

SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "minLength": 400},
                                           "ok": {"type": "boolean"}}, "required": ["title", "ok"]}
SYSTEMS = {
    "free": {},
    "regex": {"structured_output": ("regex", "[a-z ]{200}")},
    "json": {"structured_output": ("json", json.dumps(SCHEMA))},
    "bias": {"logit_bias": ((7, 1.0),)},
}


def check(name: str, texts: list[str]) -> None:
    if name == "regex":
        assert all(re.fullmatch("[a-z ]+", t) for t in texts), "regex output outside [a-z ]"
    if name == "json":
        assert all(t.startswith('{"title": "') for t in texts), "json output does not start as the schema says"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    engine = OfflineEngine(EngineConfig(model=str(ensure_default_model()), kv_cache_bytes=64 << 20),
                           SchedulerConfig(chunk_size=512, enable_prefix_caching=False))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 4000) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]
    rates: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    for r in range(args.rounds + 1):  # round 0 warms up (kernels, grammar compilation)
        for name in (list(SYSTEMS) if r % 2 else list(SYSTEMS)[::-1]):
            params = SamplingParams(max_tokens=args.output_len, temperature=0, **SYSTEMS[name])
            t = time.perf_counter()
            out = engine.generate(prompts, [params] * len(prompts))
            elapsed = time.perf_counter() - t
            check(name, [c.text for c in out])
            if r:
                rates[name].append(sum(len(c.token_ids) for c in out) / elapsed)
    base = statistics.median(rates["free"])
    print(f"{args.num_requests} requests x ({args.prompt_len} + {args.output_len}) tokens, greedy, median of "
          f"{args.rounds} rounds")
    for name, values in rates.items():
        med = statistics.median(values)
        print(f"{name:6} {med:8.0f} tok/s  {med / base:5.2f}x free")
    return 0


if __name__ == "__main__":
    sys.exit(main())
