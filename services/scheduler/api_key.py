"""Who may call the mesh: with ``--api-key`` (or ``SEAWALL_API_KEY``), every client-facing call must carry the
key, as vLLM's ``--api-key`` asks. HTTP takes it as ``Authorization: Bearer KEY`` (OpenAI's clients) or
``x-api-key: KEY`` (Anthropic's); gRPC as ``authorization: Bearer KEY`` metadata (the SDK sends it).

Left open: what operators and the mesh itself call (HTTP ``/health``, ``/version``, ``/metrics``, which a
Prometheus server scrapes without credentials, as vLLM leaves them; gRPC health and reflection, and the workers'
``RegisterWorker`` and ``DrainWorker``).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence

import grpc
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from services.common.errors import Unauthenticated
from services.scheduler.anthropic_api import error_body as anthropic_error_body
from services.scheduler.http_io import error_body

OPEN_PATHS = frozenset({"/health", "/version", "/metrics"})
_SCHEDULER = "/seawall.v1.Scheduler/"
_OPEN_METHODS = frozenset({f"{_SCHEDULER}RegisterWorker", f"{_SCHEDULER}DrainWorker"})
_MISSING = ("this mesh needs an API key: send it as 'Authorization: Bearer KEY' (or, over HTTP, 'x-api-key: KEY'); "
            "the SDK sends $SEAWALL_API_KEY or api_key=...")
_WRONG = "the API key sent is not this mesh's (--api-key / $SEAWALL_API_KEY of the scheduler)"


class ApiKey:
    def __init__(self, key: str) -> None:
        self._key = key.encode()

    def check(self, authorization: str | None, x_api_key: str | None = None) -> None:
        """Raises ``Unauthenticated`` unless one of the headers carries the key."""
        given = []
        if authorization:
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() == "bearer":
                given.append(token.strip())
        if x_api_key:
            given.append(x_api_key.strip())
        if not given:
            raise Unauthenticated(_MISSING)
        # compare_digest for every candidate: how long a refusal takes says nothing about the key
        if not any([hmac.compare_digest(g.encode(), self._key) for g in given]):
            raise Unauthenticated(_WRONG)


class ApiKeyMiddleware:
    """Refuses an HTTP request without the key with 401 (in Anthropic's error shape under ``/v1/messages``)."""

    def __init__(self, app: ASGIApp, key: ApiKey) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            try:
                self.key.check(headers.get("authorization"), headers.get("x-api-key"))
            except Unauthenticated as exc:
                anthropic = scope["path"].startswith("/v1/messages")
                body = anthropic_error_body(exc) if anthropic else error_body(exc)
                await JSONResponse(body, status_code=exc.http_status,
                                   headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Ends a Scheduler call without the key with UNAUTHENTICATED before its handler runs."""

    def __init__(self, key: ApiKey) -> None:
        self.key = key

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable],
                                details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(_SCHEDULER) or details.method in _OPEN_METHODS:
            return handler
        try:
            self.key.check(_metadata(details.invocation_metadata, "authorization"))
        except Unauthenticated as exc:
            return _refusing(handler, str(exc))
        return handler


def _metadata(metadata: Sequence[tuple[str, str | bytes]] | None, key: str) -> str | None:
    value = next((v for k, v in metadata or () if k == key), None)
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that ends the call with UNAUTHENTICATED."""
    async def refuse(_request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    make = kinds[handler.request_streaming, handler.response_streaming]
    return make(refuse, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
