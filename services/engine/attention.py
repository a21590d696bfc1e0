"""Paged attention over a mixed batch of decodes and prompt chunks (gather + SDPA, or fused C kernels on the CPU).

The step's tokens are flattened: ``[T, heads, head_dim]``. Every token's K/V is first written into its slot
(block id, offset). Then three kinds of groups attend:

* **decodes** (one query token each), bucketed by context length so padding stays small: a bucket's
  block tables are padded to its longest context, gathered in one ``index_select``, masked by length;
* **fresh chunks** (no cached prefix) of equal length, laid out back to back: one causal SDPA call over
  their own K/V, no gather at all (a whole-prompt prefill is this case);
* **continuing chunks** (a cached prefix): each gathers prefix + chunk and attends causally with offset::

      keys:    [ 0 ............ start | start ......... start+q )
      query i: sees keys j <= start + i

In a sliding-window layer (Mistral, Phi-3, Gemma's local layers, Qwen2/3 with a window) a query at position p sees
keys ``(p - window, p]`` only: the same groups with a window mask, or the kernels told the window, which then
skip the blocks before it. Llama 4's chunked layers are the same with another mask: a query at p sees keys
``[p - p % chunk, p]``, those of its own chunk. GPT-OSS's attention sinks add one term per head to each softmax's denominator.
ALiBi (BLOOM, MPT) adds ``slope_h * (j - p)`` to head h's score of key j for a query at p (the same softmax as
transformers' ``slope_h * j``, a constant per row apart): a float mask in the torch groups, a term in the kernels.

Measured in bench/attention_impl.py: ``index_select`` on the flattened block rows gathers ~5x faster than
advanced indexing of the strided per-layer view, and length buckets beat padding every decode to the
longest. On the CPU in fp32, when the fused kernels load (services/engine/cpu_kernels), K/V are written by
one C call, the decodes are one ``DecodeRows`` and the prompt chunks one ``ChunkRows``: each sequence walks
its block table in place, no gather, no padding (64 decodes of 129-693 tokens: 0.74 ms a layer against 4.3
ms for the bucketed gather + SDPA; a 64-token chunk after 512 cached: 0.26 against 0.38 ms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from services.engine.fp8 import FP8_DTYPES
from services.engine.kv_quant import as_bytes, quantize, widen

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels
    from services.engine.recurrent_state import RecurrentBatch


@dataclass
class DecodeGroup:
    """Decodes of similar context length; their tokens are ``[token_start, token_start + size)``."""

    token_start: int
    size: int
    block_tables: torch.Tensor  # [size, max_blocks], padded with block 0 (masked out)
    # [size, 1, 1, keys] bool: key is inside the context; keys = the longest context, whose sequence attends
    # over exactly its keys (in bf16, SDPA over keys padded to a whole block rounds otherwise: a decode of a
    # lone sequence is then transformers' own, and so is Gemma 4's fast prefill's first token).
    mask: torch.Tensor
    # The same, inside the last ``AttentionBatch.window`` keys only; None where the window cuts nothing off.
    window_mask: torch.Tensor | None = None


@dataclass
class DecodeRows:
    """Every decode of the step for the fused kernel: tokens ``[token_start, token_start + size)``."""

    token_start: int
    size: int
    block_tables: torch.Tensor  # [size, max_blocks] int64, padded with block 0 (never read)
    context_lens: torch.Tensor  # [size] int64


@dataclass
class ChunkRows:
    """Every prompt chunk of the step for the fused kernel, fresh or after a cached prefix."""

    token_starts: torch.Tensor  # [chunks] int64: first token of each chunk in the flat batch
    lens: torch.Tensor  # [chunks] int64: tokens of each chunk
    prefix: torch.Tensor  # [chunks] int64: tokens before it (cached prefix or earlier chunks)
    block_tables: torch.Tensor  # [chunks, max_blocks] int64, padded with block 0 (never read)


@dataclass
class FreshChunks:
    """``count`` prompt chunks of ``length`` tokens with no cached prefix, back to back from ``token_start``."""

    token_start: int
    count: int
    length: int
    # [length, length] causal mask within the window, when the window is shorter than the chunk (else None:
    # plain causal attention is the same thing).
    window_mask: torch.Tensor | None = None


@dataclass
class PrefixChunk:
    """A prompt chunk after a cached prefix: tokens ``[token_start, token_start + num_tokens)``."""

    token_start: int
    num_tokens: int
    context_len: int  # cached prefix + this chunk
    block_table: torch.Tensor  # [ceil(context_len / block_size)] block ids
    mask: torch.Tensor  # [num_tokens, context_len] bool
    window_mask: torch.Tensor | None = None  # the same, inside the window; None where it cuts nothing off


@dataclass
class AttentionBatch:
    """Where each token's K/V goes and what each query attends to. Built by ``inputs.prepare_inputs``."""

    slot_blocks: torch.Tensor  # [T] block id of each token's slot
    slot_offsets: torch.Tensor  # [T] offset inside the block
    decodes: list[DecodeGroup] = field(default_factory=list)
    fresh: list[FreshChunks] = field(default_factory=list)
    prefixed: list[PrefixChunk] = field(default_factory=list)
    decode_rows: DecodeRows | None = None  # instead of ``decodes`` when ``kernels`` is set
    chunk_rows: ChunkRows | None = None  # instead of ``fresh`` and ``prefixed`` when ``kernels`` is set
    kernels: CpuKernels | None = None
    # Sliding-window attention: the keys a query sees in a sliding layer (itself and the window - 1 before
    # it, as transformers masks them); the groups' window masks are built only when this is set. Or Llama 4's
    # chunked attention (never both in one model): a query at p sees keys [p - p % chunk, p], and the groups'
    # window masks hold that.
    window: int | None = None
    chunk: int | None = None
    # Gemma 2: scores become softcap * tanh(score / softcap) before the softmax (None: not capped).
    softcap: float | None = None
    # Linear-attention layers (gated_delta_net.py): each sequence's recurrent state; None in a model without.
    recurrent: RecurrentBatch | None = None
    # ALiBi's float masks of the torch groups, built by the first layer and read by the rest (every layer has the
    # same slopes).
    alibi_masks: AlibiMasks | None = None
    # A float8 e4m3 pool read by the torch ops in fp32: the fused kernels' gather, which widens as it copies
    # (exact, so whichever ops the model runs; torch's own e4m3 conversion is ~13x slower than the gather).
    float8_kernels: CpuKernels | None = None
    # The rows logits are taken from, as a batch of their own, where the model's last layers write no KV
    # (Gemma 4's KV-sharing layers: no later token reads their output, so those layers need no other rows).
    sampled: SampledRows | None = None
    # Sparse attention (dsa.py): each sequence's chosen keys ([rows, keys] bool) by the last layer with an indexer,
    # which the layers sharing its choice (GLM-5's) read.
    index_masks: list[torch.Tensor] | None = None
    # Its sequences as (first row, rows, block table, keys), a group of decodes as one (first row, decodes, block
    # tables, [decodes, keys] mask of their contexts), listed by the first such layer for the others (their
    # lengths read from the device once a step, not once a layer).
    index_sequences: list[tuple[int, int, torch.Tensor | None, int | torch.Tensor]] | None = None
    # Each token's position in its sequence ([T]), for the mixers that start a sequence otherwise than they go on
    # (RecurrentGemma's RG-LRU at position 0).
    positions: torch.Tensor | None = None


@dataclass
class SampledRows:
    """The rows of a flat batch that logits are taken from (``StepInputs.logits_index``'s), each sequence's as
    the suffix of its rows from its first such row (the rows it samples or scores, and any between), attending
    as they do in the whole batch: over the KV the batch's earlier layers wrote."""

    rows: torch.Tensor  # [R] rows of the whole batch, in this batch's order
    logits_index: torch.Tensor  # the step's logits_index, as rows of this batch
    batch: AttentionBatch | None  # None when no row is sampled (every chunk stops short of its sequence's end)


class AlibiMasks(NamedTuple):
    """Each torch group's float mask with ALiBi's biases (``_alibi_mask``), in ``AttentionBatch``'s group order."""

    decodes: list[torch.Tensor]
    fresh: list[torch.Tensor]
    prefixed: list[torch.Tensor]


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    sliding: bool = False,
    sinks: torch.Tensor | None = None,
    scale: float | None = None,
    alibi: torch.Tensor | None = None,
    alibi_bf16: bool = False,
    kv_scale: tuple[float, float] | None = None,
    sink_scaled: bool = False,
) -> torch.Tensor:
    """q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``; caches ``[num_blocks, block_size, Hkv, D]``. Returns ``[T, Hq, D]``.
    ``sliding``: this layer attends within ``batch.window`` or ``batch.chunk`` only (a no-op when the batch has
    neither).
    ``sinks`` ``[Hq]`` (GPT-OSS): each head's softmax has one more logit, its sink, that weighs no value, so a
    head can attend to nothing. ``scale``: the scores' scale where it is not ``D ** -0.5`` (Gemma's), applied as
    transformers' attention applies it (the fused kernels take it folded into q: fp32, where that rounds alike).
    ``alibi`` ``[Hq]`` fp32: each head's ALiBi slope (``alibi_slopes``), for a model without windows, caps or sinks;
    ``alibi_bf16``: Falcon-RW's biases (``_alibi_mask``; the slopes bf16 values). ``kv_scale``: a float8 pool's
    (key, value) scales (a checkpoint's kv_cache_scheme): keys are stored as ``k / scale`` and read back times it
    (None: 1; an unquantized pool ignores them). ``sink_scaled``: the sinks as GraniteSWA's transformers applies
    them, the softmax's output times ``sigmoid(logsumexp(scores) - sink)`` (the same in exact arithmetic; the fused
    kernels, fp32, take GPT-OSS's form)."""
    out = torch.empty_like(q)
    windowed = sliding and (batch.window is not None or batch.chunk is not None)
    quantized = k_cache.dtype in FP8_DTYPES  # a float8 pool (kv_quant.py): written rounded, read widened
    k_scale, v_scale = kv_scale if quantized and kv_scale is not None else (None, None)
    if quantized:
        k, v = quantize(k, k_cache.dtype, k_scale), quantize(v, v_cache.dtype, v_scale)
        as_bytes(k_cache)[batch.slot_blocks, batch.slot_offsets] = as_bytes(k)
        as_bytes(v_cache)[batch.slot_blocks, batch.slot_offsets] = as_bytes(v)
        # A fresh chunk attends what the cache holds, as later steps will.
        k, v = widen(k, q.dtype, k_scale), widen(v, q.dtype, v_scale)
    if batch.kernels is not None:  # (never with a float8 pool: the runner leaves the kernels off)
        if scale is not None:
            q = q * (scale * q.shape[-1] ** 0.5)
        window, chunk = (batch.window, batch.chunk) if windowed else (None, None)
        batch.kernels.kv_write(k_cache, v_cache, k, v, batch.slot_blocks, batch.slot_offsets)
        if (d := batch.decode_rows) is not None:
            span = slice(d.token_start, d.token_start + d.size)
            batch.kernels.paged_decode(out[span], q[span], k_cache, v_cache, d.block_tables, d.context_lens, window,
                                       batch.softcap, sinks, chunk, alibi, alibi_bf16)
        if (c := batch.chunk_rows) is not None:
            batch.kernels.paged_prefill(out, q, k_cache, v_cache, c.token_starts, c.lens, c.prefix, c.block_tables,
                                        window, batch.softcap, sinks, chunk, alibi, alibi_bf16)
    elif not quantized:  # (a float8 pool's are written above)
        k_cache[batch.slot_blocks, batch.slot_offsets] = k
        v_cache[batch.slot_blocks, batch.slot_offsets] = v
    if alibi is not None and batch.alibi_masks is None:
        batch.alibi_masks = _alibi_masks(batch, alibi, q.dtype, q.shape[-1] if alibi_bf16 else None)
    for i, g in enumerate(batch.decodes):
        span = slice(g.token_start, g.token_start + g.size)
        mask = g.window_mask if windowed and g.window_mask is not None else g.mask
        if alibi is not None:
            mask = batch.alibi_masks.decodes[i]
        keys = g.mask.shape[-1]
        o = _sdpa(q[span].unsqueeze(2),
                  gather(k_cache, g.block_tables, q.dtype, batch.float8_kernels, k_scale)[:, :, :keys],
                  gather(v_cache, g.block_tables, q.dtype, batch.float8_kernels, v_scale)[:, :, :keys], mask,
                  batch.softcap, sinks, scale=scale, sink_scaled=sink_scaled)
        out[span] = o.squeeze(2)
    for i, g in enumerate(batch.fresh):
        span = slice(g.token_start, g.token_start + g.count * g.length)
        mask = g.window_mask if windowed else None
        if alibi is not None:
            mask = batch.alibi_masks.fresh[i]
        o = _sdpa(_per_chunk(q[span], g), _per_chunk(k[span], g), _per_chunk(v[span], g), mask, batch.softcap,
                  sinks, causal=mask is None, scale=scale, sink_scaled=sink_scaled)
        out[span] = o.transpose(1, 2).reshape(-1, q.shape[1], q.shape[2])
    for i, c in enumerate(batch.prefixed):
        span = slice(c.token_start, c.token_start + c.num_tokens)
        table = c.block_table[None]
        keys = gather(k_cache, table, q.dtype, batch.float8_kernels, k_scale)[:, :, : c.context_len]
        values = gather(v_cache, table, q.dtype, batch.float8_kernels, v_scale)[:, :, : c.context_len]
        mask = c.window_mask if windowed and c.window_mask is not None else c.mask
        if alibi is not None:
            mask = batch.alibi_masks.prefixed[i]
        o = _sdpa(q[span].transpose(0, 1).unsqueeze(0), keys, values, mask, batch.softcap, sinks, scale=scale,
                  sink_scaled=sink_scaled)
        out[span] = o.squeeze(0).transpose(0, 1)
    return out


def alibi_slopes(num_heads: int, bias_max: float) -> torch.Tensor:
    """Each head's ALiBi slope ``[num_heads]`` fp32, as transformers' MPT computes them (BLOOM's formula gives the
    same with ``bias_max`` 8): ``2 ** -(bias_max * i / n)`` for i = 1..n, n the head count rounded up to a power
    of two; with fewer heads than n, the even i first, then the odd ones."""
    n = 2 ** math.ceil(math.log2(num_heads))
    slopes = 1.0 / torch.pow(2, torch.arange(1, n + 1, dtype=torch.int64).float() * (bias_max / n))
    if n != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


def falcon_alibi_slopes(num_heads: int) -> torch.Tensor:
    """Falcon-RW's slopes, op for op as transformers' ``build_alibi_tensor`` computes them (BLOOM's formula: the
    values ``alibi_slopes(n, 8)`` gives, which bf16 may round otherwise at a last bit), rounded to bf16 as it
    rounds them before use (fp32 values)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        remaining = min(closest, num_heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32))])
    return slopes.bfloat16().float()


def _alibi_masks(batch: AttentionBatch, slopes: torch.Tensor, dtype: torch.dtype,
                 bf16_head_dim: int | None = None) -> AlibiMasks:
    """The float masks of ``batch``'s torch groups with ALiBi's biases: a decode's query is its context's last
    token, a chunk's rows follow its prefix. ``bf16_head_dim``: Falcon-RW's biases, for heads this wide."""
    fresh = []
    for g in batch.fresh:
        rows = torch.arange(g.length, device=slopes.device)[:, None]
        fresh.append(_alibi_mask(slopes, rows, rows >= rows.T, dtype, bf16_head_dim))
    prefixed = [_alibi_mask(slopes, torch.arange(c.context_len - c.num_tokens, c.context_len,
                                                 device=slopes.device)[:, None], c.mask, dtype, bf16_head_dim)
                for c in batch.prefixed]
    return AlibiMasks([_alibi_mask(slopes, g.mask.sum(-1, keepdim=True) - 1, g.mask, dtype, bf16_head_dim)
                       for g in batch.decodes], fresh, prefixed)


def _alibi_mask(slopes: torch.Tensor, query_pos: torch.Tensor, seen: torch.Tensor, dtype: torch.dtype,
                bf16_head_dim: int | None = None) -> torch.Tensor:
    """The float mask of ``seen`` (bool, ``[rows, keys]`` or ``[batch, 1, rows, keys]``; True where a key is seen)
    with each head's ALiBi bias, ``slope * (key - query_pos)``, where it is seen: ``[heads, rows, keys]`` or ``[batch,
    heads, rows, keys]`` in ``dtype``. ``query_pos``: each row's position, ``[rows, 1]`` or ``[batch, 1, rows, 1]``.

    ``bf16_head_dim``: Falcon-RW's bias instead, op for op as transformers computes it: the slope in bf16 times the
    key's absolute position, a product rounded to bf16 (past 256 positions it is no longer linear in the key, so
    the query's position cannot be taken off), then over the square root of the head width, as it is added to
    the already scaled scores."""
    keys = torch.arange(seen.shape[-1], device=slopes.device)
    if bf16_head_dim is not None:
        bias = (slopes.bfloat16().view(-1, 1, 1) * keys).float() / math.sqrt(bf16_head_dim)
        bias = bias.expand(torch.broadcast_shapes(bias.shape, query_pos.shape))  # each row alike
    else:
        bias = slopes.view(-1, 1, 1) * (keys - query_pos)
    return bias.masked_fill(~seen, float("-inf")).to(dtype)


# The written-out attention holds its scores: queries go in tiles of at most this many scores (1 GiB in fp32),
# so a long chunk never asks for [heads, rows, keys] at once (a 32K-token prompt in one chunk: 256 GiB).
EAGER_SCORES = 1 << 28


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, softcap: float | None,
          sinks: torch.Tensor | None = None, causal: bool = False, scale: float | None = None,
          sink_scaled: bool = False) -> torch.Tensor:
    """SDPA with grouped KV heads (``mask`` True where a key is seen; ``causal`` instead of a mask); with
    ``softcap`` or ``sinks``, written out as transformers' eager attention (SDPA can neither cap scores nor
    add a sink to the softmax), in tiles of queries."""
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True,
                                              scale=scale)
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    rows = q.shape[-2]
    tile = max(1, EAGER_SCORES // (q.numel() // (rows * q.shape[-1]) * k.shape[-2]))
    if tile >= rows:
        return _eager(q, k, v, mask, softcap, sinks, causal, scale=scale, sink_scaled=sink_scaled)
    out = torch.empty_like(q)
    for start in range(0, rows, tile):
        end = min(rows, start + tile)
        part = mask[..., start:end, :] if mask is not None and mask.shape[-2] == rows else mask
        out[..., start:end, :] = _eager(q[..., start:end, :], k, v, part, softcap, sinks, causal, start, scale,
                                        sink_scaled)
    return out


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, softcap: float | None,
           sinks: torch.Tensor | None, causal: bool, first_row: int = 0, scale: float | None = None,
           sink_scaled: bool = False) -> torch.Tensor:
    """Attention of query rows ``[first_row, first_row + rows)`` (causal: row i sees keys up to i), k and v with
    as many heads as q."""
    scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if causal:
        rows = torch.arange(first_row, first_row + q.shape[-2], device=q.device)
        mask = rows[:, None] >= torch.arange(k.shape[-2], device=q.device)[None, :]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
    if sink_scaled:  # GraniteSWA's: the output scaled by the share the sink leaves, in fp32, as transformers has it
        share = (torch.logsumexp(scores, dim=-1) - sinks.to(scores.dtype).view(-1, 1)).float().sigmoid()
        out = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
        return out * share[..., None].to(out.dtype)
    # The sink is one more column of the softmax, dropped after it: it only adds to the denominator. As
    # transformers' GPT-OSS computes it: shifted by the row's max and the softmax taken in the scores' dtype.
    sink = sinks.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    logits = torch.cat([scores, sink], dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = torch.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]
    return probs.to(q.dtype) @ v


def _per_chunk(x: torch.Tensor, g: FreshChunks) -> torch.Tensor:
    """``[count * length, heads, dim]`` back-to-back chunks → ``[count, heads, length, dim]``."""
    return x.view(g.count, g.length, x.shape[1], x.shape[2]).transpose(1, 2)


def gather(cache: torch.Tensor, block_tables: torch.Tensor, dtype: torch.dtype | None = None,
           float8_kernels: CpuKernels | None = None, scale: float | None = None) -> torch.Tensor:
    """``[B, n]`` block ids → ``[B, Hkv, n * block_size, D]`` keys or values of those blocks (widened to ``dtype``
    from a float8 pool and times its ``scale``, by ``float8_kernels`` where they apply)."""
    num_blocks, block_size, heads, dim = cache.shape
    b, n = block_tables.shape
    if float8_kernels is not None and cache.dtype == torch.float8_e4m3fn and dtype == torch.float32:
        rows = float8_kernels.gather_e4m3(cache, block_tables.reshape(-1).contiguous(), scale)
        return rows.view(b, n * block_size, heads, dim).transpose(1, 2)
    # One contiguous row per block (a float8 pool's as bytes: kv_quant.as_bytes).
    rows = as_bytes(cache).flatten(1).index_select(0, block_tables.reshape(-1)).view(cache.dtype)
    if dtype is not None and rows.dtype != dtype:
        rows = widen(rows, dtype, scale)
    return rows.view(b, n * block_size, heads, dim).transpose(1, 2)
