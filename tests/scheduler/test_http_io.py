"""Reading a request's JSON body: what is not a JSON object (NaN, Infinity and numbers past a float64 included),
and a client gone before its body arrived, are errors that say so (not a crash of the ASGI application, or a
500 once a field is echoed back); an endpoint's unexpected exception answered in the error shape its client parses."""

from __future__ import annotations

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from services.common.errors import InvalidArgument
from services.scheduler.http_io import BodyTooLarge, internal_error, json_body


def _request(*messages: dict, headers: tuple = ()) -> Request:
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0)

    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": list(headers)}, receive)


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


def test_a_body_past_the_limit_is_refused_before_it_is_all_read():
    """413, from its Content-Length when it has one, else once the chunks read pass the limit."""
    piece = {"type": "http.request", "body": b" " * 60, "more_body": True}
    with pytest.raises(BodyTooLarge, match="over 100 bytes") as exc:  # receive() would fail past the third
        anyio.run(json_body, _request(piece, piece, piece), 100)
    assert exc.value.http_status == 413
    with pytest.raises(BodyTooLarge, match="is 5000 bytes"):
        anyio.run(json_body, _request(headers=((b"content-length", b"5000"),)), 100)
    assert anyio.run(json_body, _request({"type": "http.request", "body": b'{"a": 1}'}), 8) == {"a": 1}


def _app_that_fails() -> TestClient:
    async def broken(request: Request) -> Response:
        raise KeyError("documents")

    app = Starlette(routes=[Route(path, broken, methods=["POST"]) for path in ("/rerank", "/v1/messages")],
                    exception_handlers={Exception: internal_error})
    return TestClient(app, raise_server_exceptions=False)


def test_an_unexpected_exception_is_a_json_500_in_the_endpoints_shape():
    """A bug in an endpoint answers what its client parses (not Starlette's plain-text page), naming the error."""
    client = _app_that_fails()
    r = client.post("/rerank", json={})
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal" and "KeyError: 'documents'" in r.json()["error"]["message"]
    r = client.post("/v1/messages", json={})
    assert r.status_code == 500 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "api_error" and "KeyError" in r.json()["error"]["message"]
