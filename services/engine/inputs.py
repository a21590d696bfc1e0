"""Turns a step plan into model inputs: pure CPU bookkeeping, unit-tested without a model.

Each sequence the worker knows is a ``SequenceState``. ``prepare_inputs`` lays the scheduled tokens out flat —
decodes (one token) first, then prompt chunks — and computes positions, KV slots, block tables, masks and the
indices of the tokens whose logits are sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.common.sampling_params import SamplingParams
from services.engine.attention import AttentionBatch, ChunkAttention


@dataclass
class SequenceState:
    """A worker's view of one sequence."""

    seq_id: str
    token_ids: list[int]
    prompt_len: int
    num_computed: int
    block_ids: list[int]
    params: SamplingParams


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionBatch
    logits_index: torch.Tensor  # flat index of each sampled sequence's last token
    sample_seq_ids: list[str]  # in the order of logits_index


def prepare_inputs(
    scheduled: list[tuple[SequenceState, int]], block_size: int, device: torch.device
) -> StepInputs:
    """``scheduled``: (sequence, number of tokens to run). Raises ``ValueError`` on an inconsistent plan."""
    decodes = [(s, n) for s, n in scheduled if n == 1]
    chunks = [(s, n) for s, n in scheduled if n > 1]
    ids: list[int] = []
    positions: list[int] = []
    slot_blocks: list[int] = []
    slot_offsets: list[int] = []
    logits_index: list[int] = []
    sample_ids: list[str] = []
    for seq, n in decodes + chunks:
        start = seq.num_computed
        end = start + n
        if end > len(seq.token_ids):
            raise ValueError(f"sequence {seq.seq_id}: {n} tokens scheduled from {start}, only "
                             f"{len(seq.token_ids)} known")
        if -(-end // block_size) > len(seq.block_ids):
            raise ValueError(f"sequence {seq.seq_id}: {end} tokens need {-(-end // block_size)} blocks, "
                             f"has {len(seq.block_ids)}")
        flat_start = len(ids)
        ids.extend(seq.token_ids[start:end])
        pos = range(start, end)
        positions.extend(pos)
        slot_blocks.extend(seq.block_ids[p // block_size] for p in pos)
        slot_offsets.extend(p % block_size for p in pos)
        if end == len(seq.token_ids):
            logits_index.append(flat_start + n - 1)
            sample_ids.append(seq.seq_id)
    attention = AttentionBatch(
        slot_blocks=_t(slot_blocks, device),
        slot_offsets=_t(slot_offsets, device),
        decode_token_index=torch.arange(len(decodes), device=device),
        decode_block_tables=_t([], device).view(0, 0),
        decode_mask=torch.empty(0, dtype=torch.bool, device=device),
        chunks=[],
    )
    if decodes:
        _decode_metadata(attention, [s for s, _ in decodes], block_size, device)
    offset = len(decodes)
    for seq, n in chunks:
        attention.chunks.append(_chunk_metadata(seq, n, offset, block_size, device))
        offset += n
    return StepInputs(_t(ids, device), _t(positions, device), attention, _t(logits_index, device), sample_ids)


def _decode_metadata(attention: AttentionBatch, seqs: list[SequenceState], block_size: int, device) -> None:
    context_lens = [s.num_computed + 1 for s in seqs]
    max_blocks = max(-(-c // block_size) for c in context_lens)
    tables = [s.block_ids[:max_blocks] + [0] * (max_blocks - min(max_blocks, len(s.block_ids))) for s in seqs]
    attention.decode_block_tables = _t(tables, device)
    keys = torch.arange(max_blocks * block_size, device=device)
    attention.decode_mask = (keys[None, :] < _t(context_lens, device)[:, None])[:, None, None, :]


def _chunk_metadata(seq: SequenceState, n: int, token_start: int, block_size: int, device) -> ChunkAttention:
    start = seq.num_computed
    context = start + n
    table = _t(seq.block_ids[: -(-context // block_size)], device)
    mask = None
    if start:
        q = torch.arange(n, device=device)[:, None]
        k = torch.arange(context, device=device)[None, :]
        mask = k <= start + q
    return ChunkAttention(token_start, n, context, table, mask)


def _t(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
