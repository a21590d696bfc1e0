"""A tracked request's output: tokens pile up in one pending delta that the reader takes whole."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken
from services.engine.builtin_model import ensure_default_model
from services.scheduler.core.request import Request
from services.scheduler.tracked import TrackedRequest

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _tracked() -> TrackedRequest:
    tokenizer = Tokenizer.from_file(str(ensure_default_model() / "tokenizer.json"))
    return TrackedRequest(Request("r", [5, 6, 7], SamplingParams(max_tokens=8), 0.0), tokenizer, 0.0)


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
