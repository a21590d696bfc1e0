"""Reading a request's JSON body: what is not a JSON object (NaN, Infinity and numbers past a float64 included),
and a client gone before its body arrived, are errors that say so (not a crash of the ASGI application, or a
500 once a field is echoed back)."""

from __future__ import annotations

import anyio
import pytest
from starlette.requests import Request

from services.common.errors import InvalidArgument
from services.scheduler.http_io import json_body


def _request(*messages: dict) -> Request:
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0)

    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)


def _read(request: Request) -> dict:
    return anyio.run(json_body, request)


def test_a_json_object_is_read_in_pieces():
    assert _read(_request({"type": "http.request", "body": b'{"prompt": ', "more_body": True},
                          {"type": "http.request", "body": b'"hi", "t": 0.5, "n": 1e300, "big": 10000000000000000000000}'})
                 ) == {"prompt": "hi", "t": 0.5, "n": 1e300, "big": 10**22}


@pytest.mark.parametrize("messages, fragment", [
    ([{"type": "http.request", "body": b"{nope"}], "not valid JSON"),
    ([{"type": "http.request", "body": b"[1, 2]"}], "must be a JSON object"),
    ([{"type": "http.request", "body": b'{"metadata": {"a": NaN}}'}], "NaN is not a JSON number"),
    ([{"type": "http.request", "body": b'{"temperature": -Infinity}'}], "-Infinity is not a JSON number"),
    ([{"type": "http.request", "body": b'{"top_p": 1e999}'}], "the number 1e999 .* is out of range"),
    ([{"type": "http.request", "body": b'{"prompt": ', "more_body": True}, {"type": "http.disconnect"}],
     "disconnected before it had sent the whole request body"),
])
def test_what_is_not_a_whole_json_object_is_invalid_argument(messages, fragment):
    with pytest.raises(InvalidArgument, match=fragment):
        _read(_request(*messages))
