"""Paged attention over a mixed batch of decodes and prompt chunks (gather + SDPA).

The step's tokens are flattened: ``[T, heads, head_dim]``. Every token's K/V is first written into its slot
(block id, offset). Then:

* decodes (one query token each) are batched: their block tables are padded to the longest context,
  gathered in one indexing op, and masked by context length;
* each prompt chunk attends to its cached prefix and causally within itself::

      keys:    [ 0 ............ start | start ......... start+q )
      query i: sees keys j <= start + i

Gather + SDPA won over a per-sequence loop for decodes on the CPU (bench/attention_impl.py); the layout
keeps a block's K (or V) of one layer contiguous, so the gather copies whole ``block_size`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class ChunkAttention:
    """One prompt chunk: its tokens are ``[token_start, token_start + num_tokens)`` of the flat batch."""

    token_start: int
    num_tokens: int
    context_len: int  # cached prefix + this chunk
    block_table: torch.Tensor  # [ceil(context_len / block_size)] block ids
    mask: torch.Tensor | None  # [num_tokens, context_len] bool, None when there is no prefix (pure causal)


@dataclass
class AttentionBatch:
    """Where each token's K/V goes and what each query attends to. Built by ``inputs.prepare_inputs``."""

    slot_blocks: torch.Tensor  # [T] block id of each token's slot
    slot_offsets: torch.Tensor  # [T] offset inside the block
    decode_token_index: torch.Tensor  # [D] positions of decode tokens in the flat batch
    decode_block_tables: torch.Tensor  # [D, max_blocks] padded with block 0 (masked out)
    decode_mask: torch.Tensor  # [D, 1, 1, max_blocks * block_size] bool: key is inside the context
    chunks: list[ChunkAttention]

    @property
    def num_decodes(self) -> int:
        return int(self.decode_token_index.shape[0])


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
) -> torch.Tensor:
    """q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``; caches ``[num_blocks, block_size, Hkv, D]``. Returns ``[T, Hq, D]``."""
    k_cache[batch.slot_blocks, batch.slot_offsets] = k
    v_cache[batch.slot_blocks, batch.slot_offsets] = v
    out = torch.empty_like(q)
    if batch.num_decodes:
        idx = batch.decode_token_index
        keys = _gather(k_cache, batch.decode_block_tables)
        values = _gather(v_cache, batch.decode_block_tables)
        o = F.scaled_dot_product_attention(
            q[idx].unsqueeze(2), keys, values, attn_mask=batch.decode_mask, enable_gqa=True
        )
        out[idx] = o.squeeze(2)
    for chunk in batch.chunks:
        span = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
        keys = _gather(k_cache, chunk.block_table[None])[:, :, : chunk.context_len]
        values = _gather(v_cache, chunk.block_table[None])[:, :, : chunk.context_len]
        query = q[span].transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=chunk.mask, is_causal=chunk.mask is None, enable_gqa=True
        )
        out[span] = o.squeeze(0).transpose(0, 1)
    return out


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """``[B, n]`` block ids → ``[B, Hkv, n * block_size, D]`` keys or values."""
    b, n = block_tables.shape
    blocks = cache[block_tables]  # [B, n, block_size, Hkv, D]
    return blocks.reshape(b, n * cache.shape[1], cache.shape[2], cache.shape[3]).transpose(1, 2)
