"""Beam search's cost: Seawall's (each step the open beams as one-token requests, their prefixes from the prefix
cache) against transformers' ``generate(num_beams)`` on the same weights (one KV cache, reordered each step),
and against decoding ``width`` sequences as far greedily (the floor: a step of that many decodes).

``--prompts`` (4) prompts of ``--prompt-len`` (200) random token ids, each searched with ``--width`` (4) beams
for up to ``--max-tokens`` (32) tokens (ended by the model's eos); rounds alternate the order and use fresh prompts.
Prints each one's median seconds per search and the ratios, and checks the hypotheses equal transformers'.

    .venv/bin/python bench/beam_search.py [--width 4] [--max-tokens 32] [--rounds 3] [--model DIR | --preset small]
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

import torch  # noqa: E402
import transformers  # noqa: E402

from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.beam_search import BeamParams  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.builtin_model import ensure_default_model, init_model  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=200)
    p.add_argument("--width", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=None, help="a checkpoint directory (default: the built-in model)")
    p.add_argument("--preset", default=None, help="a built-in preset written to a temporary directory (small)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or (str(init_model(Path(tmp) / args.preset, preset=args.preset)) if args.preset
                               else str(ensure_default_model()))
        return run(args, model)


def run(args, model: str) -> int:
    torch.manual_seed(0)
    rng = random.Random(0)
    prompts: list[list[int]] = []
    engine = OfflineEngine(EngineConfig(model=model, dtype="float32", kv_cache_bytes=256 << 20),
                           SchedulerConfig(chunk_size=512))
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    beam = BeamParams(args.width, args.max_tokens, end_token_ids=tuple(engine.checkpoint.eos_token_ids))
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)

    def seawall() -> list:
        return [[h.token_ids for h in engine.beam_search(prompt, beam)] for prompt in prompts]

    config = transformers.GenerationConfig(max_new_tokens=args.max_tokens, num_beams=args.width,
                                           num_return_sequences=args.width, do_sample=False, pad_token_id=0,
                                           eos_token_id=list(beam.end_token_ids))

    def hf_beams() -> list:
        out = []
        with torch.no_grad():
            for prompt in prompts:
                ids = torch.tensor([prompt])
                seqs = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
                out.append([_cut(row[len(prompt):].tolist(), beam.end_token_ids) for row in seqs])
        return out

    def decodes() -> list:
        return [engine.generate([prompt] * args.width, [greedy] * args.width) for prompt in prompts]

    runs = {"seawall beam search": seawall, "transformers beam search": hf_beams,
            f"seawall, {args.width} greedy decodes": decodes}
    times: dict[str, list[float]] = {name: [] for name in runs}
    results = {}
    same = True
    for r in range(args.rounds):
        # Fresh prompts each round: none is in the prefix cache yet.
        prompts[:] = [[rng.randrange(400, 4000) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            t = time.perf_counter()
            results[name] = runs[name]()
            times[name].append(time.perf_counter() - t)
        same = same and results["seawall beam search"] == results["transformers beam search"]
    print(f"({args.prompts} prompts of {args.prompt_len} tokens, {args.width} beams, {args.max_tokens} tokens; "
          f"median of {args.rounds} rounds; hypotheses equal transformers': {same})")
    print(f"{'run':34} {'s per search':>13} {'vs transformers':>16}")
    base = statistics.median(times["transformers beam search"])
    for name in runs:
        median = statistics.median(times[name]) / args.prompts
        print(f"{name:34} {median:13.4f} {base / args.prompts / median:15.2f}x")
    return 0 if same else 1


def _cut(tokens: list[int], ends: tuple[int, ...]) -> list[int]:
    """A hypothesis's tokens up to its end token (transformers pads the rest with the first)."""
    return tokens[: next((i + 1 for i, t in enumerate(tokens) if t in ends), len(tokens))]


if __name__ == "__main__":
    sys.exit(main())
