"""Logprobs in the OpenAI API's completions and chat shapes."""

from __future__ import annotations

from services.common.openai_logprobs import chat_logprobs, completion_logprobs
from services.common.step import SampledToken

TEXTS = {1: "Hel", 2: "lo", 3: " wor", 4: "\ufffd"}
TOKENS = [SampledToken(1, -0.1, 1, [(1, -0.1), (3, -2.5)]), SampledToken(2, -0.7, 2, [(3, -0.5), (2, -0.7)])]


def test_completion_shape_lists_texts_logprobs_candidates_and_offsets_from_where_a_chunk_starts():
    lp = completion_logprobs(TOKENS, TEXTS.__getitem__, offset=10)
    assert lp["tokens"] == ["Hel", "lo"] and lp["token_logprobs"] == [-0.1, -0.7]
    assert lp["top_logprobs"] == [{"Hel": -0.1, " wor": -2.5}, {" wor": -0.5, "lo": -0.7}]
    assert lp["text_offset"] == [10, 13]
    assert lp["top_logprobs_ids"] == [[[1, -0.1], [3, -2.5]], [[3, -0.5], [2, -0.7]]]
    assert completion_logprobs([], TEXTS.__getitem__)["tokens"] == []


def test_chat_shape_gives_each_token_its_bytes_and_candidates():
    content = chat_logprobs([SampledToken(4, -3.0, 7, [(1, -0.2)])], TEXTS.__getitem__)["content"]
    assert content == [{"token": "\ufffd", "logprob": -3.0, "bytes": [239, 191, 189],
                        "top_logprobs": [{"token": "Hel", "logprob": -0.2, "bytes": [72, 101, 108]}]}]
