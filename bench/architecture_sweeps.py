"""Every supported architecture (tests/engine/test_architectures.py's random checkpoints) through paths the
per-family tests sample only: ``--lora`` serves an adapter of every linear layer of its decoder layers (PEFT's
own, as users bring them) and compares greedy tokens with transformers + peft; ``--mesh`` serves it through a
disaggregated mesh (prefill worker, KV over NIXL, decode worker) and compares with transformers. Each case ends
``match``, ``REFUSED`` (with the engine's reason: an adapter of what it cannot adapt, said so) or ``MISMATCH``
(a silent difference: a bug). The first run found q/k adapters of interleaved-RoPE models and Falcon-H1's
multiplied projections silently wrong (2026-12-06).

    .venv/bin/python bench/architecture_sweeps.py --lora --mesh [--cases gpt2,bloom]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall import AsyncClient  # noqa: E402
from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.lora_shape import EXPERT_PARAMS  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.common.step import LoraRef  # noqa: E402
from services.engine.builtin_model import ensure_default_model  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402
from tests.e2e.conftest import generate_all, greedy_oracle, random_prompts, start_mesh  # noqa: E402
from tests.engine.test_architectures import CASES, MAX_TOKENS, _decoder_layers, save_checkpoint  # noqa: E402
from tests.lora_adapters import causal_lm, peft_greedy  # noqa: E402


def lora(path: Path, model) -> str:
    """An adapter of every linear layer of the decoder layers (not a router), the shared experts' and the
    stacked experts' (PEFT's target_parameters), served for two prompts against transformers + peft."""
    import peft
    import transformers

    def linear(layer) -> list[str]:
        return [name for name, m in layer.named_modules()
                if isinstance(m, torch.nn.Linear | transformers.pytorch_utils.Conv1D)
                and name.rsplit(".", 1)[-1] not in ("gate", "router", "wg", "shared_expert_gate")]  # routers

    layers = _decoder_layers(model)  # every layer's projections (attention's, mixers', MLPs'), shared experts'
    linear = sorted({name.rsplit(".", 1)[-1] for layer in layers for name in linear(layer) if "expert" not in name}
                    | {".".join(name.split(".")[-2:]) for layer in layers for name in linear(layer)
                       if "shared" in name})
    experts = sorted({f"{name}.{param}" for layer in _decoder_layers(model) for name, m in layer.named_modules()
                      if name.endswith("experts") for param, _ in m.named_parameters(recurse=False)
                      if param in EXPERT_PARAMS})
    if "incompatible with Mamba" in _peft_refusal(model, linear, experts):  # peft will not adapt its out_proj
        linear = [name for name in linear if name != "out_proj"]
    if refusal := _peft_refusal(model, linear, experts):
        return f"not made by peft: {refusal[:120]}"
    torch.manual_seed(5)
    peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, r=4, lora_alpha=8, target_modules=linear,
                                               target_parameters=experts)).save_pretrained(path / "adapter")
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (5, 40)]
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32"), SchedulerConfig(chunk_size=16))
    ref = LoraRef("sweep", str(path / "adapter"))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0)] * 2, loras=[ref, ref])
    if any(c.finish_reason == "error" for c in got):
        return f"REFUSED {linear + experts}: {got[0].error}"
    same = [c.token_ids for c in got] == peft_greedy(path, path / "adapter", prompts, MAX_TOKENS)
    return f"{'match' if same else 'MISMATCH'} {linear + experts}"


def _peft_refusal(model, linear: list[str], experts: list[str]) -> str:
    """Why peft will not make this adapter for ``model`` ('' when it will), tried on a copy."""
    import copy

    import peft

    try:
        peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, target_modules=linear,
                                                                  target_parameters=experts))
    except ValueError as exc:
        return str(exc)
    return ""


def mesh(path: Path, model) -> str:
    """Five prompts (1 to 150 tokens) at once through a disaggregated mesh against transformers."""
    prompts, tokens = random_prompts([1, 17, 40, 65, 150], seed=51), 12
    m = start_mesh(path, path / "logs", scheduler_args=["--chunk-size", "16"], http=False)
    try:
        async def run():
            async with AsyncClient(m.grpc_address) as client:
                return await generate_all(client, prompts, max_tokens=tokens, temperature=0)
        outs = anyio.run(run)
    finally:
        m.stop()
    greedy = greedy_oracle(model.eval())
    bad = [len(p) for p, o in zip(prompts, outs, strict=True) if o.token_ids != greedy(p, tokens)]
    return "match" if not bad else f"MISMATCH: the {bad}-token prompts"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lora", action="store_true", help="adapters of every linear layer against transformers + peft")
    p.add_argument("--mesh", action="store_true", help="a disaggregated mesh against transformers")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    args = p.parse_args()
    sweeps = [s for s, on in (("lora", args.lora), ("mesh", args.mesh)) if on] or ["lora", "mesh"]

    tiny = ensure_default_model()
    for case in args.cases.split(",") if args.cases else sorted(CASES):
        for sweep in sweeps:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / case
                try:
                    save_checkpoint(CASES[case](), path, tiny)
                    model = causal_lm(path)
                    verdict = (lora if sweep == "lora" else mesh)(path, model)
                except Exception as exc:  # one case's failure is a row of the table, not the end of the sweep
                    verdict = f"ERROR {type(exc).__name__}: {str(exc)[:160]}"
            print(f"{sweep:5} {case:28} {verdict}", flush=True)


if __name__ == "__main__":
    main()
