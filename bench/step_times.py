"""Step times of our own engine, written as a table the simulator reads (``seawall sim run --cost-model
measured FILE``; format ``seawall-step-times/v1``, see ``seawall/sim/cost_model.py``).

Runs real step plans through ``ModelRunner`` over a grid of step shapes — prompt chunks of several sizes,
decode batches of several sizes and contexts, and mixed (Sarathi-style) steps — and records the fastest wall
time of each. The KV blocks hold whatever the pool holds (timing does not depend on the values).

    .venv/bin/python bench/step_times.py --out step_times.json [--model DIR] [--device cuda] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seawall.sim.cost_model import MEASURED_FORMAT  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.engine.runner import ModelRunner  # noqa: E402
from services.engine.step_profile import Planner  # noqa: E402


def grid(quick: bool):
    chunk_sizes = [16, 128] if quick else [16, 64, 128, 256, 512, 1024]
    batch_sizes = [1, 16] if quick else [1, 4, 16, 64]
    contexts = [128] if quick else [128, 512, 2048]
    for n in chunk_sizes:
        yield [(n, 0)], []
        if not quick:
            yield [(n, 512)], []  # a later chunk of a long prompt
    for b, c in itertools.product(batch_sizes, contexts):
        yield [], [c] * b
    for n, b in itertools.product(chunk_sizes[-2:], batch_sizes[-1:]):
        yield [(n, 0)], [contexts[0]] * b  # a hybrid (decodes + chunk) step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a small grid (for tests)")
    args = p.parse_args()
    runner = ModelRunner(EngineConfig(model=args.model, device=args.device, dtype=args.dtype))
    planner = Planner(runner)
    planner.time([(16, 0)], [], 1)  # warm up
    samples = []
    for chunks, decodes in grid(args.quick):
        seconds = planner.time(chunks, decodes, args.repeats)
        tokens = sum(n for n, _ in chunks) + len(decodes)
        context = sum(n + c for n, c in chunks) + sum(c + 1 for c in decodes)
        samples.append({"num_tokens": tokens, "num_seqs": len(chunks) + len(decodes), "context": context,
                        "seconds": seconds})
        print(f"tokens {tokens:5d}  seqs {len(chunks) + len(decodes):3d}  context {context:6d}  {seconds * 1e3:8.2f} ms")
    out = {"format": MEASURED_FORMAT, "model": str(runner.checkpoint.path), "device": str(runner.device),
           "block_bytes": runner.kv.layout.bytes_per_block, "samples": samples}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {len(samples)} samples to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
