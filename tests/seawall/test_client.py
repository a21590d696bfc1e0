"""The SDK's request building: Python-friendly shapes for sampling options, validated before sending."""

from __future__ import annotations

import pytest

from seawall.client import build_request
from services.common.errors import InvalidArgument


def test_stop_takes_a_string_or_a_list_as_the_openai_api_does():
    one = build_request([1, 2], "r", {"stop": "END", "stop_token_ids": [7, 8]})
    many = build_request([1, 2], "r", {"stop": ["END", "\n\n"]})
    assert list(one.sampling.stop) == ["END"] and list(one.sampling.stop_token_ids) == [7, 8]
    assert list(many.sampling.stop) == ["END", "\n\n"]


def test_bad_sampling_is_refused_before_anything_is_sent():
    with pytest.raises(InvalidArgument, match="stop must contain only non-empty strings"):
        build_request([1, 2], "r", {"stop": [""]})
