"""``prepare_inputs``: the flat token layout and the attention groups, for both attention paths."""

from __future__ import annotations

import pytest
import torch

from services.common.sampling_params import SamplingParams
from services.engine import cpu_kernels
from services.engine.inputs import SequenceState, prepare_inputs

CPU = torch.device("cpu")
BLOCK = 4


def _seq(name: str, known: int, computed: int, first_block: int, prompt_len: int | None = None) -> SequenceState:
    blocks = list(range(first_block, first_block + -(-known // BLOCK)))
    return SequenceState(name, list(range(100, 100 + known)), min(known, 5) if prompt_len is None else prompt_len,
                         computed, blocks, SamplingParams())


def _step():
    """Three decodes (contexts 3, 9 and 30), two fresh 6-token prompts and a 4-token chunk after 8 cached."""
    d_long, d_short, d_mid = _seq("dl", 30, 29, 0), _seq("ds", 3, 2, 10, prompt_len=2), _seq("dm", 9, 8, 20)
    f1, f2 = _seq("f1", 6, 0, 30), _seq("f2", 6, 0, 40)
    chunk = _seq("c", 20, 8, 50)
    return [(d_long, 1), (f1, 6), (d_short, 1), (chunk, 4), (d_mid, 1), (f2, 6)]


def _common_layout(inputs):
    # Decodes by context, then fresh chunks, then chunks after a cached prefix.
    assert inputs.positions.tolist() == [2, 8, 29, *range(6), *range(6), 8, 9, 10, 11]
    assert inputs.input_ids.tolist()[:3] == [102, 108, 129]
    assert inputs.sample_seq_ids == ["ds", "dm", "dl", "f1", "f2"]  # the chunk has tokens left to prefill
    assert inputs.logits_index.tolist() == [0, 1, 2, 8, 14]
    batch = inputs.attention
    assert batch.slot_blocks.tolist()[:3] == [10, 22, 7] and batch.slot_offsets.tolist()[:3] == [2, 0, 1]


def test_torch_path_buckets_decodes_by_context():
    inputs = prepare_inputs(_step(), BLOCK, CPU)
    _common_layout(inputs)
    batch = inputs.attention
    assert batch.kernels is None and batch.decode_rows is None and batch.chunk_rows is None
    assert [(f.token_start, f.count, f.length) for f in batch.fresh] == [(3, 2, 6)]
    assert [(p.token_start, p.num_tokens, p.context_len) for p in batch.prefixed] == [(15, 4, 12)]
    spans = [(g.token_start, g.size) for g in batch.decodes]
    assert sum(n for _, n in spans) == 3 and spans[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:], strict=False))
    last = batch.decodes[-1]
    # Keys up to the longest context, not the whole last block: the long decode sees its 30 tokens, no padding.
    assert last.mask.shape[-1] == 30 < last.block_tables.shape[1] * BLOCK
    assert last.mask[-1].all()


def test_kernel_path_makes_one_row_per_decode():
    kernels = cpu_kernels.load()
    if kernels is None:
        pytest.skip("no C compiler: the fused kernels cannot be built here")
    inputs = prepare_inputs(_step(), BLOCK, CPU, kernels)
    _common_layout(inputs)
    batch = inputs.attention
    assert batch.kernels is kernels and batch.decodes == []
    rows = batch.decode_rows
    assert (rows.token_start, rows.size) == (0, 3)
    assert rows.context_lens.tolist() == [3, 9, 30]
    assert rows.block_tables.dtype == torch.long and rows.block_tables.is_contiguous()
    assert rows.block_tables.tolist() == [[10, 0, 0, 0, 0, 0, 0, 0], [20, 21, 22, 0, 0, 0, 0, 0],
                                          [0, 1, 2, 3, 4, 5, 6, 7]]
    # Every prompt chunk, fresh or after a prefix, in token order: no gather groups.
    assert batch.fresh == [] and batch.prefixed == []
    chunks = batch.chunk_rows
    assert chunks.token_starts.tolist() == [3, 9, 15]
    assert chunks.lens.tolist() == [6, 6, 4] and chunks.prefix.tolist() == [0, 0, 8]
    assert chunks.block_tables.tolist() == [[30, 31, 0], [40, 41, 0], [50, 51, 52]]


def test_no_decodes_no_rows():
    kernels = cpu_kernels.load()
    if kernels is None:
        pytest.skip("no C compiler: the fused kernels cannot be built here")
    inputs = prepare_inputs([(_seq("f", 6, 0, 0), 6)], BLOCK, CPU, kernels)
    assert inputs.attention.decode_rows is None and inputs.attention.chunk_rows.token_starts.tolist() == [0]
    inputs = prepare_inputs([(_seq("d", 6, 5, 0), 1)], BLOCK, CPU, kernels)
    assert inputs.attention.chunk_rows is None and inputs.attention.decode_rows.size == 1


@pytest.mark.parametrize("fused", [False, True], ids=["torch", "kernels"])
def test_sampled_rows_are_each_sequences_rows_from_its_first_one_logits_read(fused):
    """``sampled_rows``: the rows logits are taken from as a batch of their own (Gemma 4's KV-sharing layers run
    only those), each sequence's from its first such row to its end, over the context before it. A sequence
    scoring its prompt keeps all its rows; a chunk with tokens left, none."""
    kernels = cpu_kernels.load() if fused else None
    if fused and kernels is None:
        pytest.skip("no C compiler: the fused kernels cannot be built here")
    scoring = SequenceState("p", list(range(200, 212)), 12, 4, [60, 61, 62], SamplingParams(prompt_logprobs=1))
    inputs = prepare_inputs([*_step(), (scoring, 5)], BLOCK, CPU, kernels, sampled_rows=True)
    # ds, dm, dl decode; f1 and f2 sample their last rows; c has tokens left; p scores rows 19-23.
    assert inputs.logits_index.tolist() == [0, 1, 2, 8, 14, 19, 20, 21, 22, 23]
    sampled = inputs.attention.sampled
    # Their own layout: one-row sequences by context (ds, f1, f2, dm, dl), then p's chunk after its 4 tokens.
    assert sampled.rows.tolist() == [0, 8, 14, 1, 2, 19, 20, 21, 22, 23]
    assert sampled.rows[sampled.logits_index].tolist() == inputs.logits_index.tolist()
    batch, whole = sampled.batch, inputs.attention
    assert batch.slot_blocks.tolist() == whole.slot_blocks[sampled.rows].tolist()
    assert batch.slot_offsets.tolist() == whole.slot_offsets[sampled.rows].tolist()
    assert batch.sampled is None and batch.kernels is kernels
    if fused:
        assert batch.decode_rows.context_lens.tolist() == [3, 6, 6, 9, 30]
        assert batch.chunk_rows.prefix.tolist() == [4] and batch.chunk_rows.lens.tolist() == [5]
    else:
        assert sum(g.size for g in batch.decodes) == 5 and batch.fresh == []
        assert [(p.token_start, p.num_tokens, p.context_len) for p in batch.prefixed] == [(5, 5, 9)]
    # Every row sampled (decodes only): no batch of its own; none sampled (a chunk with tokens left): no rows.
    assert prepare_inputs([(_seq("d", 6, 5, 0), 1)], BLOCK, CPU, kernels, sampled_rows=True).attention.sampled is None
    none = prepare_inputs([(_seq("c", 20, 8, 0), 4)], BLOCK, CPU, kernels, sampled_rows=True).attention.sampled
    assert none.batch is None and none.rows.tolist() == none.logits_index.tolist() == []
    assert prepare_inputs(_step(), BLOCK, CPU, kernels).attention.sampled is None  # not asked for


def test_recurrent_states_are_grouped_as_the_flat_batch_lays_sequences_out():
    """A hybrid model's layers run the decodes as one group and each run of equal-length prompt chunks as
    another, with the state slots of their sequences in token order."""
    from services.engine.linear_attention_config import ShortConvShape
    from services.engine.recurrent_state import RecurrentStates

    states = RecurrentStates(ShortConvShape(8, 3, False), 1, torch.float32, CPU)
    step = _step()
    for i, (seq, _) in enumerate(step):
        seq.state_slot = 10 + i  # dl 10, f1 11, ds 12, c 13, dm 14, f2 15
    groups = prepare_inputs(step, BLOCK, CPU, states=states).attention.recurrent.groups
    assert [(g.start, g.count, g.length, g.slots.tolist()) for g in groups] == [
        (0, 3, 1, [12, 14, 10]),  # the decodes, by context as attention orders them
        (3, 2, 6, [11, 15]),  # the two fresh 6-token prompts, one batch
        (15, 1, 4, [13])]  # the chunk after its cached prefix
    # States saved for prefix caching on the way (a decode's, and a fresh prompt's after 4 of its 6 tokens): each
    # such sequence its own group, split where the copy goes to its checkpoint row.
    step[5][0].state_save, step[2][0].state_save = (4, 40), (1, 41)  # f2, ds
    groups = prepare_inputs(step, BLOCK, CPU, states=states).attention.recurrent.groups
    assert [(g.start, g.count, g.length, g.slots.tolist(), None if g.save_to is None else g.save_to.tolist())
            for g in groups] == [
        (0, 1, 1, [12], [41]), (1, 2, 1, [14, 10], None),  # ds saves; the other decodes after it
        (3, 1, 6, [11], None), (9, 1, 4, [15], [40]), (13, 1, 2, [15], None),  # f1; f2 in two spans
        (15, 1, 4, [13], None)]
    # A multi-step decode's save 3 tokens into its step falls in a later pass: this one runs it with the others.
    step[2][0].state_save = (3, 41)
    groups = prepare_inputs(step, BLOCK, CPU, states=states).attention.recurrent.groups
    assert [(g.count, g.slots.tolist(), g.save_to) for g in groups[:1]] == [(3, [12, 14, 10], None)]
    # A prompt chunk of one token is laid out with the decodes (attention reads it as one) but runs in the
    # prefill form: a group of its own, in its place among them.
    step[2][0].state_save, step[5][0].state_save, step[2][0].prompt_len = None, None, 3
    groups = prepare_inputs(step, BLOCK, CPU, states=states).attention.recurrent.groups
    assert [(g.start, g.count, g.slots.tolist(), g.prefill) for g in groups] == [
        (0, 1, [12], True), (1, 2, [14, 10], False), (3, 2, [11, 15], True), (15, 1, [13], True)]
