"""Mixture-of-experts layer: the experts as one grouped GEMM per projection (what ``SparseMoE`` runs) vs one
matmul per expert (what transformers' eager MoE and torch < 2.9 run), on the same routed rows, same run;
and the whole layer (router, sort, experts, weighted sum) beside them.

Shape: Qwen3-30B-A3B's routing (128 experts, 8 per token) at a width this CPU runs in milliseconds
(``--hidden`` 1024, ``--expert-width`` 192, the model's 2048 and 768 scaled down); a decode step of
``--decode`` tokens and a prompt chunk of ``--chunk`` tokens. Each figure is the median of ``--repeats``
interleaved timings; outputs are compared.

    .venv/bin/python bench/moe_layer.py [--device cuda] [--dtype bfloat16] [--hidden 2048 --expert-width 768]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.engine import moe  # noqa: E402
from services.engine.model_config import ModelConfig  # noqa: E402


def _layer(args: argparse.Namespace) -> moe.SparseMoE:
    config = ModelConfig(vocab_size=16, hidden_size=args.hidden, intermediate_size=args.expert_width,
                         num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=args.hidden,
                         max_position_embeddings=16, num_experts=args.experts, num_experts_per_tok=args.top_k,
                         moe_intermediate_size=args.expert_width, norm_topk_prob=True, moe_layers=(0,))
    layer = moe.SparseMoE(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    return layer.to(args.device, getattr(torch, args.dtype))


def _experts(mm, rows, gate_up, down, offsets) -> torch.Tensor:
    return mm(moe.silu_mul(mm(rows, gate_up, offsets)), down, offsets)


def _time(fn, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--expert-width", type=int, default=192)
    p.add_argument("--decode", type=int, default=64, help="tokens of the decode step (default 64)")
    p.add_argument("--chunk", type=int, default=512, help="tokens of the prompt chunk (default 512)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()
    layer = _layer(args)
    print(f"{args.experts} experts, top {args.top_k}, hidden {args.hidden}, expert width {args.expert_width}, "
          f"{args.device} {args.dtype}, median of {args.repeats}")
    print(f"{'tokens':>8} {'per expert':>11} {'looped ms':>10} {'grouped ms':>11} {'speed-up':>9} "
          f"{'whole layer ms':>15}  outputs")
    gate_up = layer.experts.gate_up_proj.transpose(1, 2)
    down = layer.experts.down_proj.transpose(1, 2)
    for tokens in (args.decode, args.chunk):
        x = torch.randn(tokens, args.hidden, device=args.device, dtype=getattr(torch, args.dtype))
        with torch.inference_mode():
            chosen = torch.topk(layer.gate(x), args.top_k, dim=-1).indices.flatten()
            order = torch.argsort(chosen, stable=True)
            rows = x[order // args.top_k]
            offsets = torch.bincount(chosen, minlength=args.experts).cumsum(0).to(torch.int32)
            runs = {"looped": partial(_experts, moe.looped_mm, rows, gate_up, down, offsets),
                    "grouped": partial(_experts, moe.grouped_mm, rows, gate_up, down, offsets),
                    "layer": partial(layer, x)}
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.repeats + 2):  # interleaved; the first two rounds warm up
                for name, run in runs.items():
                    times[name].append(_time(run, args.device))
            looped, grouped, whole = (statistics.median(times[n][2:]) * 1e3 for n in ("looped", "grouped", "layer"))
            a, b = runs["looped"](), runs["grouped"]()
        same = "identical" if torch.equal(a, b) else f"max diff {(a - b).abs().max().item():.2e}"
        print(f"{tokens:>8} {tokens * args.top_k / args.experts:>11.1f} {looped:>10.2f} {grouped:>11.2f} "
              f"{looped / grouped:>8.2f}x {whole:>15.2f}  {same}")


if __name__ == "__main__":
    main()
