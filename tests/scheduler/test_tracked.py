"""A tracked request's output: tokens pile up in one pending delta that the reader takes whole."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken
from services.engine.builtin_model import ensure_default_model
from services.scheduler.core.request import Request
from services.scheduler.tracked import BatchWatch, TrackedRequest

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _tracked(rid: str = "r") -> TrackedRequest:
    tokenizer = Tokenizer.from_file(str(ensure_default_model() / "tokenizer.json"))
    return TrackedRequest(Request(rid, [5, 6, 7], SamplingParams(max_tokens=8), 0.0), tokenizer, 0.0)


async def test_a_reader_that_falls_behind_gets_every_token_since_it_last_looked_in_one_piece():
    t = _tracked()
    assert not t.arrived.is_set() and t.take().token_ids == []
    t.emit(SampledToken(40), None)
    t.emit(SampledToken(41, -0.5, 1), None)
    assert t.arrived.is_set()
    first = t.take()
    assert first.token_ids == [40, 41] and [tok.token_id for tok in first.logprobs] == [41]
    assert first.finish_reason is None and not t.arrived.is_set()  # a fresh event for the next wake-up
    t.emit(SampledToken(42), "length")
    last = t.take()
    assert last.token_ids == [42] and last.finish_reason == "length" and t.done.is_set()
    assert t.arrived.is_set()  # a reader waiting again after the end is not left hanging
    t.emit(SampledToken(43), None)  # nothing after the end
    assert t.take().token_ids == [] and t.num_emitted == 3


async def test_an_abort_ends_the_pending_output_with_its_reason():
    t = _tracked()
    t.emit(SampledToken(40), None)
    t.end("abort", "client went away")
    delta = t.take()
    assert delta.token_ids == [40] and delta.finish_reason == "abort" and delta.detail == "client went away"
    assert t.done.is_set() and t.finished


async def test_a_batch_watch_wakes_once_for_whichever_requests_produced_and_names_them_in_order():
    a, b, c = _tracked("a"), _tracked("b"), _tracked("c")
    c.emit(SampledToken(9), None)  # before the watch began: noted at once
    watch = BatchWatch([a, b, c], final_only=[False, False, False])
    assert watch.changed.is_set()
    b.emit(SampledToken(40), None)
    c.emit(SampledToken(41), None)
    b.emit(SampledToken(42), None)  # b again: listed once
    assert watch.take() == [2, 1] and not watch.changed.is_set()
    assert c.take().token_ids == [9, 41] and b.take().token_ids == [40, 42]
    assert watch.take() == []
    a.end("abort")
    assert watch.changed.is_set() and watch.take() == [0] and a.take().finish_reason == "abort"


async def test_a_final_only_request_in_a_batch_is_noted_only_when_it_finishes():
    a, b = _tracked("a"), _tracked("b")
    watch = BatchWatch([a, b], final_only=[True, False])
    a.emit(SampledToken(40), None)
    assert not watch.changed.is_set()
    a.emit(SampledToken(41), "length")
    assert watch.take() == [0]
    whole = a.take()
    assert whole.token_ids == [40, 41] and whole.finish_reason == "length"


async def test_prompt_scores_are_kept_once_per_position_and_go_out_with_the_first_token():
    t = _tracked()
    t.add_prompt_logprobs(1, [SampledToken(6, -1.0)])
    t.add_prompt_logprobs(1, [SampledToken(6, -1.1), SampledToken(7, -2.0)])  # recomputed after a preemption
    t.add_prompt_logprobs(5, [SampledToken(9, -3.0)])  # not next in line: dropped
    assert [(s.token_id, s.logprob) for s in t.prompt_logprobs] == [(6, -1.0), (7, -2.0)]
    t.emit(SampledToken(40), None)
    t.emit(SampledToken(41), None)
    first = t.take()
    assert [s.token_id for s in first.prompt_logprobs] == [6, 7]
    t.emit(SampledToken(42), None)
    assert t.take().prompt_logprobs == []
