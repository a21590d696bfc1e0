"""Forking a decoding request: full blocks shared by reference, the partial last block copied (copy-on-write)."""

from __future__ import annotations

from services.common.sampling_params import SamplingParams
from services.scheduler.core.request import Request
from tests.scheduler.core.test_scheduler import create_requests, create_scheduler, step


def _child(rid="c"):
    return Request(rid, [], SamplingParams(max_tokens=5), 1.0, eos_token_ids=(0,))


def test_fork_shares_full_blocks_and_copies_the_partial_one_in_the_next_plan():
    s = create_scheduler(block_size=4)
    s.add(create_requests(1, prompt_len=10, max_tokens=6)[0])
    step(s)  # the prompt: 10 tokens computed, 3 blocks (the third holds 2 tokens)
    parent = s.requests["r0"]
    assert s.fork("r0", child := _child())
    assert child.block_ids[:2] == parent.block_ids[:2] and child.block_ids[2] != parent.block_ids[2]
    assert child.all_token_ids == parent.all_token_ids and child.num_computed_tokens == 10
    s.check_integrity()  # shared blocks are referenced twice
    plan, events = step(s, token=9)
    assert plan.copy == [(parent.block_ids[2], child.block_ids[2])]
    assert {e.request_id for e in events} == {"r0", "c"}
    assert [n.seq_id for n in plan.new] == ["c"] and plan.new[0].num_computed_tokens == 10
    while s.has_work:
        step(s)
    assert s.blocks.num_free == s.blocks.num_blocks


def test_a_fork_at_a_block_boundary_copies_nothing():
    s = create_scheduler(block_size=4)
    s.add(create_requests(1, prompt_len=8, max_tokens=6)[0])
    step(s)
    assert s.fork("r0", _child())
    plan, _ = step(s)
    assert plan.copy == []


def test_a_fork_without_a_free_block_for_the_copy_changes_nothing():
    s = create_scheduler(num_blocks=3, block_size=4)
    s.add(create_requests(1, prompt_len=10, max_tokens=2)[0])
    step(s)
    assert not s.fork("r0", _child())
    assert "c" not in s.requests
    s.check_integrity()
