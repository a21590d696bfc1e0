"""The SDK's request building: Python-friendly shapes for sampling options, validated before sending."""

from __future__ import annotations

import pytest

from seawall.client import build_batch, build_request
from services.common.errors import InvalidArgument


def test_stop_takes_a_string_or_a_list_as_the_openai_api_does():
    one = build_request([1, 2], "r", {"stop": "END", "stop_token_ids": [7, 8]})
    many = build_request([1, 2], "r", {"stop": ["END", "\n\n"]})
    assert list(one.sampling.stop) == ["END"] and list(one.sampling.stop_token_ids) == [7, 8]
    assert list(many.sampling.stop) == ["END", "\n\n"]


def test_bad_sampling_is_refused_before_anything_is_sent():
    with pytest.raises(InvalidArgument, match="stop must contain only non-empty strings"):
        build_request([1, 2], "r", {"stop": [""]})


def test_a_batch_takes_a_list_of_prompts_each_sent_final_only_with_the_same_sampling():
    msg = build_batch(["hello", [1, 2, 3]], {"max_tokens": 4, "session_id": "s"})
    assert [r.WhichOneof("prompt") for r in msg.requests] == ["text", "token_ids"]
    assert all(r.final_only and r.sampling.max_tokens == 4 and r.session_id == "s" for r in msg.requests)
    for bad in ("one string", []):
        with pytest.raises(ValueError, match="non-empty list of prompts"):
            build_batch(bad, {})
