"""Every supported architecture on a device and dtype of choice against transformers on the same device and
dtype (tests/engine/test_architectures.py's random checkpoints): the greedy tokens both write and how far
apart their logprobs are. In fp32 the two agree token for token (what the tests assert, on the CPU); in bf16
rounding differs (fused projections, kernels' reduction order), so this prints how many of the first tokens
agree and the largest logprob gap over them, per architecture, for a person to read: a case far below the
others points at a bf16 path that computes something else (e.g. a router or a sink kept in the wrong dtype).

    .venv/bin/python bench/architectures_device.py --device cuda --dtype bfloat16 [--cases gpt-oss,deepseek-v3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.builtin_model import init_model  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402
from tests.engine.test_architectures import CASES, save_checkpoint  # noqa: E402

TOKENS = 16
KV_BYTES = 256 * 2**20


def compare(case: str, root: Path, tokenizer_dir: Path, device: str, dtype: str) -> tuple[int, float]:
    """(tokens agreeing before the first difference, summed over the prompts; the largest logprob gap on them)."""
    import transformers

    path = root / case
    path.mkdir()
    save_checkpoint(CASES[case](), path, tokenizer_dir)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    ref.generation_config.eos_token_id = None  # ignore_eos's semantics, as the tests generate
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (17, 150)]
    # A pool of its own size: several of these may share one GPU (gpu_check.sh runs fp32 and bf16 side by side),
    # and the default (90% of free memory) would leave the next engine or transformers nothing.
    engine = OfflineEngine(EngineConfig(model=str(path), device=device, dtype=dtype, kv_cache_bytes=KV_BYTES),
                           SchedulerConfig(chunk_size=16))
    got = engine.generate(prompts, [SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True,
                                                   logprobs=0)] * len(prompts))
    agree, gap = 0, 0.0
    for prompt, comp in zip(prompts, got, strict=True):
        with torch.no_grad():
            out = ref.generate(torch.tensor([prompt], device=device), max_new_tokens=TOKENS, do_sample=False,
                               pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        want = out.sequences[0, len(prompt):].tolist()
        same = next((i for i, (a, b) in enumerate(zip(comp.token_ids, want, strict=True)) if a != b), TOKENS)
        agree += same
        for i in range(same):
            theirs = torch.log_softmax(out.logits[i][0].float(), -1)[want[i]].item()
            gap = max(gap, abs(comp.logprobs[i].logprob - theirs))
    return agree, gap


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated (default: every architecture)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokenizer_dir = init_model(root / "builtin", preset="tiny", seed=0)
        print(f"{'architecture':<24} {'tokens agreeing':>16} {'max logprob gap':>16}   ({args.device}, {args.dtype}, "
              f"2 prompts x {TOKENS} tokens)")
        failed = []
        for case in args.cases.split(","):
            try:
                agree, gap = compare(case, root, tokenizer_dir, args.device, args.dtype)
            except Exception as exc:  # noqa: BLE001 - one architecture's failure must not hide the others'
                failed.append(case)
                print(f"{case:<24} FAILED: {type(exc).__name__}: {exc}"[:400], flush=True)
                print(traceback.format_exc(limit=-4), file=sys.stderr, flush=True)
                continue
            print(f"{case:<24} {agree:>10}/{2 * TOKENS:<5} {gap:>16.4f}", flush=True)
    if failed:
        sys.exit(f"{len(failed)} architecture(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
