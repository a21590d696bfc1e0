"""A released request's partly filled last block stays cached; a request continuing its tokens copies it
(tail_blocks.py)."""

from __future__ import annotations

from services.common.block_hash import extend_hashes, tail_hash
from services.common.sampling_params import SamplingParams
from services.scheduler.core.request import Request
from tests.scheduler.core.test_scheduler import create_scheduler, step

PROMPT = list(range(100, 110))  # 10 tokens: two full blocks of 4 and two tokens in a third


def _run(s, rid: str, prompt: list[int], max_tokens: int = 1, **kw) -> Request:
    req = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens), 0.0, **kw)
    s.add(req)
    while s.has_work:
        step(s)
    return req


def first_blocks(s, tokens: list[int]) -> list[int]:
    return s.blocks.cached_prefix(extend_hashes([], tokens, s.blocks.block_size, s.hash_seed))


def test_a_request_continuing_a_finished_one_copies_its_partly_filled_last_block():
    s = create_scheduler(block_size=4)
    first = _run(s, "a", PROMPT)  # computes 10 tokens; samples the 11th
    second = Request("b", PROMPT + [first.output_token_ids[0], 55], SamplingParams(max_tokens=1), 1.0)
    s.add(second)
    plan, _ = step(s)
    (new,) = plan.new
    assert new.num_computed_tokens == 10  # two full blocks shared, the third's two tokens copied
    assert plan.num_scheduled_tokens == {"b": 2}
    ((src, dst),) = plan.copy
    assert new.block_ids[:2] == first_blocks(s, PROMPT[:8]) and new.block_ids[2] == dst != src
    assert s.prefix_stats.tail_tokens == 2 and second.num_prefix_hit_tokens == 10
    s.check_integrity()


def test_only_a_tail_of_exactly_the_tokens_before_the_next_is_found():
    s = create_scheduler(block_size=4)
    _run(s, "a", list(PROMPT))  # its tail holds 108, 109
    same = Request("b", list(PROMPT), SamplingParams(max_tokens=1), 1.0)  # 109 must run: it wants 108 alone
    s.add(same)
    plan, _ = step(s)
    assert plan.new[0].num_computed_tokens == 8 and not plan.copy
    while s.has_work:
        step(s)
    _run(s, "c", PROMPT + [1, 2, 3, 4, 5])  # its block 2 is full: 108, 109, 1, 2
    longer = Request("d", PROMPT + [1], SamplingParams(max_tokens=1), 2.0)
    s.add(longer)
    plan, _ = step(s)
    assert plan.new[0].num_computed_tokens == 10  # a's tail, not c's full block (not found by its first tokens)
    assert len(plan.copy) == 1


def test_no_tail_is_taken_across_salts_and_a_tail_is_evicted_before_its_full_blocks():
    s = create_scheduler(num_blocks=6, block_size=4)
    _run(s, "a", PROMPT)
    salted = Request("b", PROMPT + [9], SamplingParams(max_tokens=1), 1.0, cache_salt="t")
    s.add(salted)
    plan, _ = step(s)
    assert plan.new[0].num_computed_tokens == 0 and not plan.copy
    while s.has_work:
        step(s)
    hashes = extend_hashes([], PROMPT, 4, s.hash_seed)
    first, tail = hashes[0], tail_hash(hashes, PROMPT, 4, s.hash_seed, 2)
    # A request's blocks are freed tail first, so its tail is evicted before its full blocks (useless without
    # them): one more block taken evicts a's tail alone.
    _run(s, "c", [500, 501, 502], max_tokens=1)
    assert s.blocks.cached_block(first) is not None and s.blocks.cached_block(tail) is None
    later = Request("d", PROMPT + [9], SamplingParams(max_tokens=1), 2.0)
    s.add(later)
    plan, _ = step(s)
    assert plan.new[0].num_computed_tokens == 8 and not plan.copy
    s.check_integrity()


def test_a_tail_whose_request_cannot_be_admitted_leaves_no_copy_behind():
    s = create_scheduler(num_blocks=3, block_size=4, chunk_size=64)
    _run(s, "a", PROMPT)
    big = Request("b", PROMPT + list(range(600, 610)), SamplingParams(max_tokens=1), 1.0)  # needs 5 blocks
    s.add(big)
    plan = s.schedule()
    assert not plan.copy and not plan.num_scheduled_tokens
    s.check_integrity()


def test_tails_are_off_without_prefix_caching_and_for_sliding_windows():
    for overrides in ({"enable_prefix_caching": False}, {"sliding_window": 64}):
        s = create_scheduler(block_size=4, **overrides)
        _run(s, "a", PROMPT)
        again = Request("b", PROMPT + [9, 9], SamplingParams(max_tokens=1), 1.0)
        s.add(again)
        plan, _ = step(s)
        assert not plan.copy and plan.new[0].num_computed_tokens % 4 == 0


def test_a_handed_off_prompt_s_tail_serves_the_next_turn_on_its_worker():
    s = create_scheduler(block_size=4)
    first = Request("a", list(PROMPT), SamplingParams(max_tokens=4), 0.0)
    s.add(first)
    step(s)  # the prompt, and its first token
    held = s.hand_off("a")  # on to a decode worker; the blocks stay referenced while their KV is sent
    turn = Request("b", PROMPT + [7, 8, 9, 5, 6], SamplingParams(max_tokens=1), 1.0)
    s.add(turn)
    plan, _ = step(s)
    assert plan.new[0].num_computed_tokens == 10 and plan.copy[0][0] == held[2]  # copied, not shared
    s.release_handed_off("a")
    s.check_integrity()
