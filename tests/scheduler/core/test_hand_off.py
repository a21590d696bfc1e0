"""Disaggregated hand-off in the core: a prompt finishes on one scheduler, its request decodes on another."""

from __future__ import annotations

from services.common.sampling_params import SamplingParams
from services.scheduler.core.request import Request, RequestStatus
from tests.scheduler.core.test_scheduler import create_requests, create_scheduler, step


def _prefill_then_hand_off(prefill):
    req = create_requests(1, prompt_len=10, max_tokens=5)[0]
    prefill.add(req)
    _, events = step(prefill, token=7)  # whole prompt in one step: the first token is sampled
    assert [e.token.token_id for e in events] == [7]
    held = prefill.hand_off("r0")
    return req, held


def test_hand_off_keeps_blocks_until_released_and_the_worker_drops_the_sequence():
    prefill = create_scheduler()
    req, held = _prefill_then_hand_off(prefill)
    assert len(held) == 3 and not prefill.has_work and "r0" not in prefill.requests
    prefill.check_integrity()
    assert prefill.blocks.num_free == prefill.blocks.num_blocks - 3
    plan = prefill.schedule()
    assert plan.finished == ["r0"] and not plan.num_scheduled_tokens
    prefill.release_handed_off("r0")
    prefill.check_integrity()
    assert prefill.blocks.num_free == prefill.blocks.num_blocks


def test_arrival_reserves_blocks_then_decodes_from_the_transferred_kv():
    _, held = _prefill_then_hand_off(create_scheduler())
    decode = create_scheduler()
    moved = Request("r0", list(range(1, 11)), SamplingParams(max_tokens=5), 0.0, eos_token_ids=(0,),
                    output_token_ids=[7], num_computed_tokens=10)
    dst = decode.reserve_arrival(moved)
    assert len(dst) == len(held) and moved.status is RequestStatus.ARRIVING
    assert not decode.schedule().num_scheduled_tokens  # not schedulable before its KV landed
    decode.check_integrity()
    decode.arrive("r0")
    plan, events = step(decode, token=8)
    assert plan.num_scheduled_tokens == {"r0": 1}
    (new,) = plan.new
    assert new.num_computed_tokens == 10 and new.token_ids[-1] == 7 and new.block_ids == dst
    assert [e.token.token_id for e in events] == [8] and moved.output_token_ids == [7, 8]


def test_failed_transfer_recomputes_prompt_and_first_token_on_the_receiver():
    decode = create_scheduler()
    moved = Request("r0", list(range(1, 11)), SamplingParams(max_tokens=5), 0.0, eos_token_ids=(0,),
                    output_token_ids=[7], num_computed_tokens=10)
    decode.reserve_arrival(moved)
    decode.cancel_arrival("r0")
    decode.check_integrity()
    plan, events = step(decode, token=9)
    assert plan.num_scheduled_tokens == {"r0": 11}  # prompt + the first output token, recomputed
    assert plan.new[0].num_computed_tokens == 0 and moved.output_token_ids == [7, 9]


def test_arrival_that_does_not_fit_is_refused_without_side_effects():
    decode = create_scheduler(num_blocks=2)
    moved = Request("r0", list(range(1, 11)), SamplingParams(), 0.0, num_computed_tokens=10)
    assert decode.reserve_arrival(moved) is None
    assert "r0" not in decode.requests and decode.blocks.num_free == 2


def test_abort_during_arrival_keeps_the_blocks_until_the_transfer_ended():
    # The transfer may still be writing into the reserved blocks: handed to another request at once, a late
    # write would land in that request's KV.
    decode = create_scheduler(num_blocks=6)  # 4 tokens a block
    moved = Request("r0", list(range(1, 11)), SamplingParams(), 0.0, num_computed_tokens=10)
    reserved = decode.reserve_arrival(moved)
    decode.finish("r0")
    decode.check_integrity()
    assert not decode.arriving and "r0" not in decode.requests
    assert decode.blocks.num_free == 3  # the 3 reserved blocks are still held
    other = create_requests(1, prompt_len=16, start=1)[0]  # needs 4 blocks: waits for them
    decode.add(other)
    assert not decode.schedule().num_scheduled_tokens
    # The id is free again: a new request under it, aborted while arriving too, is released on its own.
    again = Request("r0", list(range(1, 11)), SamplingParams(), 0.0, num_computed_tokens=10)
    assert len(decode.reserve_arrival(again)) == 3
    decode.finish("r0")
    assert decode.blocks.num_free == 0
    decode.release_landing(again)
    assert decode.blocks.num_free == 3 and not decode.schedule().num_scheduled_tokens
    decode.release_landing(moved)
    decode.check_integrity()
    assert decode.blocks.num_free == 6 and moved.block_ids == []
    plan = decode.schedule()
    assert plan.num_scheduled_tokens == {other.request_id: 16}
    assert set(plan.new[0].block_ids) & set(reserved)  # the blocks serve a new owner only now
    decode.release_landing(moved)  # a second call (or one for a request never aborted) does nothing
    decode.check_integrity()


def test_drain_forgets_the_blocks_of_aborted_arrivals():
    decode = create_scheduler()
    moved = Request("r0", list(range(1, 11)), SamplingParams(), 0.0, num_computed_tokens=10)
    decode.reserve_arrival(moved)
    decode.finish("r0")
    assert decode.drain() == [] and not decode.landing


def test_drain_returns_every_request_reset_for_recompute_with_its_outputs():
    s = create_scheduler(chunk_size=8)
    for r in create_requests(3, prompt_len=10):
        s.add(r)
    for _ in range(3):
        step(s, token=5)
    drained = s.drain()
    assert [r.request_id for r in drained] == ["r0", "r1", "r2"]
    assert all(r.status is RequestStatus.WAITING and not r.block_ids and r.num_computed_tokens == 0
               for r in drained)
    assert drained[0].output_token_ids == [5, 5] and not s.has_work
    other = create_scheduler(chunk_size=64)
    for r in drained:
        other.add(r)
    plan, _ = step(other, token=6)
    assert plan.num_scheduled_tokens["r0"] == 12  # prompt + its two outputs


def test_arrival_reuses_the_receivers_cached_prefix_so_only_the_rest_travels():
    decode = create_scheduler()
    first = Request("a", list(range(1, 11)), SamplingParams(max_tokens=5), 0.0, eos_token_ids=(0,),
                    output_token_ids=[7], num_computed_tokens=10)
    decode.reserve_arrival(first)
    decode.arrive("a")  # its two full blocks (block size 4) enter the prefix cache
    second = Request("b", list(range(1, 11)) + [50, 51], SamplingParams(max_tokens=5), 1.0, eos_token_ids=(0,),
                     output_token_ids=[9], num_computed_tokens=12)
    ids = decode.reserve_arrival(second)
    assert second.num_cached_blocks == 2 and ids[:2] == first.block_ids[:2] and len(ids) == 3
    decode.check_integrity()


def test_a_staged_arrival_becomes_prefix_cache_for_a_later_arrival():
    decode = create_scheduler()
    stage = Request("s#kv", list(range(1, 9)), SamplingParams(), 0.0, num_computed_tokens=8)
    staged = decode.reserve_arrival(stage)
    decode.cache_arrival("s#kv")
    decode.check_integrity()
    assert "s#kv" not in decode.requests and decode.blocks.num_free == decode.blocks.num_blocks
    later = Request("s", list(range(1, 11)), SamplingParams(max_tokens=3), 0.0, output_token_ids=[4],
                    num_computed_tokens=10)
    ids = decode.reserve_arrival(later)
    assert later.num_cached_blocks == 2 and ids[:2] == staged


def test_a_request_that_holds_its_blocks_on_finish_keeps_them_until_released():
    s = create_scheduler()
    req = create_requests(1, prompt_len=10, max_tokens=2)[0]
    req.hold_blocks_on_finish = True
    s.add(req)
    step(s)
    _, events = step(s)
    assert events[-1].finish_reason == "length" and "r0" in s.handed_off
    assert req.num_computed_tokens == 11 and len(s.handed_off["r0"]) == 3
    s.check_integrity()
    s.release_handed_off("r0")
    assert s.blocks.num_free == s.blocks.num_blocks


def test_an_aborted_request_never_holds_its_blocks():
    s = create_scheduler()
    req = create_requests(1, prompt_len=10, max_tokens=5)[0]
    req.hold_blocks_on_finish = True
    s.add(req)
    step(s)
    s.finish("r0")
    assert not s.handed_off and s.blocks.num_free == s.blocks.num_blocks


def test_a_recurrent_model_keeps_the_handed_off_sequence_on_the_worker_until_the_transfer_ended():
    """Its state (linear-attention layers) is read from the sender after the blocks: the sender's worker drops
    the sequence only in the plan after the release; a receiver whose landing was aborted drops the state the
    pull left it the same way."""
    prefill = create_scheduler(recurrent_state=True)
    _prefill_then_hand_off(prefill)
    assert prefill.schedule().finished == []
    prefill.release_handed_off("r0")
    assert prefill.schedule().finished == ["r0"]
    decode = create_scheduler(recurrent_state=True)
    moved = Request("r0", list(range(1, 11)), SamplingParams(), 0.0, num_computed_tokens=10)
    decode.reserve_arrival(moved)
    decode.finish("r0")
    decode.release_landing(moved)
    assert decode.schedule().finished == ["r0"]
