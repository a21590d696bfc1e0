"""What LoRA adapters cost: tokens/s of one workload on the base model, on one adapter, and spread over several
distinct adapters in the same batches, in process, in the same run.

``--batch`` (32) concurrent requests of ``--prompt-len`` (64) random token ids, each generating greedily
``--output-len`` (128) tokens (``ignore_eos``), through ``OfflineEngine`` (the engine a worker runs) on the
built-in model. Adapters of rank ``--rank`` (16) on every projection are written here in PEFT's format with
random weights; with N adapters, request i runs adapter i mod N, so every step mixes N adapters. Rounds
alternate the settings; the median tokens/s of each is printed with its ratio to the base model's.

    .venv/bin/python bench/lora.py [--adapters 1,4,16] [--rank 16] [--rounds 3] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.lora_shape import MODULES, ModelShape  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.common.step import LoraRef  # noqa: E402
from services.engine.builtin_model import ensure_default_model  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.engine.model_config import ModelConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402


def write_adapter(out: Path, shape: ModelShape, rank: int, seed: int) -> Path:
    """A random PEFT-format adapter on every projection of every layer; in an MoE layer, of the attention and
    the stacked experts (PEFT's target_parameters: the last parameter wrapped outermost)."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}

    def pair(key: str, rows: int, fan_in: int, fan_out: int) -> None:
        tensors[f"{key}.lora_A.weight"] = torch.randn(rows, fan_in, generator=g) / fan_in ** 0.5
        tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rows, generator=g) * 0.02

    experts = ("gate_up_proj" if shape.gated_mlp else "up_proj", "down_proj")
    for layer in range(shape.num_layers):
        prefix = f"base_model.model.model.layers.{layer}"
        for module in MODULES:
            attention = module[0] in "qkvo"
            if attention or layer not in shape.moe_layers:
                pair(f"{prefix}.{'self_attn' if attention else 'mlp'}.{module}", rank, *shape.in_out(module, layer))
        if layer in shape.moe_layers:
            for depth, param in enumerate(reversed(experts)):
                pair(f"{prefix}.mlp.experts{'.base_layer' * depth}", rank * shape.num_experts,
                     *shape.expert_in_out(param))
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(MODULES), "bias": "none",
        "target_parameters": [f"mlp.experts.{p}" for p in experts] if shape.moe_layers else []}))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adapters", default="1,4,16", help="distinct adapters per batch, comma-separated")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=None, help="a checkpoint directory (default: the built-in model)")
    args = p.parse_args()
    model = args.model or ensure_default_model()
    shape = ModelConfig.from_dir(model).lora_shape
    counts = [int(n) for n in args.adapters.split(",")]
    engine = OfflineEngine(EngineConfig(model=str(model), kv_cache_bytes=128 << 20),
                           SchedulerConfig(chunk_size=512, enable_prefix_caching=False))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 4000) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    params = [SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)] * args.batch
    with tempfile.TemporaryDirectory() as tmp:
        refs = [LoraRef(f"a{i}", str(write_adapter(Path(tmp) / f"a{i}", shape, args.rank, i)))
                for i in range(max(counts))]
        settings = {"base": [None] * args.batch}
        settings |= {f"{n} adapter{'s' if n > 1 else ''}": [refs[i % n] for i in range(args.batch)] for n in counts}
        rates: dict[str, list[float]] = {name: [] for name in settings}
        for r in range(args.rounds + 1):  # round 0 warms up (and loads every adapter)
            for name in (list(settings) if r % 2 else list(settings)[::-1]):
                t = time.perf_counter()
                out = engine.generate(prompts, params, settings[name])
                elapsed = time.perf_counter() - t
                if r:
                    rates[name].append(sum(len(c.token_ids) for c in out) / elapsed)
    base = statistics.median(rates["base"])
    print(f"({args.batch} x ({args.prompt_len} + {args.output_len}) tokens, greedy, rank {args.rank} on every "
          f"projection; median of {args.rounds} rounds)")
    print(f"{'setting':12} {'tok/s':>8} {'vs base':>8}")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"{name:12} {rate:8.0f} {rate / base:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
