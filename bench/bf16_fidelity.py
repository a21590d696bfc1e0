"""How closely bf16 serving follows transformers in bf16, architecture by architecture.

For each of the oracle tests' toy checkpoints (tests/engine/test_architectures.py, saved by transformers with
decisive random weights) it loads transformers' model in bf16 and Seawall's engine in bf16 (whole prompts: chunks
of 512), and prints the largest difference between the two first-token logprobs over the engine's top 5, for a
40- and a 150-token prompt. 0 means bit for bit: every cast in transformers' order. fp32 is what the oracle tests
compare (to 1e-4); bf16 shows the order of casts, which fp32 hides.

    .venv/bin/python bench/bf16_fidelity.py                    # every architecture (a few minutes)
    .venv/bin/python bench/bf16_fidelity.py mixtral qwen3-next  # some

Known causes of what is left (bench/README.md, "bf16 fidelity"): latent attention absorbs W_UK into the query
(DeepSeek, Kimi, GLM-4.7-Flash: another product order), RoPE stored interleaved is de-interleaved into the weights
(ERNIE, Cohere, Helium: the dot products sum in another order), Falcon-H1's multipliers are folded into weights.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.builtin_model import ensure_default_model  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402


def first_token_gap(model_dir: Path, model_class: type, lengths: tuple[int, ...] = (40, 150)) -> list[float]:
    """Per prompt, the largest |logprob difference| over the engine's top 5 first tokens, against transformers'
    ``model_class`` loaded in bf16."""
    hf = model_class.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    engine = OfflineEngine(EngineConfig(model=str(model_dir), dtype="bfloat16"), SchedulerConfig(chunk_size=512))
    g = torch.Generator().manual_seed(50)
    gaps = []
    for n in lengths:
        prompt = torch.randint(3, 4096, (n,), generator=g).tolist()
        with torch.no_grad():
            want = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].float(), -1)
        got = engine.generate([prompt], [SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=5)])
        gaps.append(max(abs(lp - want[t].item()) for t, lp in got[0].logprobs[0].top_logprobs))
    return gaps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="architectures (tests/engine/test_architectures.py CASES; default all)")
    args = p.parse_args()
    from tests.engine.test_architectures import CASES, save_checkpoint

    tokenizer_dir = ensure_default_model()
    exact = 0
    names = args.names or list(CASES)
    print(f"{'architecture':26} {'40 tokens':>10} {'150 tokens':>10}")
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"bf16-{name}-") as tmp:
            try:
                saved = save_checkpoint(CASES[name](), Path(tmp), tokenizer_dir)
                gaps = first_token_gap(Path(tmp), type(saved))
            except Exception as exc:  # noqa: BLE001 - a survey: one architecture's failure is a row, not the end
                print(f"{name:26} error: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
                continue
        exact += max(gaps) == 0
        print(f"{name:26} {gaps[0]:>10.3g} {gaps[1]:>10.3g}", flush=True)
    print(f"bit for bit: {exact} of {len(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
