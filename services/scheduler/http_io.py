"""What every endpoint of the OpenAI-compatible HTTP API shares: reading a JSON body, and errors in OpenAI's
shape, ``{"error": {"message", "type", "code"}}``, with the status each maps to and ``Retry-After`` on
overload."""

from __future__ import annotations

import json

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from services.common.errors import InvalidArgument, SeawallError


def error_response(exc: SeawallError) -> JSONResponse:
    headers = {"Retry-After": "1"} if exc.http_status == 429 else None
    body = {"error": {"message": str(exc), "type": type(exc).__name__, "code": exc.grpc_code.lower()}}
    return JSONResponse(body, status_code=exc.http_status, headers=headers)


async def json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except ClientDisconnect:
        # Nobody is left to read the answer; without this the server logs the disconnect as a crash.
        raise InvalidArgument("the client disconnected before it had sent the whole request body") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return body
