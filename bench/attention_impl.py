"""The measurement behind the engine's attention and KV-layout choices (services/engine/attention.py, kv_pool.py).

Tiny-model dims by default: 4 query heads, 2 KV heads, head_dim 32, 4 layers, block size 16, fp32 on the CPU.
Block ids are a random permutation of the pool (a fragmented pool, as after many requests). Batches come from
the engine's own ``prepare_inputs``. Every variant's output is checked against the engine's ``paged_attention``
before it is timed.

Decode step (``--decode-seqs`` sequences, context lengths uniform in [128, 700]; then again with every
context equal to that mean, where there is one bucket and nothing is padded):

* ``engine`` — ``paged_attention``: decodes bucketed by context length, each bucket's block tables padded
  to its longest context, one ``index_select`` gather for K and one for V, one masked SDPA call per bucket;
* ``per-sequence SDPA loop`` — one gather and one unmasked SDPA call per sequence, exact context length;
* ``one padded bucket`` — every decode in a single group padded to the longest context (no bucketing);
* the same single bucket with the gather done by advanced indexing (``cache[block_tables]``, the gather
  before the ``index_select`` change);
* the engine on a layer-major pool;

and the K gather alone (all decodes, padded to the longest), block-major vs layer-major, ``index_select``
(``attention.gather``) vs advanced indexing.

Prefill: ``paged_attention`` on ``--chunks`` prompt chunks of ``--chunk`` tokens. Fresh chunks (no cached
prefix) attend over their own K/V with no gather; they are also timed as prefixed chunks with an empty
prefix (each gathers its own blocks from the pool, the path before the change). Chunks after a cached
prefix still gather prefix + chunk. Both on both layouts.

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
from services.engine import cpu_kernels  # noqa: E402
from services.engine.attention import (  # noqa: E402
    AttentionBatch,
    DecodeGroup,
    PrefixChunk,
    gather,
    paged_attention,
)
from services.engine.cpu_kernels import CpuKernels  # noqa: E402
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


def gather_advanced(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Same result as ``attention.gather`` by advanced indexing of the strided per-layer view (the old gather)."""
    b, n = block_tables.shape
    return cache[block_tables].reshape(b, n * cache.shape[1], cache.shape[2], cache.shape[3]).transpose(1, 2)


# ---------------------------------------------------------------------------------------------- batches


def step_batch(contexts: list[int], new_tokens: list[int], block: int, num_blocks: int, heads: int,
               kv_heads: int, dim: int, rng: random.Random, kernels: CpuKernels | None = None) -> tuple:
    """An ``AttentionBatch`` from the engine's ``prepare_inputs``: sequence i has ``contexts[i]`` tokens after
    this step, ``new_tokens[i]`` of them computed now. Blocks are drawn at random from the pool. With
    ``kernels``, also the same step laid out for the fused CPU kernels (last item; else None)."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    scheduled = []
    for i, (ctx, n) in enumerate(zip(contexts, new_tokens, strict=True)):
        blocks = [free.pop() for _ in range(-(-ctx // block))]
        seq = SequenceState(f"s{i}", [1] * ctx, ctx - n if n == 1 else ctx, ctx - n, blocks, SamplingParams())
        scheduled.append((seq, n))
    inputs = prepare_inputs(scheduled, block, CPU)
    fused = prepare_inputs(scheduled, block, CPU, kernels).attention if kernels is not None else None
    t = int(inputs.input_ids.shape[0])
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    q = torch.randn(t, heads, dim, generator=g)
    k = torch.randn(t, kv_heads, dim, generator=g)
    v = torch.randn(t, kv_heads, dim, generator=g)
    return inputs.attention, q, k, v, fused


def one_bucket(batch: AttentionBatch) -> AttentionBatch:
    """The same decodes (same token order) as a single group padded to the longest context."""
    width = max(g.block_tables.shape[1] for g in batch.decodes)
    keys = max(g.mask.shape[-1] for g in batch.decodes)
    tables = torch.cat([F.pad(g.block_tables, (0, width - g.block_tables.shape[1])) for g in batch.decodes])
    mask = torch.cat([F.pad(g.mask, (0, keys - g.mask.shape[-1])) for g in batch.decodes])
    size = sum(g.size for g in batch.decodes)
    return AttentionBatch(batch.slot_blocks, batch.slot_offsets, [DecodeGroup(0, size, tables, mask)])


def decode_rows(batch: AttentionBatch, block: int) -> list[tuple[torch.Tensor, int]]:
    """(block table, context length) of each decode token, in token order, read off the engine's groups."""
    rows = []
    for g in batch.decodes:
        for table, mask in zip(g.block_tables, g.mask, strict=True):
            ctx = int(mask.sum())
            rows.append((table[: -(-ctx // block)], ctx))
    return rows


def as_gathered_chunks(batch: AttentionBatch, block_tables: list[torch.Tensor]) -> AttentionBatch:
    """Fresh chunks turned into ``PrefixChunk``s with an empty prefix: each gathers its own blocks from the pool
    and attends with a causal mask (the path fresh chunks took before they attended over their own K/V)."""
    chunks = []
    it = iter(block_tables)
    for g in batch.fresh:
        causal = torch.ones(g.length, g.length, dtype=torch.bool).tril()
        for i in range(g.count):
            chunks.append(PrefixChunk(g.token_start + i * g.length, g.length, g.length, next(it), causal))
    return AttentionBatch(batch.slot_blocks, batch.slot_offsets, prefixed=chunks)


def fresh_block_tables(batch: AttentionBatch, block: int) -> list[torch.Tensor]:
    """Each fresh chunk's block table, read off the slots its tokens were written to."""
    tables = []
    for g in batch.fresh:
        for i in range(g.count):
            start = g.token_start + i * g.length
            tables.append(batch.slot_blocks[start : start + g.length : block].clone())
    return tables


def per_sequence_decode(q, k, v, k_cache, v_cache, batch: AttentionBatch,
                        rows: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """Decode attention as one gather and one SDPA call per sequence (exact context, no mask)."""
    k_cache[batch.slot_blocks, batch.slot_offsets] = k
    v_cache[batch.slot_blocks, batch.slot_offsets] = v
    out = torch.empty_like(q)
    for i, (table, ctx) in enumerate(rows):
        keys = gather(k_cache, table[None])[:, :, :ctx]
        values = gather(v_cache, table[None])[:, :, :ctx]
        out[i] = F.scaled_dot_product_attention(q[i, :, None][None], keys, values, enable_gqa=True)[0, :, 0]
    return out


def grouped_decode(q, k, v, k_cache, v_cache, batch: AttentionBatch, gather_fn) -> torch.Tensor:
    """The decode part of ``paged_attention`` (all tokens are decodes) with a pluggable gather."""
    k_cache[batch.slot_blocks, batch.slot_offsets] = k
    v_cache[batch.slot_blocks, batch.slot_offsets] = v
    out = torch.empty_like(q)
    for g in batch.decodes:
        span = slice(g.token_start, g.token_start + g.size)
        o = F.scaled_dot_product_attention(q[span].unsqueeze(2), gather_fn(k_cache, g.block_tables),
                                           gather_fn(v_cache, g.block_tables), attn_mask=g.mask, enable_gqa=True)
        out[span] = o.squeeze(2)
    return out


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


def check(variants: list[tuple[str, object]], ref: torch.Tensor) -> None:
    for name, fn in variants:
        torch.testing.assert_close(fn(), ref, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


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
    kernels = cpu_kernels.load()  # None without a C compiler: the fused row is left out
    results: dict[str, list[dict]] = {}

    # -- decode ---------------------------------------------------------------------------------------------
    contexts = [rng.randint(args.min_context, args.max_context) for _ in range(args.decode_seqs)]
    mean_ctx = round(sum(contexts) / len(contexts))
    for key, ctxs in (("decode", contexts), ("decode_equal", [mean_ctx] * len(contexts))):
        batch, q, k, v, fused = step_batch(ctxs, [1] * len(ctxs), bs, num_blocks, args.heads, hkv, hd, rng,
                                           kernels)
        single = one_bucket(batch)
        rows = decode_rows(batch, bs)
        assert sorted(c for _, c in rows) == sorted(ctxs)
        ref = paged_attention(q, k, v, bm_k, bm_v, batch)
        variants = [
            ("engine: length buckets, index_select gather", lambda b=batch, q=q, k=k, v=v: paged_attention(
                q, k, v, bm_k, bm_v, b)),
            ("per-sequence SDPA loop, index_select gather", lambda b=batch, q=q, k=k, v=v, r=rows: (
                per_sequence_decode(q, k, v, bm_k, bm_v, b, r))),
            ("one padded bucket, index_select gather", lambda b=single, q=q, k=k, v=v: paged_attention(
                q, k, v, bm_k, bm_v, b)),
            ("one padded bucket, cache[block_tables] gather (old engine)", lambda b=single, q=q, k=k, v=v: (
                grouped_decode(q, k, v, bm_k, bm_v, b, gather_advanced))),
            ("engine, layer-major pool", lambda b=batch, q=q, k=k, v=v: paged_attention(
                q, k, v, lm_k, lm_v, b)),
        ]
        if fused is not None:
            variants.append(("engine: fused C kernel (blocks read in place)", lambda b=fused, q=q, k=k, v=v: (
                paged_attention(q, k, v, bm_k, bm_v, b))))
        check(variants, ref)
        exact = sum(ctxs)
        padded = sum(g.size * g.mask.shape[-1] for g in batch.decodes)
        padded_one = single.decodes[0].size * single.decodes[0].mask.shape[-1]
        title = (f"decode attention, one layer, block-major unless noted (KV write + attention): {len(ctxs)} "
                 f"sequences, contexts {min(ctxs)}..{max(ctxs)} (mean {exact / len(ctxs):.0f})")
        note = (f"{len(batch.decodes)} bucket(s) padded to "
                f"{'/'.join(str(g.mask.shape[-1]) for g in batch.decodes)} keys; keys attended: exact {exact}, "
                f"buckets {padded} (+{padded / exact - 1:.0%}), one bucket {padded_one} "
                f"(+{padded_one / exact - 1:.0%})")
        results[key] = table(title, variants, mrt, rounds, note=note)
        if key == "decode":
            bt = single.decodes[0].block_tables
    for cache_k in (bm_k, lm_k):
        assert torch.equal(gather_advanced(cache_k, bt), gather(cache_k, bt))
    results["gather"] = table(
        f"K gather alone, all {bt.shape[0]} decodes of the first batch padded to {bt.shape[1] * bs} keys", [
            ("block-major, index_select (engine attention.gather)", lambda: gather(bm_k, bt)),
            ("layer-major, index_select", lambda: gather(lm_k, bt)),
            ("block-major, cache[block_tables] (old gather)", lambda: gather_advanced(bm_k, bt)),
            ("layer-major, cache[block_tables]", lambda: gather_advanced(lm_k, bt)),
        ], mrt, rounds)

    # -- prefill --------------------------------------------------------------------------------------------
    prefill = []
    n, c = args.chunks, args.chunk
    fb, fq, fk, fv, _ = step_batch([c] * n, [c] * n, bs, num_blocks, args.heads, hkv, hd, rng)
    assert not fb.prefixed and sum(g.count for g in fb.fresh) == n
    gathered = as_gathered_chunks(fb, fresh_block_tables(fb, bs))
    fresh = [
        (f"{n}x{c} fresh prompts, own K/V, no gather (engine)",
         lambda: paged_attention(fq, fk, fv, bm_k, bm_v, fb)),
        (f"{n}x{c} fresh prompts, own K/V, layer-major",
         lambda: paged_attention(fq, fk, fv, lm_k, lm_v, fb)),
        (f"{n}x{c} fresh prompts, each gathered, one SDPA per chunk",
         lambda: paged_attention(fq, fk, fv, bm_k, bm_v, gathered)),
        (f"{n}x{c} fresh prompts, each gathered, layer-major",
         lambda: paged_attention(fq, fk, fv, lm_k, lm_v, gathered)),
    ]
    check(fresh, paged_attention(fq, fk, fv, bm_k, bm_v, fb))
    pb, pq, pk, pv, _ = step_batch([args.prefix + c] * n, [c] * n, bs, num_blocks, args.heads, hkv, hd, rng)
    assert not pb.fresh and len(pb.prefixed) == n
    prefixed = [
        (f"{n}x{c} after a {args.prefix}-token cached prefix (engine)",
         lambda: paged_attention(pq, pk, pv, bm_k, bm_v, pb)),
        (f"{n}x{c} after a {args.prefix}-token cached prefix, layer-major",
         lambda: paged_attention(pq, pk, pv, lm_k, lm_v, pb)),
    ]
    check(prefixed, paged_attention(pq, pk, pv, bm_k, bm_v, pb))
    prefill = fresh + prefixed
    results["prefill"] = table("prefill attention, one layer, block-major unless noted (KV write + attention)",
                               prefill, mrt, rounds)

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
