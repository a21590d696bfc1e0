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


def test_abort_during_arrival_frees_the_reserved_blocks():
    decode = create_scheduler()
    moved = Request("r0", list(range(1, 11)), SamplingParams(), 0.0, num_computed_tokens=10)
    decode.reserve_arrival(moved)
    decode.finish("r0")
    decode.check_integrity()
    assert decode.blocks.num_free == decode.blocks.num_blocks and not decode.arriving


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
