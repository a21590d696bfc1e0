"""DeepSeek Sparse Attention (DSA: DeepSeek-V3.2, GLM-5): latent attention (mla.py) in which each query attends
only the ``index_topk`` keys its indexer scores highest, as transformers' ``DeepseekV32Indexer`` selects them.

The indexer has heads of its own (``index_n_heads`` of ``index_head_dim``): a query's head h scores key j as
``relu(q_h . k_j) / sqrt(index_head_dim)`` against one shared, LayerNormed key per token, and the heads' scores are
summed weighed by a projection of the query token's input (``weights_proj``, over sqrt(index_n_heads)); both q's
and k's first ``qk_rope_head_dim`` features rotate (halves, not interleaved). The top k of the keys a query sees
are its keys: the others are masked, as transformers masks them (a query seeing no more than k keys sees them all).

The indexer's keys are cached after the latent, in the same row of the pool (``head_dim`` is ``kv_lora_rank +
qk_rope_head_dim + index_head_dim``), so prefix caching, swapping and KV transfers carry them with it; attention
reads the latent's part only. A step's decodes are scored and attend together (their keys gathered once, a
[decodes, keys] score matrix, padded keys masked); prompt chunks one sequence at a time ([rows, keys] each): the
torch path, with or without the fused kernels' batch layout.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from services.engine.attention import AttentionBatch, _sdpa, gather
from services.engine.fp8 import FP8_DTYPES
from services.engine.kv_quant import as_bytes, quantize, widen


def indexed_attention(query: torch.Tensor, key: torch.Tensor, index_q: torch.Tensor | None,
                      index_weights: torch.Tensor | None, cache: torch.Tensor, batch: AttentionBatch,
                      topk: int) -> torch.Tensor:
    """``query`` ``[T, H, W]`` (W the latent's width, scaled for W ** -0.5), ``key`` ``[T, 1, W + I]`` (the latent
    then the indexer's key: the cache rows), ``index_q`` ``[T, Hi, I]`` (rotated), ``index_weights`` ``[T, Hi]``
    fp32 (over sqrt(Hi)); ``cache`` ``[num_blocks, block_size, 1, W + I]``. Returns ``[T, H, W]``: each query's
    attention over the latents of its top ``topk`` keys. ``index_q`` None: a layer without an indexer (GLM-5's
    shared ones), whose queries attend the keys the batch's last indexing layer chose (``batch.index_masks``)."""
    width = query.shape[-1]
    if cache.dtype in FP8_DTYPES:  # a float8 pool: written rounded, read widened (fresh rows too, as later steps)
        stored = quantize(key, cache.dtype, None)
        as_bytes(cache)[batch.slot_blocks, batch.slot_offsets] = as_bytes(stored)
        key = widen(stored, query.dtype, None)
    else:
        cache[batch.slot_blocks, batch.slot_offsets] = key
    if index_q is None and batch.index_masks is None:
        raise RuntimeError("a layer sharing an earlier layer's choice of keys ran before any layer chose")
    out = torch.empty_like(query)
    masks = []
    if batch.index_sequences is None:
        batch.index_sequences = list(_sequences(batch))
    for i, (start, rows, table, keys) in enumerate(batch.index_sequences):
        span = slice(start, start + rows)
        if isinstance(keys, torch.Tensor):  # decodes: one query each, keys [rows, longest] (True: in its context)
            k = gather(cache, table, query.dtype, batch.float8_kernels)[:, 0, : keys.shape[1]]
            mask = batch.index_masks[i] if index_q is None else _chosen_batched(
                index_q[span], index_weights[span], k[..., width:], keys, topk)
            latents = k[:, None, :, :width]
            out[span] = _sdpa(query[span][:, :, None], latents, latents, mask[:, None, None], None)[:, :, 0]
        else:
            k = key[span, 0] if table is None else gather(cache, table[None], query.dtype,
                                                          batch.float8_kernels)[0, 0, :keys]
            mask = batch.index_masks[i] if index_q is None else _chosen(index_q[span], index_weights[span],
                                                                        k[:, width:], topk)
            latents = k[None, None, :, :width]
            out[span] = _sdpa(query[span].transpose(0, 1)[None], latents, latents, mask, None)[0].transpose(0, 1)
        masks.append(mask)
    batch.index_masks = masks
    return out


def _chosen(index_q: torch.Tensor, index_weights: torch.Tensor, index_k: torch.Tensor, topk: int) -> torch.Tensor:
    """One sequence's chosen keys, ``[rows, keys]`` bool: of the keys each of its last ``rows`` queries sees, the
    ``topk`` its indexer ranks highest (all of them where it sees no more)."""
    rows, keys = index_q.shape[0], index_k.shape[0]
    seen = torch.arange(keys, device=index_k.device)[None, :] <= torch.arange(keys - rows, keys,
                                                                               device=index_k.device)[:, None]
    scores = F.relu(index_q.float() @ index_k.float().T * index_q.shape[-1] ** -0.5)  # [rows, Hi, keys]
    ranked = (index_weights.unsqueeze(-2) @ scores).squeeze(-2).masked_fill(~seen, float("-inf"))
    chosen = ranked.topk(min(topk, keys), dim=-1).indices
    return torch.zeros_like(seen).scatter_(1, chosen, True) & seen


def _chosen_batched(index_q: torch.Tensor, index_weights: torch.Tensor, index_k: torch.Tensor, seen: torch.Tensor,
                    topk: int) -> torch.Tensor:
    """``_chosen`` of one query each of many sequences: ``index_k`` ``[B, keys, I]`` padded to the longest,
    ``seen`` ``[B, keys]`` True inside each one's context. Returns ``[B, keys]`` bool."""
    scores = F.relu(index_q.float() @ index_k.float().transpose(-1, -2) * index_q.shape[-1] ** -0.5)  # [B, Hi, keys]
    ranked = (index_weights.unsqueeze(1) @ scores).squeeze(1).masked_fill(~seen, float("-inf"))
    chosen = ranked.topk(min(topk, seen.shape[1]), dim=-1).indices  # a short context's padding is never True
    return torch.zeros_like(seen).scatter_(1, chosen, True) & seen


def _sequences(batch: AttentionBatch) -> Iterator[tuple[int, int, torch.Tensor | None, int | torch.Tensor]]:
    """The batch's decodes (first row, decodes, block tables, ``[decodes, keys]`` True inside each context), and
    each other sequence as (first row, rows, block table or None where its keys are its rows, keys): from the torch
    groups or the fused kernels' layout, whichever the batch holds."""
    for g in batch.decodes:
        yield g.token_start, g.size, g.block_tables, g.mask.reshape(g.size, -1)
    for f in batch.fresh:
        for j in range(f.count):
            yield f.token_start + j * f.length, f.length, None, f.length
    for c in batch.prefixed:
        yield c.token_start, c.num_tokens, c.block_table, c.context_len
    if (d := batch.decode_rows) is not None and d.size:
        keys = int(d.context_lens.max())
        seen = torch.arange(keys, device=d.context_lens.device)[None, :] < d.context_lens[:, None]
        yield d.token_start, d.size, d.block_tables, seen
    if (c := batch.chunk_rows) is not None:
        for j, (s, n, p) in enumerate(zip(c.token_starts.tolist(), c.lens.tolist(), c.prefix.tolist(), strict=True)):
            yield s, n, c.block_tables[j], p + n


class Indexer(torch.nn.Module):
    """transformers' ``DeepseekV32Indexer``'s weights (``self_attn.indexer.*``) and what it computes of a step's
    tokens: the indexer's rotated queries ``[T, Hi, I]``, its rotated keys ``[T, I]`` and each head's weight
    ``[T, Hi]`` (fp32, over sqrt(Hi))."""

    def __init__(self, hidden_size: int, q_lora_rank: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.wq_b = torch.nn.Linear(q_lora_rank, heads * head_dim, bias=False)
        self.wk = torch.nn.Linear(hidden_size, head_dim, bias=False)
        self.k_norm = torch.nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = torch.nn.Linear(hidden_size, heads, bias=False)

    def forward(self, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from services.engine.rope import RotaryEmbedding

        t = x.shape[0]
        qk = torch.cat([self.wq_b(q_resid).view(t, self.heads, self.head_dim), self.k_norm(self.wk(x))[:, None]], dim=1)
        qk = RotaryEmbedding.apply(qk, cos, sin)  # the first qk_rope_head_dim features of each: cos is that wide
        weights = F.linear(x.to(self.weights_proj.weight.dtype), self.weights_proj.weight).float() * self.heads ** -0.5
        return qk[:, : self.heads], qk[:, self.heads], weights
