"""Logprobs in the OpenAI API's completions and chat shapes."""

from __future__ import annotations

from services.common.openai_logprobs import chat_logprobs, completion_logprobs, echoed_completion_logprobs
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


def test_tokens_named_by_id_keep_the_offsets_and_bytes_of_their_texts():
    # vLLM's return_tokens_as_token_ids: "token_id:ID" says which token where a text cannot (4 is part of a
    # character); where a token's text sits in the choice's text still comes from the texts.
    lp = completion_logprobs(TOKENS, TEXTS.__getitem__, offset=10, as_ids=True)
    assert lp["tokens"] == ["token_id:1", "token_id:2"] and lp["text_offset"] == [10, 13]
    assert lp["top_logprobs"] == [{"token_id:1": -0.1, "token_id:3": -2.5}, {"token_id:3": -0.5, "token_id:2": -0.7}]
    content = chat_logprobs([SampledToken(4, -3.0, 7, [(1, -0.2)])], TEXTS.__getitem__, as_ids=True)["content"]
    assert content == [{"token": "token_id:4", "logprob": -3.0, "bytes": [239, 191, 189],
                        "top_logprobs": [{"token": "token_id:1", "logprob": -0.2, "bytes": [72, 101, 108]}]}]
    echoed = echoed_completion_logprobs([3, 1], [SampledToken(1, -1.0, 1, [(1, -1.0)])], TOKENS[:1],
                                        TEXTS.__getitem__, as_ids=True)
    assert echoed["tokens"] == ["token_id:3", "token_id:1", "token_id:1"] and echoed["text_offset"] == [0, 4, 7]
