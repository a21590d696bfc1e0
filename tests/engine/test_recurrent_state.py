"""The pool of recurrent states (services/engine/recurrent_state.py): slots handed out zeroed, kept apart, and
kept through the pool's growth."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument
from services.engine.linear_attention_config import LinearAttentionShape
from services.engine.recurrent_state import RecurrentBatch, RecurrentStates, SpanGroup

SHAPE = LinearAttentionShape(num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=6, conv_kernel=4,
                             grouped_projections=True)


def _pool(capacity: int = 2) -> RecurrentStates:
    return RecurrentStates(SHAPE, num_layers=3, dtype=torch.bfloat16, device=torch.device("cpu"), capacity=capacity)


def test_shapes_and_dtypes_follow_the_layers():
    pool = _pool()
    assert [tuple(t.shape) for t in pool.conv] == [(2, 2 * 16 + 24, 3)] * 3
    assert [tuple(t.shape) for t in pool.ssm] == [(2, 4, 8, 6)] * 3
    assert {t.dtype for t in pool.conv} == {torch.bfloat16} and {t.dtype for t in pool.ssm} == {torch.float32}
    assert pool.nbytes_per_slot() == 3 * (56 * 3 * 2 + 4 * 8 * 6 * 4)


def test_a_reused_slot_starts_from_zeros():
    pool = _pool()
    slot = pool.claim("a", 0)
    pool.ssm[1][slot].fill_(3.0)
    pool.conv[0][slot].fill_(2.0)
    pool.release("a", slot)
    again = pool.claim("b", 0)
    assert again == slot
    assert not pool.ssm[1][again].any() and not pool.conv[0][again].any()


def test_a_handed_off_state_is_claimed_by_the_sequence_it_was_read_for():
    src, dst = _pool(), _pool()
    slot = src.claim("s", 0)
    for i, (conv, ssm) in enumerate(zip(src.conv, src.ssm, strict=True)):
        conv[slot].normal_()
        ssm[slot].fill_(i + 0.5)
    dst.stash("s", 37, src.read(slot))
    with pytest.raises(InvalidArgument, match="arrived with 36 tokens computed elsewhere and a recurrent state of 37"):
        dst.claim("s", 36)  # its stash is spent by the failed claim: a retry would recompute it
    dst.stash("s", 37, src.read(slot))
    got = dst.claim("s", 37)
    assert all(torch.equal(a[slot], b[got]) for a, b in zip(src.conv + src.ssm, dst.conv + dst.ssm, strict=True))
    with pytest.raises(InvalidArgument, match="no recurrent state"):
        dst.claim("t", 5)
    with pytest.raises(InvalidArgument, match="2 layers of recurrent state for a model with 3"):
        dst.stash("u", 5, src.read(slot)[:2])
    short = src.read(slot)
    short[1] = (short[1][0], short[1][1][:-4])
    with pytest.raises(InvalidArgument, match=r"layer 1 of the recurrent state of w has \(\d+, \d+\) \(conv, ssm\) bytes"):
        dst.stash("w", 5, short)  # refused on arrival: the plan adding the sequence would fail on it
    dst.stash("v", 5, dst.blank())
    dst.release("v", None)  # gone before it arrived: its stash too
    with pytest.raises(InvalidArgument, match="no recurrent state"):
        dst.claim("v", 5)


def test_growth_keeps_every_held_state():
    pool = _pool(capacity=2)
    held = [pool.acquire() for _ in range(2)]
    for i, slot in enumerate(held):
        pool.ssm[2][slot].fill_(i + 1.0)
    more = [pool.acquire() for _ in range(3)]  # past the capacity: doubled, then doubled again
    assert pool.capacity == 8 and len(set(held + more)) == 5 and pool.num_free == 3
    assert [pool.ssm[2][slot].unique().tolist() for slot in held] == [[1.0], [2.0]]
    assert all(not pool.ssm[2][slot].any() for slot in more)


def test_a_checkpoint_saved_after_a_group_is_what_a_later_sequence_starts_from():
    """A group's new states go to its slots and, for prefix caching, to a checkpoint's row too; a sequence a plan
    adds after a cached prefix starts from a copy of that row, which later steps leave alone."""
    pool = _pool()
    slot = pool.claim("a", 0)
    row = pool.checkpoint_row(3)
    assert pool.checkpoint_row(3) == row and pool.num_checkpoints == 1 and row != slot
    group = SpanGroup(0, 1, 5, torch.tensor([slot]), save_to=torch.tensor([row]))
    RecurrentBatch.keep(pool.ssm[0], group, torch.full((1, *SHAPE.state_shape), 7.0))
    RecurrentBatch.keep(pool.conv[2], group, torch.full((1, 56, 3), 2.0, dtype=torch.bfloat16))
    b = pool.claim("b", 32, checkpoint=3)
    assert b not in (slot, row) and bool((pool.ssm[0][b] == 7.0).all()) and bool((pool.conv[2][b] == 2.0).all())
    pool.ssm[0][b].zero_()
    assert bool((pool.ssm[0][row] == 7.0).all())
    with pytest.raises(InvalidArgument, match="state checkpoint 5, which this worker never saved"):
        pool.claim("c", 16, checkpoint=5)


def test_a_checkpoint_moved_to_host_memory_is_claimed_and_read_from_there():
    """The scheduler moves a device checkpoint to a host slot (numbered after the device's) and gives its row to a
    newer save: sequences resume from the host copy, a peer reads it, and the row's new state is apart."""
    pool = _pool()
    row = pool.checkpoint_row(1)
    pool.ssm[2][row].fill_(4.0)
    pool.conv[1][row].fill_(6.0)
    before = pool.read(row)
    pool.move_checkpoint(1, 20)
    pool.ssm[2][row].fill_(8.0)  # the next save into the device slot
    assert pool.num_host_checkpoints == 1 and pool.read_checkpoint(20) == before != pool.read_checkpoint(1)
    a = pool.claim("a", 48, checkpoint=20)
    assert bool((pool.ssm[2][a] == 4.0).all()) and bool((pool.conv[1][a] == 6.0).all())
    pool.ssm[2][a].zero_()  # a running sequence's steps leave the host copy alone
    assert pool.read_checkpoint(20) == before
    pool.move_checkpoint(1, 20)  # a later move over it
    b = pool.claim("b", 48, checkpoint=20)  # grows the pool: its tensors are new ones
    assert bool((pool.ssm[2][b] == 8.0).all())
    with pytest.raises(InvalidArgument, match="state checkpoint 7 was never saved on this worker: it cannot move"):
        pool.move_checkpoint(7, 21)


def test_a_swapped_out_state_waits_in_host_memory_and_comes_back_whole():
    pool = _pool()
    slot = pool.claim("a", 0)
    pool.ssm[1][slot].fill_(5.0)
    pool.conv[0][slot].fill_(3.0)
    pool.swap_out("a", slot)
    assert pool.on_host("a") and pool.num_on_host == 1 and pool.num_free == pool.capacity
    other = pool.claim("b", 0)  # the freed slot goes to another sequence meanwhile
    pool.ssm[1][other].fill_(9.0)
    back = pool.swap_in("a")
    assert back != other and not pool.on_host("a")
    assert bool((pool.ssm[1][back] == 5.0).all()) and bool((pool.conv[0][back] == 3.0).all())
    pool.swap_out("a", back)
    pool.release("a", None)  # finished while swapped out: its host copy goes too
    assert pool.num_on_host == 0
