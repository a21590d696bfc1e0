"""Sliding-window models in the core: blocks that fell out of the window are freed as requests advance, and
every path that moves a request's blocks (swap, hand-off, fork, the prefix cache) keeps the positions."""

from __future__ import annotations

import pytest

from services.common.sampling_params import SamplingParams
from services.scheduler.core.block_manager import BlockManager
from services.scheduler.core.request import Request
from services.scheduler.core.scheduler import Scheduler, SchedulerConfig
from tests.scheduler.core.test_scheduler import create_requests, step

BS, WINDOW = 4, 10  # a query at position p reads keys (p - 10, p]


def windowed(num_blocks=64, num_host_blocks=0, **overrides) -> Scheduler:
    host = BlockManager(num_host_blocks, BS) if num_host_blocks else None
    return Scheduler(SchedulerConfig(sliding_window=WINDOW, **overrides),
                     BlockManager(num_blocks, BS, reserve_null=True), host)


def expected_dropped(computed: int) -> int:
    """Blocks wholly before the window of a query at position ``computed`` (the next one to run)."""
    return max(0, computed - WINDOW + 1) // BS


def test_the_null_block_is_never_handed_out_and_freeing_it_does_nothing():
    blocks = BlockManager(5, BS, reserve_null=True)
    assert blocks.num_blocks == 4 and blocks.null_block == 0
    got = blocks.allocate(4)
    assert sorted(got) == [1, 2, 3, 4] and blocks.allocate(1) is None
    blocks.free([0, *got, 0])
    blocks.share([0])
    blocks.cache(0, 123)
    assert blocks.num_free == 4 and blocks.cached_prefix([123]) == []
    blocks.check_integrity({"r": [0, 0]})
    with pytest.raises(ValueError, match="num_blocks must be >= 2"):
        BlockManager(1, BS, reserve_null=True)


def test_a_window_needs_a_pool_with_the_null_block_and_a_key():
    with pytest.raises(ValueError, match="reserve_null"):
        Scheduler(SchedulerConfig(sliding_window=WINDOW), BlockManager(16, BS))
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        SchedulerConfig(sliding_window=0)


@pytest.mark.parametrize("chunk_size", [3, 8, None])
def test_blocks_before_the_window_are_freed_as_a_request_advances(chunk_size):
    s = windowed(chunk_size=chunk_size)
    s.add(req := create_requests(1, prompt_len=30, max_tokens=25)[0])
    peak = 0
    while s.has_work:
        computed = req.num_computed_tokens
        plan, _ = step(s)
        if req.block_ids:
            assert req.num_dropped_blocks == expected_dropped(computed)
            assert req.block_ids[: req.num_dropped_blocks] == [0] * req.num_dropped_blocks
            assert 0 not in req.live_block_ids
        peak = max(peak, s.blocks.num_blocks - s.blocks.num_free)
    # Held at once: the window before a step's first query, plus the step's tokens (a whole prompt when not
    # chunked), plus a partial block at each end.
    assert peak <= -(-(WINDOW - 1 + (chunk_size or 30)) // BS) + 1
    assert len(req.output_token_ids) == 25 and s.blocks.num_free == s.blocks.num_blocks


def test_a_swap_copies_the_blocks_still_read_and_the_worker_gets_the_null_block_for_the_rest():
    s = windowed(chunk_size=8, num_host_blocks=32, preemption_mode="swap")
    s.add(req := create_requests(1, prompt_len=30, max_tokens=20)[0])
    for _ in range(4):
        step(s)  # the fourth plan was made with 24 tokens computed
    dropped, live = req.num_dropped_blocks, list(req.live_block_ids)
    assert dropped == expected_dropped(24) and req.block_ids[:dropped] == [0] * dropped
    assert s.swap_out(req)
    host = list(req.host_block_ids)
    assert len(host) == len(live)  # only the blocks still read are copied
    plan = s.schedule()  # it swaps right back in: the pool has room
    assert plan.swap_out == list(zip(live, host, strict=True))
    assert req.block_ids[:dropped] == [0] * dropped and [h for h, _ in plan.swap_in] == host
    assert [dst for _, dst in plan.swap_in] == req.block_ids[dropped: dropped + len(host)]
    # A table the worker gets whole names the null block at the dropped positions.
    assert [c.block_ids for c in plan.continuing if c.seq_id == "r0"] == [req.block_ids]


def test_swapped_requests_resume_with_their_dropped_positions_and_finish():
    """A small pool, swapping by FastServe's policy: every request finishes with integrity checked each step."""
    s = windowed(num_blocks=14, num_host_blocks=64, chunk_size=8, policy="fastserve+sarathi")
    for r in create_requests(5, prompt_len=26, max_tokens=30):
        s.add(r)
    while s.has_work:
        step(s)
    assert s.preemptions["swap"] > 0
    assert s.blocks.num_free == s.blocks.num_blocks and s.host_blocks.num_free == s.host_blocks.num_blocks


def test_recomputed_requests_start_over_with_every_block():
    s = windowed(num_blocks=10, chunk_size=8, preemption_mode="recompute")
    reqs = create_requests(4, prompt_len=26, max_tokens=30)
    for r in reqs:
        s.add(r)
    while s.has_work:
        step(s)
        for r in reqs:  # a recomputed request forgot its dropped blocks with the rest
            assert r.num_dropped_blocks <= (expected_dropped(r.num_computed_tokens) if r.block_ids else 0)
    assert s.preemptions["recompute"] > 0 and all(len(r.output_token_ids) == 30 for r in reqs)
    assert s.blocks.num_free == s.blocks.num_blocks


def test_a_hand_off_sends_only_the_blocks_still_read():
    prefill, decode = windowed(chunk_size=8), windowed(chunk_size=8)
    prefill.add(req := create_requests(1, prompt_len=30, max_tokens=5)[0])
    while not req.output_token_ids:
        step(prefill)
    held = prefill.hand_off("r0")
    dropped = req.num_dropped_blocks
    assert dropped == expected_dropped(24) and held[:dropped] == [0] * dropped
    dst = decode.reserve_arrival(req)
    # The receiver's table has the null block where the sender dropped blocks; like cached blocks, they are
    # skipped by the transfer (block_ids[num_cached_blocks:]).
    assert dst[:dropped] == [0] * dropped and req.num_cached_blocks == dropped
    assert len(dst) == len(held) and decode.blocks.num_free == decode.blocks.num_blocks - (len(held) - dropped)
    decode.arrive("r0")
    while decode.has_work:
        step(decode)
        decode.check_integrity()
    prefill.release_handed_off("r0")
    prefill.check_integrity()
    assert decode.blocks.num_free == decode.blocks.num_blocks == prefill.blocks.num_free


def test_a_fork_shares_the_blocks_still_read():
    s = windowed()
    s.add(create_requests(1, prompt_len=30, max_tokens=8)[0])
    step(s)
    step(s)  # the drop happens when the next step is planned
    parent = s.requests["r0"]
    assert parent.num_dropped_blocks == expected_dropped(30)
    child = Request("c", [], SamplingParams(max_tokens=5), 1.0, eos_token_ids=(0,))
    assert s.fork("r0", child)
    assert child.num_dropped_blocks == parent.num_dropped_blocks
    assert child.block_ids[: child.num_dropped_blocks] == [0] * child.num_dropped_blocks
    s.check_integrity()
    while s.has_work:
        step(s)
    assert s.blocks.num_free == s.blocks.num_blocks


def test_dropped_blocks_stay_in_the_prefix_cache_for_the_next_request():
    s = windowed(chunk_size=8)
    s.add(create_requests(1, prompt_len=30, max_tokens=3)[0])
    while s.has_work:
        step(s)
    again = create_requests(1, prompt_len=30, max_tokens=3)[0]
    again.request_id = "again"
    s.add(again)
    step(s)
    assert again.num_prefix_hit_tokens == 28  # 7 full blocks of the prompt, freed as the first one ran
    # Of the cached prefix it keeps only what its window reads, from admission on.
    assert again.num_dropped_blocks == expected_dropped(28)
    while s.has_work:
        step(s)
    assert s.blocks.num_free == s.blocks.num_blocks


def test_the_blocks_a_request_holds_at_most_follow_the_window_and_the_step():
    def held(**kw):
        return SchedulerConfig(**kw).window_blocks(16)

    assert held(chunk_size=16) is None  # no window: the whole context
    assert held(sliding_window=40, chunk_size=16) == 5  # keys (p - 40, p + 16): 55 tokens, 4 blocks + 1 ragged
    assert held(sliding_window=40, max_num_batched_tokens=64) == 8
    assert held(sliding_window=40, chunk_size=1, num_decode_steps=8) == 4
    assert held(sliding_window=40, chunk_size=1, num_speculative_tokens=5) == 4
    assert held(sliding_window=40) is None  # whole prompts in one step
    assert held(sliding_window=40, policy="vllm", chunk_size=16) is None


def test_a_request_whose_kv_is_stored_keeps_every_block():
    """A session's turn (its blocks held at the end, for kvcache): the next turn loads its prefix from block 0."""
    s = windowed(chunk_size=8)
    s.add(req := create_requests(1, prompt_len=30, max_tokens=10)[0])
    req.hold_blocks_on_finish = True
    while s.has_work:
        step(s)
    held = s.handed_off["r0"]
    assert req.num_dropped_blocks == 0 and 0 not in held and len(held) == -(-39 // BS)
    s.release_handed_off("r0")
    assert s.blocks.num_free == s.blocks.num_blocks
