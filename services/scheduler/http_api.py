"""The OpenAI-compatible HTTP API, served by the scheduler process next to its gRPC service.

``/v1/completions``, ``/v1/chat/completions`` (the tokenizer's chat template), SSE streaming, ``/v1/models``
and ``/health``. Prompts may be text or token ids; ``return_token_ids: true`` adds ``token_ids`` to each
choice (vLLM's extension). Errors use OpenAI's shape, ``{"error": {"message", "type", "code"}}``, with
400 for bad input and 429 plus ``Retry-After`` for overload.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import jinja2.sandbox
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from services.common import tracing
from services.common.errors import InvalidArgument, SeawallError
from services.common.sampling_params import SamplingParams
from services.scheduler.frontend import Frontend
from services.scheduler.tracked import Delta, TrackedRequest

# Chat fields handled here rather than by SamplingParams.from_openai.
_CHAT_ONLY = {"session_id", "messages", "max_completion_tokens", "top_logprobs", "logprobs", "response_format", "tools",
              "tool_choice", "parallel_tool_calls", "chat_template_kwargs"}


def create_app(frontend: Frontend, registry: CollectorRegistry | None = None) -> Starlette:
    """The API's routes; with ``registry``, also Prometheus text at ``/metrics``."""
    api = _OpenAI(frontend)
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
    ]
    if registry is not None:
        async def metrics(request: Request) -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

        routes.append(Route("/metrics", metrics, methods=["GET"]))
    return Starlette(routes=routes)


def error_response(exc: SeawallError) -> JSONResponse:
    headers = {"Retry-After": "1"} if exc.http_status == 429 else None
    body = {"error": {"message": str(exc), "type": type(exc).__name__, "code": exc.grpc_code.lower()}}
    return JSONResponse(body, status_code=exc.http_status, headers=headers)


class _OpenAI:
    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        self._template = _chat_template(frontend)

    async def health(self, request: Request) -> Response:
        workers = len(self.frontend.mesh.live_links())
        return JSONResponse({"status": "ok" if workers else "no workers", "workers": workers},
                            status_code=200 if workers else 503)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.frontend.model_name, "object": "model", "created": 0, "owned_by": "seawall",
            "max_model_len": self.frontend.max_model_len}]})

    async def completions(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            prompt = self._prompt(body.get("prompt"))
            params = SamplingParams.from_openai(body)
            tracked = self.frontend.submit(prompt, params, trace_parent=tracing.extract(request.headers),
                                           session_id=_session(body))
        except SeawallError as exc:
            return error_response(exc)
        return await self._respond(request, body, tracked, chat=False)

    async def chat(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            prompt = self._render_chat(body.get("messages"), body.get("chat_template_kwargs") or {})
            sampling = {k: v for k, v in body.items() if k not in _CHAT_ONLY}
            if body.get("max_completion_tokens") is not None:
                sampling["max_tokens"] = body["max_completion_tokens"]
            if body.get("logprobs"):
                sampling["logprobs"] = int(body.get("top_logprobs") or 0)
            tracked = self.frontend.submit(prompt, SamplingParams.from_openai(sampling),
                                           trace_parent=tracing.extract(request.headers), session_id=_session(body))
        except SeawallError as exc:
            return error_response(exc)
        return await self._respond(request, body, tracked, chat=True)

    def _prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return self.frontend.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return prompt
        raise InvalidArgument("prompt must be a string or a list of token ids (one prompt per request)")

    def _render_chat(self, messages: Any, kwargs: dict) -> list[int]:
        if not isinstance(messages, list) or not messages:
            raise InvalidArgument("messages must be a non-empty list of {\"role\", \"content\"} objects")
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise InvalidArgument(f"messages[{i}] must be an object with string role and content")
        if self._template is None:
            raise InvalidArgument("this model has no chat template; use /v1/completions")
        text = self._template.render(messages=messages, add_generation_prompt=True, **_special_tokens(self.frontend),
                                     **kwargs)
        return self.frontend.encode(text)

    async def _respond(self, request: Request, body: dict, tracked: TrackedRequest, chat: bool) -> Response:
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": self.frontend.model_name}
        want_ids = bool(body.get("return_token_ids"))
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._sse(head, tracked, chat, want_ids, include_usage),
                                     media_type="text/event-stream")
        merged = await self._collect(request, tracked)
        choice: dict[str, Any] = {"index": 0, "finish_reason": merged.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": merged.text}
        else:
            choice["text"] = merged.text
        if want_ids:
            choice["token_ids"] = merged.token_ids
        obj = "chat.completion" if chat else "text_completion"
        return JSONResponse({**head, "object": obj, "choices": [choice], "usage": _usage(tracked)})

    async def _collect(self, request: Request, tracked: TrackedRequest) -> Delta:
        """All of the request's output; aborts it if the client disconnects first."""
        merged = Delta()
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                while not await request.is_disconnected():
                    await anyio.sleep(0.25)
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            merged = await self.frontend.collect(tracked)
            tg.cancel_scope.cancel()
        return merged

    async def _sse(self, head: dict, tracked: TrackedRequest, chat: bool, want_ids: bool,
                   include_usage: bool) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if chat else "text_completion"
        first = True
        async for merged in self.frontend.stream(tracked):
            choice: dict[str, Any] = {"index": 0, "finish_reason": merged.finish_reason, "logprobs": None}
            if chat:
                choice["delta"] = {"role": "assistant", "content": merged.text} if first else {"content": merged.text}
            else:
                choice["text"] = merged.text
            if want_ids:
                choice["token_ids"] = merged.token_ids
            first = False
            yield _event({**head, "object": obj, "choices": [choice]})
        if include_usage:
            yield _event({**head, "object": obj, "choices": [], "usage": _usage(tracked)})
        yield "data: [DONE]\n\n"


def _session(body: dict) -> str:
    """Seawall's extension: ``session_id`` names a multi-turn conversation whose KV is kept for its next turn."""
    session = body.get("session_id") or ""
    if not isinstance(session, str):
        raise InvalidArgument("session_id must be a string")
    return session


def _usage(tracked: TrackedRequest) -> dict:
    req = tracked.request
    n_prompt, n_out = len(req.prompt_token_ids), len(req.output_token_ids)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": req.num_prefix_hit_tokens}}


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return body


def _chat_template(frontend: Frontend) -> jinja2.Template | None:
    cfg = _tokenizer_config(frontend)
    source = cfg.get("chat_template")
    if isinstance(source, list):  # several named templates: take the default one
        source = next((t["template"] for t in source if t.get("name") == "default"), None)
    if not source:
        return None
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(source)


def _special_tokens(frontend: Frontend) -> dict[str, str]:
    cfg = _tokenizer_config(frontend)
    out = {}
    for key in ("bos_token", "eos_token"):
        value = cfg.get(key)
        out[key] = value.get("content", "") if isinstance(value, dict) else (value or "")
    return out


def _tokenizer_config(frontend: Frontend) -> dict:
    path = frontend.checkpoint.path / "tokenizer_config.json"
    return json.loads(path.read_text()) if path.exists() else {}
