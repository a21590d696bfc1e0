"""Turns a step plan into model inputs: pure CPU bookkeeping, unit-tested without a model.

Each sequence the worker knows is a ``SequenceState``. ``prepare_inputs`` lays the scheduled tokens out flat,
in the order attention groups them::

    [ decodes, short contexts → long | fresh chunks, grouped by length | chunks after a cached prefix ]

and computes positions, KV slots, block tables, masks and the flat indices of the tokens whose logits are
sampled (a sequence samples when this step reaches the end of the tokens it knows).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import groupby
from typing import TYPE_CHECKING

import numpy as np
import torch

from services.common.errors import SeawallError
from services.common.sampling_params import SamplingParams
from services.engine.attention import (
    AttentionBatch,
    ChunkRows,
    DecodeGroup,
    DecodeRows,
    FreshChunks,
    PrefixChunk,
    SampledRows,
)
from services.engine.lora import LoraBatch, lora_batch
from services.engine.recurrent_state import RecurrentBatch, RecurrentStates, SpanGroup

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels
    from services.engine.grammar import SequenceGrammar
    from services.engine.lora import LoraWeights
    from services.engine.ngram import NgramIndex

# A decode bucket closes when the next context needs this many times the bucket's first block count:
# padding wastes at most ~1/3 of a bucket's attention work, and few buckets keep SDPA calls few.
_BUCKET_RATIO = 1.5
_MAX_DECODE_BUCKETS = 4


@dataclass
class SequenceState:
    """A worker's view of one sequence."""

    seq_id: str
    token_ids: list[int]
    prompt_len: int
    num_computed: int
    block_ids: list[int]
    params: SamplingParams
    # Structured output: the grammar's matcher, made on the first token this worker samples for it.
    grammar: SequenceGrammar | None = None
    # bad_words as token sequences (services/engine/bad_words.py), encoded when the worker first sees it.
    bad_words: tuple[tuple[int, ...], ...] = ()
    # Set when the sequence failed alone (StepResult.errors): it is kept, never run again, until finished.
    error: SeawallError | None = None
    # Speculative decoding: the draft tokens at the end of token_ids in the step being run (runner.py), and
    # the n-gram index they are drafted from (made on the first draft).
    num_drafts: int = 0
    ngrams: NgramIndex | None = None
    # The LoRA adapter its tokens run with (lora.py), or None for the base model; an activated LoRA's from
    # position ``lora_from`` on (services/common/lora.py, ``activation_start``).
    lora: LoraWeights | None = None
    lora_from: int = 0
    # Its row of the worker's recurrent states (a model with linear-attention layers), else None.
    state_slot: int | None = None
    # In the step being run, a copy of that state to save for prefix caching: (after how many of the step's
    # tokens, the checkpoint's row), else None.
    state_save: tuple[int, int] | None = None


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionBatch
    # Flat index of each sampled sequence's last token, then of each prompt token that scores the next one.
    logits_index: torch.Tensor
    sample_seq_ids: list[str]  # the first len(sample_seq_ids) rows of logits_index, in order
    # After them, per sequence scoring its prompt (SamplingParams.prompt_logprobs): (seq_id, position of the
    # first prompt token scored, how many), rows in that order.
    scored: list[tuple[str, int, int]] = field(default_factory=list)
    # After those, per sequence verifying drafts (SequenceState.num_drafts): (seq_id, drafts), a row for the
    # newest known token and each draft but the last (whose row is the sampled one), in that order.
    verified: list[tuple[str, int]] = field(default_factory=list)
    # The adapters of the pass's sequences and their rows; None when every token runs the base model.
    lora: LoraBatch | None = None


def prepare_inputs(
    scheduled: list[tuple[SequenceState, int]], block_size: int, device: torch.device,
    kernels: CpuKernels | None = None, window: int | None = None, softcap: float | None = None,
    chunk: int | None = None, states: RecurrentStates | None = None, float8_kernels: CpuKernels | None = None,
    sampled_rows: bool = False,
) -> StepInputs:
    """``scheduled``: (sequence, number of tokens to run); with ``kernels``, attention runs the fused CPU
    kernels: the decodes form one ``DecodeRows``, the prompt chunks one ``ChunkRows``. ``window``: the
    model's sliding window (its sliding layers' masks are built too); ``softcap``: its attention soft-cap
    (Gemma 2); ``chunk``: its attention chunk (Llama 4; its chunked layers' masks are built, as the window's);
    ``states``: its linear layers' recurrent states, which each sequence's ``state_slot`` indexes;
    ``float8_kernels``: the kernels that read a float8 pool for the torch ops (``AttentionBatch.float8_kernels``);
    ``sampled_rows``: also the batch of the rows logits are taken from (``AttentionBatch.sampled``), where they
    are fewer than all. Raises ``ValueError`` on an inconsistent plan."""
    for seq, n in scheduled:
        _check(seq, n, block_size)
    groups = _groups(scheduled, kernels is not None)
    inputs = _prepare(groups, block_size, device, kernels, window, softcap, chunk, states, float8_kernels)
    if sampled_rows:
        inputs.attention.sampled = _sampled(inputs, groups, block_size, device, kernels, window, softcap, chunk,
                                            float8_kernels)
    return inputs


_Groups = tuple[list[SequenceState], list[tuple[SequenceState, int]], list[tuple[SequenceState, int]]]


def _groups(scheduled: list[tuple[SequenceState, int]], any_order: bool) -> _Groups:
    """The flat batch's three parts, each in its order: decodes, fresh chunks, chunks after a prefix."""
    decodes = _decode_order([s for s, n in scheduled if n == 1], any_order)
    fresh = sorted(((s, n) for s, n in scheduled if n > 1 and s.num_computed == 0), key=lambda sn: sn[1])
    prefixed = [(s, n) for s, n in scheduled if n > 1 and s.num_computed > 0]
    return decodes, fresh, prefixed


def _ordered(groups: _Groups) -> list[tuple[SequenceState, int]]:
    return [(s, 1) for s in groups[0]] + groups[1] + groups[2]


def _prepare(groups: _Groups, block_size: int, device: torch.device, kernels: CpuKernels | None,
             window: int | None, softcap: float | None, chunk: int | None, states: RecurrentStates | None,
             float8_kernels: CpuKernels | None) -> StepInputs:
    decodes, fresh, prefixed = groups
    ordered = _ordered(groups)
    ids: list[int] = []
    positions: list[int] = []
    logits_index: list[int] = []
    sample_ids: list[str] = []
    score_rows: list[int] = []
    scored: list[tuple[str, int, int]] = []
    verify_rows: list[int] = []
    verified: list[tuple[str, int]] = []
    for seq, n in ordered:
        start = seq.num_computed
        base = len(ids)
        ids.extend(seq.token_ids[start : start + n])
        positions.extend(range(start, start + n))
        if start + n == len(seq.token_ids):
            logits_index.append(len(ids) - 1)
            sample_ids.append(seq.seq_id)
        if seq.params.prompt_logprobs is not None:
            # Position p's logits score the token at p + 1, while that is still a prompt token.
            count = min(start + n, seq.prompt_len - 1) - start
            if count > 0:
                score_rows.extend(range(base, base + count))
                scored.append((seq.seq_id, start + 1, count))
        if seq.num_drafts:
            verify_rows.extend(range(base, base + seq.num_drafts))
            verified.append((seq.seq_id, seq.num_drafts))
    logits_index += score_rows + verify_rows
    slot_blocks = [seq.block_ids[p // block_size] for seq, n in ordered
                   for p in range(seq.num_computed, seq.num_computed + n)]
    # One tensor for the four per-token rows (each conversion from Python lists has a fixed cost).
    flat = _t2d([ids, positions, slot_blocks, [p % block_size for p in positions]], device)
    input_ids, positions_t = flat[0], flat[1]
    attention = AttentionBatch(flat[2], flat[3], kernels=kernels, window=window, softcap=softcap, chunk=chunk,
                               float8_kernels=float8_kernels, positions=positions_t)
    lora = lora_batch([(seq.lora, n, seq.lora_from - seq.num_computed) for seq, n in ordered], device)
    if states is not None:
        attention.recurrent = _recurrent_batch(states, decodes, fresh + prefixed, device)
    span = _Span(window, chunk)
    if kernels is None:
        offset = 0
        for bucket in _decode_buckets(decodes, block_size):
            attention.decodes.append(_decode_group(bucket, offset, block_size, device, span))
            offset += len(bucket)
    elif decodes:
        attention.decode_rows = _decode_rows(decodes, positions_t[: len(decodes)], block_size, device)
    offset = len(decodes)
    if kernels is not None:
        if fresh or prefixed:
            attention.chunk_rows = _chunk_rows(fresh + prefixed, offset, block_size, device)
        return StepInputs(input_ids, positions_t, attention, _t(logits_index, device), sample_ids, scored, verified,
                      lora)
    _chunk_groups(attention, fresh, prefixed, offset, block_size, device, span)
    return StepInputs(input_ids, positions_t, attention, _t(logits_index, device), sample_ids, scored, verified,
                      lora)


def _sampled(inputs: StepInputs, groups: _Groups, block_size: int, device: torch.device,
             kernels: CpuKernels | None, window: int | None, softcap: float | None, chunk: int | None,
             float8_kernels: CpuKernels | None) -> SampledRows | None:
    """``inputs``' sampled rows as a batch of their own (``SampledRows``), or None where that is every row. Each
    sequence keeps the suffix of its rows from its first row in ``logits_index``: run as the same sequence
    with the rows before that counted as computed, whose KV the batch's earlier layers have written."""
    wanted = set(inputs.logits_index.tolist())
    if len(wanted) == len(inputs.input_ids):  # every row (decodes only)
        return None
    narrowed: list[tuple[SequenceState, int]] = []
    ends: dict[str, int] = {}  # each kept sequence's end row in the whole batch
    end = 0
    for seq, n in _ordered(groups):
        end += n
        first = next((row for row in range(end - n, end) if row in wanted), end)
        if first < end:
            narrowed.append((replace(seq, num_computed=seq.num_computed + first - (end - n)), end - first))
            ends[seq.seq_id] = end
    if not narrowed:
        return SampledRows(inputs.logits_index, inputs.logits_index, None)
    groups = _groups(narrowed, kernels is not None)
    batch = _prepare(groups, block_size, device, kernels, window, softcap, chunk, None, float8_kernels).attention
    rows = [row for seq, m in _ordered(groups) for row in range(ends[seq.seq_id] - m, ends[seq.seq_id])]
    at = {row: i for i, row in enumerate(rows)}
    return SampledRows(_t(rows, device), _t([at[row] for row in inputs.logits_index.tolist()], device), batch)


def _chunk_groups(attention: AttentionBatch, fresh: list[tuple[SequenceState, int]],
                  prefixed: list[tuple[SequenceState, int]], offset: int, block_size: int, device,
                  span: _Span) -> None:
    """The prompt chunks' groups for the torch path: fresh ones by length, then each one after a prefix."""
    for length, group in groupby(fresh, key=lambda sn: sn[1]):
        count = len(list(group))
        attention.fresh.append(FreshChunks(offset, count, length, _causal_window(length, length, span, device)))
        offset += count * length
    for seq, n in prefixed:
        attention.prefixed.append(_prefix_chunk(seq, n, offset, block_size, device, span))
        offset += n


def _recurrent_batch(states: RecurrentStates, decodes: list[SequenceState], chunks: list[tuple[SequenceState, int]],
                     device) -> RecurrentBatch:
    """The state slots of the flat batch's one-token rows (its first: decodes, and prompt chunks of one token, each
    run of either a group, ``SpanGroup.prefill`` telling them apart), then of each run of prompt chunks of one
    length, as groups a layer runs at once. A sequence whose state is saved on the way (``state_save``) runs as
    a group of its own, split where the state is saved: that group's states are copied to the checkpoint."""
    groups: list[SpanGroup] = []
    start = 0

    def add(length: int, seqs: list[SequenceState], prefill: bool, save_to: int | None = None) -> None:
        nonlocal start
        groups.append(SpanGroup(start, len(seqs), length, _t([seq.state_slot for seq in seqs], device),
                                None if save_to is None else _t([save_to], device), prefill))
        start += length * len(seqs)

    # The flat batch's one-token rows: decodes, and prompt chunks of one token (run in the prefill form).
    runs = [(1, list(run), prefill) for prefill, run in groupby(
        ((seq, 1) for seq in decodes), key=lambda sn: sn[0].num_computed < sn[0].prompt_len)]
    runs += [(n, list(run), True) for n, run in groupby(chunks, key=lambda sn: sn[1])]
    for n, run, prefill in runs:
        plain: list[SequenceState] = []
        for seq, _ in run:
            if seq.state_save is None or seq.state_save[0] > n:  # none, or in a later pass (a multi-step decode)
                plain.append(seq)
                continue
            if plain:  # the group so far, before this one in the flat batch
                add(n, plain, prefill)
                plain = []
            at, row = seq.state_save
            add(at, [seq], prefill, row)
            if at < n:
                add(n - at, [seq], prefill)
        if plain:
            add(n, plain, prefill)
    return RecurrentBatch(states, groups)


def _decode_order(decodes: list[SequenceState], any_order: bool) -> list[SequenceState]:
    """Decodes by context length (attention's buckets group similar lengths); where attention takes them in
    ``any_order`` (the fused kernels), grouped by LoRA adapter first, so that each adapter's decodes are one
    run of rows, which its projections read and write as views (lora.py), without a gather and a scatter."""
    decodes.sort(key=lambda s: s.num_computed)
    if any_order and any(s.lora is not None for s in decodes):
        decodes.sort(key=lambda s: 0 if s.lora is None else id(s.lora))  # stable: by context within an adapter
    return decodes


def _check(seq: SequenceState, n: int, block_size: int) -> None:
    end = seq.num_computed + n
    if end > len(seq.token_ids):
        raise ValueError(f"sequence {seq.seq_id}: {n} tokens scheduled from {seq.num_computed}, only "
                         f"{len(seq.token_ids)} known")
    if -(-end // block_size) > len(seq.block_ids):
        raise ValueError(f"sequence {seq.seq_id}: {end} tokens need {-(-end // block_size)} blocks, "
                         f"has {len(seq.block_ids)}")


def _decode_buckets(decodes: list[SequenceState], block_size: int) -> list[list[SequenceState]]:
    """Splits decodes sorted by context into buckets of similar block counts."""
    buckets: list[list[SequenceState]] = []
    for seq in decodes:
        blocks = seq.num_computed // block_size + 1
        if buckets and (len(buckets) == _MAX_DECODE_BUCKETS
                        or blocks <= _BUCKET_RATIO * (buckets[-1][0].num_computed // block_size + 1)):
            buckets[-1].append(seq)
        else:
            buckets.append([seq])
    return buckets


def _decode_group(seqs: list[SequenceState], token_start: int, block_size: int, device, span: _Span) -> DecodeGroup:
    context_lens = [s.num_computed + 1 for s in seqs]
    max_blocks = -(-max(context_lens) // block_size)
    tables = [(s.block_ids + [0] * max_blocks)[:max_blocks] for s in seqs]
    keys = torch.arange(max(context_lens), device=device)[None, :]
    ends = _t(context_lens, device)[:, None]
    mask = keys < ends
    cut = span.cuts(max(context_lens))
    window_mask = (mask & (keys >= span.first_key(ends - 1)))[:, None, None, :] if cut else None
    return DecodeGroup(token_start, len(seqs), _t2d(tables, device), mask[:, None, None, :], window_mask)


def _decode_rows(seqs: list[SequenceState], positions: torch.Tensor, block_size: int, device) -> DecodeRows:
    max_blocks = max(s.num_computed // block_size + 1 for s in seqs)
    tables = [(s.block_ids + [0] * max_blocks)[:max_blocks] for s in seqs]
    return DecodeRows(0, len(seqs), _t2d(tables, device), positions + 1)


def _chunk_rows(chunks: list[tuple[SequenceState, int]], offset: int, block_size: int, device) -> ChunkRows:
    starts, lens, prefix, tables = [], [], [], []
    max_blocks = max(-(-(s.num_computed + n) // block_size) for s, n in chunks)
    for seq, n in chunks:
        starts.append(offset)
        lens.append(n)
        prefix.append(seq.num_computed)
        tables.append((seq.block_ids + [0] * max_blocks)[:max_blocks])
        offset += n
    return ChunkRows(_t(starts, device), _t(lens, device), _t(prefix, device), _t2d(tables, device))


def _prefix_chunk(seq: SequenceState, n: int, token_start: int, block_size: int, device, span: _Span) -> PrefixChunk:
    start = seq.num_computed
    context = start + n
    table = _t(seq.block_ids[: -(-context // block_size)], device)
    q = torch.arange(n, device=device)[:, None]
    k = torch.arange(context, device=device)[None, :]
    return PrefixChunk(token_start, n, context, table, k <= start + q, _causal_window(n, context, span, device))


def _causal_window(queries: int, keys: int, span: _Span, device) -> torch.Tensor | None:
    """``[queries, keys]``: the last ``queries`` of ``keys`` positions, each seeing itself and the keys before
    it inside its window or chunk; None without either or where it cuts nothing off (causal attention is the
    same)."""
    if not span.cuts(keys):
        return None
    q = torch.arange(keys - queries, keys, device=device)[:, None]
    k = torch.arange(keys, device=device)[None, :]
    return (k <= q) & (k >= span.first_key(q))


@dataclass(frozen=True)
class _Span:
    """What a query in a sliding or chunked layer sees: the last ``window`` keys up to itself (sliding-window
    attention), or those of its own chunk of ``chunk`` positions (Llama 4's chunked attention)."""

    window: int | None
    chunk: int | None

    def first_key(self, position: torch.Tensor) -> torch.Tensor:
        """The first key a query at ``position`` sees."""
        if self.window is not None:
            return position - self.window + 1
        assert self.chunk is not None
        return position - position % self.chunk

    def cuts(self, keys: int) -> bool:
        """Whether a sequence of ``keys`` positions has a query that does not see every key before it."""
        limit = self.window if self.window is not None else self.chunk
        return limit is not None and keys > limit


def _t(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _t2d(rows: list[list[int]], device) -> torch.Tensor:
    """A ``[len(rows), len(rows[0])]`` int64 tensor of equal-length rows. Through numpy: for nested lists it is
    2.5-3x faster than ``torch.tensor`` (64 x 12 block ids: 19 vs 47 us); for flat lists of a few dozen it
    is not, so ``_t`` keeps those."""
    t = torch.from_numpy(np.array(rows, dtype=np.int64))
    return t if device.type == "cpu" else t.to(device)
