"""What every endpoint of the OpenAI-compatible HTTP API shares: reading a JSON body, and errors in OpenAI's
shape, ``{"error": {"message", "type", "code"}}``, with the status each maps to and ``Retry-After`` on
overload."""

from __future__ import annotations

import json
import math
import uuid

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from services.common.errors import InvalidArgument, SeawallError
from services.common.grpc_server import MAX_MESSAGE_BYTES
from services.common.sampling_params import bool_field
from services.scheduler.anthropic_api import error_body as anthropic_error_body


def error_body(exc: SeawallError) -> dict:
    return {"error": {"message": str(exc), "type": type(exc).__name__, "code": exc.grpc_code.lower()}}


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """What an endpoint's unexpected exception (a bug) answers instead of Starlette's plain-text page: a 500 in
    the error shape the client parses (Anthropic's under ``/v1/messages``), naming the exception; the traceback
    goes to the scheduler's log (Starlette re-raises it to the server after the response)."""
    error = SeawallError(f"internal error ({type(exc).__name__}: {exc}); the scheduler's log has the traceback")
    if request.url.path.startswith("/v1/messages"):
        return error_response(error, anthropic_error_body(error))
    return error_response(error)


def error_response(exc: SeawallError, body: dict | None = None) -> JSONResponse:
    """``exc`` with its status (and ``Retry-After`` on overload), as ``body`` (default: OpenAI's shape)."""
    headers = {"Retry-After": "1"} if exc.http_status == 429 else None
    return JSONResponse(error_body(exc) if body is None else body, status_code=exc.http_status, headers=headers)


REQUEST_ID_HEADER = "x-request-id"


def request_id(request: Request) -> str:
    """The id of a request and of its reply: the client's ``X-Request-Id`` (vLLM's header: the same id in the
    client's logs, the scheduler's, the trace and ``Abort``), else a new one."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is None:
        return uuid.uuid4().hex
    if not 0 < len(given) <= 256 or not given.isprintable() or given != given.strip():
        raise InvalidArgument(f"X-Request-Id must be 1 to 256 printable characters without surrounding spaces, "
                              f"got {given[:300]!r}")
    return given


def streaming(body: dict) -> tuple[bool, bool]:
    """OpenAI's ``stream`` and ``stream_options.include_usage``, type-checked: a number as ``stream`` used to
    stream (truthy), and a ``stream_options`` that was no object then failed the response, a 500. vLLM's
    ``stream_options.continuous_usage_stats`` is checked too (``continuous_usage`` reads it)."""
    stream, options = bool_field(body, "stream"), body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidArgument(f"stream_options must be an object such as {{\"include_usage\": true}}, got {options!r}")
    for name in ("include_usage", "continuous_usage_stats"):
        value = (options or {}).get(name)
        if value is not None and not isinstance(value, bool):
            raise InvalidArgument(f"stream_options.{name} must be true or false, got {value!r}")
    return stream, bool((options or {}).get("include_usage"))


def continuous_usage(body: dict) -> bool:
    """vLLM's ``stream_options.continuous_usage_stats`` (with ``include_usage``): every chunk carries its
    choice's usage so far. Call ``streaming`` first, which checks the fields."""
    options = body.get("stream_options") or {}
    return bool(options.get("include_usage") and options.get("continuous_usage_stats"))


# The largest request body read (bytes), as gRPC's message limit (grpc_server.MAX_MESSAGE_BYTES): a prompt at the
# longest context is a few MB of JSON, and a body is held whole in memory while it is parsed.
MAX_BODY_BYTES = MAX_MESSAGE_BYTES


class BodyTooLarge(InvalidArgument):
    http_status = 413


async def json_body(request: Request, limit: int = MAX_BODY_BYTES) -> dict:
    try:
        body = json.loads(await _read_body(request, limit), parse_constant=_not_a_number, parse_float=_finite)
    except ClientDisconnect:
        # Nobody is left to read the answer; without this the server logs the disconnect as a crash.
        raise InvalidArgument("the client disconnected before it had sent the whole request body") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return body


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused once it passes ``limit`` bytes rather than after all of it is in memory."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the request body is {int(declared)} bytes; at most {limit} are accepted")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is over {limit} bytes; at most that many are accepted")
        chunks.append(chunk)
    return b"".join(chunks)


# Python's json reads NaN and Infinity (not JSON) and turns 1e999 into inf; a field echoed back (a response's
# metadata) would then fail to serialize, as a 500 after the request ran.
def _not_a_number(name: str) -> float:
    raise InvalidArgument(f"the request body is not valid JSON: {name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidArgument(f"the number {text} in the request body is out of range (at most about 1.8e308)")
    return value


def request_priority(body: dict) -> int:
    """vLLM's extension: ``priority``, lower runs sooner (0 = normal)."""
    priority = body.get("priority")
    if priority is None:
        return 0
    if isinstance(priority, bool) or not isinstance(priority, int) or not -2**31 <= priority < 2**31:
        raise InvalidArgument(f"priority must be an integer (lower runs sooner, 0 = normal), got {priority!r}")
    return priority
