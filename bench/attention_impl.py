"""The measurement behind the engine's attention and KV-layout choices (services/engine/attention.py, kv_pool.py).

Tiny-model dims by default: 4 query heads, 2 KV heads, head_dim 32, 4 layers, block size 16, fp32 on the CPU.
Block ids are a random permutation of the pool (a fragmented pool, as after many requests). Every variant's
output is checked against the engine's own ``paged_attention`` before it is timed.

Decode step (``--decode-seqs`` sequences, context lengths uniform in [128, 700]; then again with every
context equal to that mean, where the batched call pads nothing):

* ``gather+SDPA batched`` — the engine's ``paged_attention`` (block tables padded to the longest context,
  one gather for K and one for V, one masked SDPA call), on the block-major pool;
* ``per-sequence SDPA loop`` — one gather and one unmasked SDPA call per sequence, exact context length;
* the batched call on a layer-major pool;
* both decode forms with the gather done by ``index_select`` on the ``[num_blocks, block_size * heads * dim]``
  view of the per-layer cache instead of advanced indexing (``cache[block_tables]``, what
  ``attention._gather`` does), and the K gather alone on both layouts, both ways.

Prefill: ``paged_attention`` on prompt chunks of ``--chunk`` tokens, fresh (no cached prefix) and after a
cached prefix, on both layouts.

Swap: moving ``--swap-blocks`` blocks device -> host (both are CPU memory here, so this measures the copy
and the per-op overhead, not PCIe): block-major is one index copy of whole blocks (``PagedKVPool.swap_out``,
one contiguous region per block); layer-major needs one copy per (layer, K|V) — or one strided index op —
and ``2 * layers`` regions per block for a DMA/NIXL transfer.

Each figure is the median of ``torch.utils.benchmark`` blocked runs, measured in ``--rounds`` interleaved rounds
of which the lowest is kept (the CPU is shared); ratios are against the first row of each group.

    .venv/bin/python bench/attention_impl.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.attention import AttentionBatch, _gather, paged_attention  # noqa: E402
from services.engine.inputs import SequenceState, prepare_inputs  # noqa: E402
from services.engine.kv_pool import KVLayout, PagedKVPool  # noqa: E402

CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------- pools


class Pools:
    """One block-major pool (the engine's ``PagedKVPool``) and a layer-major copy with the same contents."""

    def __init__(self, layers: int, blocks: int, block: int, kv_heads: int, dim: int, host_blocks: int) -> None:
        layout = KVLayout(layers, block, kv_heads, dim, torch.float32)
        self.pool = PagedKVPool(layout, blocks, host_blocks, CPU)
        self.pool.device_kv.normal_()
        # [layers, 2, num_blocks, block, heads, dim]
        self.layer_major = self.pool.device_kv.permute(1, 2, 0, 3, 4, 5).contiguous()
        self.layer_major_host = torch.zeros((layers, 2, host_blocks, block, kv_heads, dim))

    def block_major_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.layer(layer)

    def layer_major_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer_major[layer, 0], self.layer_major[layer, 1]


def gather_index_select(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Same result as ``attention._gather``; copies whole rows with ``index_select`` on a 2-D view."""
    b, n = block_tables.shape
    rows = cache.flatten(1).index_select(0, block_tables.reshape(-1))
    return rows.view(b, n * cache.shape[1], cache.shape[2], cache.shape[3]).transpose(1, 2)


# ---------------------------------------------------------------------------------------------- batches


def step_batch(contexts: list[int], new_tokens: list[int], block: int, num_blocks: int, heads: int,
               kv_heads: int, dim: int, rng: random.Random) -> tuple:
    """An ``AttentionBatch`` from the engine's ``prepare_inputs``: sequence i has ``contexts[i]`` tokens after
    this step, ``new_tokens[i]`` of them computed now. Blocks are drawn at random from the pool."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    scheduled = []
    for i, (ctx, n) in enumerate(zip(contexts, new_tokens, strict=True)):
        blocks = [free.pop() for _ in range(-(-ctx // block))]
        seq = SequenceState(f"s{i}", [1] * ctx, ctx - n if n == 1 else ctx, ctx - n, blocks, SamplingParams())
        scheduled.append((seq, n))
    inputs = prepare_inputs(scheduled, block, CPU)
    t = int(inputs.input_ids.shape[0])
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    q = torch.randn(t, heads, dim, generator=g)
    k = torch.randn(t, kv_heads, dim, generator=g)
    v = torch.randn(t, kv_heads, dim, generator=g)
    return inputs.attention, q, k, v, [s.block_ids for s, _ in scheduled]


def per_sequence_decode(q, k, v, k_cache, v_cache, batch: AttentionBatch, tables: list[torch.Tensor],
                        contexts: list[int], gather) -> torch.Tensor:
    """Decode attention as one SDPA call per sequence (exact context, no mask)."""
    k_cache[batch.slot_blocks, batch.slot_offsets] = k
    v_cache[batch.slot_blocks, batch.slot_offsets] = v
    out = torch.empty_like(q)
    for i, (table, ctx) in enumerate(zip(tables, contexts, strict=True)):
        keys = gather(k_cache, table[None])[:, :, :ctx]
        values = gather(v_cache, table[None])[:, :, :ctx]
        out[i] = F.scaled_dot_product_attention(q[i, :, None][None], keys, values, enable_gqa=True)[0, :, 0]
    return out


def batched_decode(q, k, v, k_cache, v_cache, batch: AttentionBatch, gather) -> torch.Tensor:
    """The decode half of ``paged_attention`` (all tokens are decodes) with a pluggable gather."""
    k_cache[batch.slot_blocks, batch.slot_offsets] = k
    v_cache[batch.slot_blocks, batch.slot_offsets] = v
    keys = gather(k_cache, batch.decode_block_tables)
    values = gather(v_cache, batch.decode_block_tables)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=batch.decode_mask, enable_gqa=True)
    return o.squeeze(2)


# ---------------------------------------------------------------------------------------------- timing


def timeit(fn, min_run_time: float) -> float:
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def table(title: str, variants: list[tuple[str, object]], min_run_time: float, rounds: int,
          note: str = "") -> list[dict]:
    """Times each variant in ``rounds`` interleaved rounds (median of blocked runs each) and keeps the lowest
    median: on a shared CPU a burst of load inflates whatever runs during it, rarely all rounds."""
    for _, fn in variants:
        for _ in range(3):  # warm up: allocator, caches
            fn()
    best = {name: float("inf") for name, _ in variants}
    for _ in range(rounds):
        for name, fn in variants:
            best[name] = min(best[name], timeit(fn, min_run_time))
    base = best[variants[0][0]]
    print(f"\n{title}")
    print(f"  {'variant':<58} {'median':>10} {'vs first':>9}")
    out = []
    for name, _ in variants:
        seconds = best[name]
        print(f"  {name:<58} {seconds * 1e3:>7.3f} ms {seconds / base:>8.2f}x")
        out.append({"variant": name, "median_ms": seconds * 1e3, "ratio_vs_first": seconds / base})
    if note:
        print(f"  {note}")
    return out


def main() -> int:  # noqa: PLR0915
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--decode-seqs", type=int, default=64)
    ap.add_argument("--min-context", type=int, default=128)
    ap.add_argument("--max-context", type=int, default=700)
    ap.add_argument("--chunk", type=int, default=512, help="prefill chunk length")
    ap.add_argument("--chunks", type=int, default=4, help="prefill chunks per step")
    ap.add_argument("--prefix", type=int, default=1024, help="cached prefix before each chunk, 2nd prefill case")
    ap.add_argument("--swap-blocks", type=int, default=64)
    ap.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the lowest median is kept")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    bs, hkv, hd = args.block_size, args.kv_heads, args.head_dim
    need = args.decode_seqs * -(-args.max_context // bs) + args.chunks * -(-(args.prefix + args.chunk) // bs)
    num_blocks = need + 256
    pools = Pools(args.layers, num_blocks, bs, hkv, hd, host_blocks=2 * args.swap_blocks)
    mb = pools.pool.device_kv.numel() * 4 / 2**20
    print(f"dims: {args.heads} q heads, {hkv} kv heads, head_dim {hd}, {args.layers} layers, block {bs}; pool "
          f"{num_blocks} blocks ({mb:.0f} MiB per layout); {torch.get_num_threads()} torch threads")
    layer = args.layers // 2
    bm_k, bm_v = pools.block_major_layer(layer)
    lm_k, lm_v = pools.layer_major_layer(layer)
    mrt, rounds = args.min_run_time, args.rounds
    results: dict[str, list[dict]] = {}

    # -- decode ---------------------------------------------------------------------------------------------
    contexts = [rng.randint(args.min_context, args.max_context) for _ in range(args.decode_seqs)]
    mean_ctx = round(sum(contexts) / len(contexts))
    for key, ctxs in (("decode", contexts), ("decode_equal", [mean_ctx] * len(contexts))):
        batch, q, k, v, block_lists = step_batch(ctxs, [1] * len(ctxs), bs, num_blocks, args.heads, hkv, hd, rng)
        tables = [torch.tensor(b) for b in block_lists]
        ref = paged_attention(q, k, v, bm_k, bm_v, batch)
        variants = {
            "gather+SDPA batched, block-major (engine)": lambda b=batch, q=q, k=k, v=v: paged_attention(
                q, k, v, bm_k, bm_v, b),
            "per-sequence SDPA loop, block-major": lambda b=batch, q=q, k=k, v=v, t=tables, c=ctxs: (
                per_sequence_decode(q, k, v, bm_k, bm_v, b, t, c, _gather)),
            "gather+SDPA batched, layer-major": lambda b=batch, q=q, k=k, v=v: paged_attention(
                q, k, v, lm_k, lm_v, b),
            "gather+SDPA batched, block-major, index_select gather": lambda b=batch, q=q, k=k, v=v: (
                batched_decode(q, k, v, bm_k, bm_v, b, gather_index_select)),
            "per-sequence SDPA loop, block-major, index_select gather": lambda b=batch, q=q, k=k, v=v, t=tables,
            c=ctxs: per_sequence_decode(q, k, v, bm_k, bm_v, b, t, c, gather_index_select),
        }
        for name, fn in variants.items():
            torch.testing.assert_close(fn(), ref, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        padded = batch.decode_block_tables.shape[1] * bs
        title = (f"decode attention, one layer (KV write + attention): {len(ctxs)} sequences, contexts "
                 f"{min(ctxs)}..{max(ctxs)} (mean {sum(ctxs) / len(ctxs):.0f}), padded to {padded}")
        results[key] = table(title, list(variants.items()), mrt, rounds)
        if key == "decode":
            bt = batch.decode_block_tables
    for cache_k, cache_v in ((bm_k, bm_v), (lm_k, lm_v)):
        assert torch.equal(gather_index_select(cache_k, bt), _gather(cache_k, bt))
        assert torch.equal(gather_index_select(cache_v, bt), _gather(cache_v, bt))
    results["gather"] = table("K gather alone, the first decode batch's block tables", [
        ("block-major, cache[block_tables] (engine _gather)", lambda: _gather(bm_k, bt)),
        ("layer-major, cache[block_tables]", lambda: _gather(lm_k, bt)),
        ("block-major, index_select on [blocks, block*heads*dim] view", lambda: gather_index_select(bm_k, bt)),
        ("layer-major, index_select on [blocks, block*heads*dim] view", lambda: gather_index_select(lm_k, bt)),
    ], mrt, rounds)

    # -- prefill --------------------------------------------------------------------------------------------
    prefill = []
    for label, prefix in (("fresh prompts", 0), (f"after a {args.prefix}-token cached prefix", args.prefix)):
        ctx = [prefix + args.chunk] * args.chunks
        pb, pq, pk, pv, _ = step_batch(ctx, [args.chunk] * args.chunks, bs, num_blocks, args.heads, hkv, hd, rng)
        torch.testing.assert_close(paged_attention(pq, pk, pv, lm_k, lm_v, pb),
                                   paged_attention(pq, pk, pv, bm_k, bm_v, pb), rtol=1e-4, atol=1e-5)
        prefill += [
            (f"{args.chunks}x{args.chunk} {label}, block-major (engine)",
             lambda pb=pb, pq=pq, pk=pk, pv=pv: paged_attention(pq, pk, pv, bm_k, bm_v, pb)),
            (f"{args.chunks}x{args.chunk} {label}, layer-major",
             lambda pb=pb, pq=pq, pk=pk, pv=pv: paged_attention(pq, pk, pv, lm_k, lm_v, pb)),
        ]
    results["prefill"] = table("prefill attention, one layer (KV write + attention)", prefill, mrt, rounds)

    # -- swap -----------------------------------------------------------------------------------------------
    src = rng.sample(range(num_blocks), args.swap_blocks)
    dst = list(range(args.swap_blocks))
    pairs = list(zip(src, dst, strict=True))
    src_t, dst_t = torch.tensor(src), torch.tensor(dst)
    dev_lm, host_lm = pools.layer_major, pools.layer_major_host

    def layer_major_per_layer() -> None:
        for layer_i in range(args.layers):
            for kv in range(2):
                host_lm[layer_i, kv, dst_t] = dev_lm[layer_i, kv, src_t]

    def layer_major_one_op() -> None:
        host_lm[:, :, dst_t] = dev_lm[:, :, src_t]

    pools.pool.swap_out(pairs)
    layer_major_per_layer()
    assert torch.equal(pools.pool.host_kv[dst_t].permute(1, 2, 0, 3, 4, 5), host_lm[:, :, dst_t])
    per_block = pools.pool.layout.bytes_per_block
    results["swap"] = table(
        f"swap out {args.swap_blocks} blocks device->host ({args.swap_blocks * per_block / 2**20:.1f} MiB)", [
            ("block-major, one index copy (PagedKVPool.swap_out)", lambda: pools.pool.swap_out(pairs)),
            (f"layer-major, {2 * args.layers} per-layer index copies", layer_major_per_layer),
            ("layer-major, one strided index op", layer_major_one_op),
        ], mrt, rounds,
        note=f"contiguous regions to transfer: block-major {args.swap_blocks}, layer-major "
             f"{args.swap_blocks * 2 * args.layers} ({2 * args.layers} per block)",
    )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "contexts": contexts,
                                         "torch_threads": torch.get_num_threads(), "results": results},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
