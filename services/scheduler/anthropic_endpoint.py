"""Anthropic's Messages API endpoints (``POST /v1/messages``, ``POST /v1/messages/count_tokens``), served next
to the chat API whose path runs them: services/scheduler/anthropic_api.py translates a request into the chat
request and the reply back into content blocks; this module submits, streams and answers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from services.common.errors import SeawallError
from services.scheduler.anthropic_api import ContentBlocks, error_body, parse_request, stop_reason, usage
from services.scheduler.chat_tools import ToolCalling
from services.scheduler.http_io import REQUEST_ID_HEADER, json_body, request_id
from services.scheduler.http_io import error_response as http_error_response
from services.scheduler.tracked import TrackedRequest

if TYPE_CHECKING:
    from services.scheduler.http_api import OpenAIApi


class MessagesEndpoint:
    def __init__(self, api: OpenAIApi) -> None:
        self.api = api

    async def create(self, request: Request) -> Response:
        """A Messages request, run as the chat request it translates to."""
        try:
            req = parse_request(await json_body(request))
            base = request_id(request)  # the client's X-Request-Id names the request and the message (msg_ID)
            prompt, params, _, tools = self.api.chat_request(req.chat)
            (tracked,) = self.api.submit(request, req.chat, [prompt], params, 1, base)
        except SeawallError as exc:
            return error_response(exc)
        head = {"id": f"msg_{base}", "type": "message", "role": "assistant", "model": self.api.served_name(req.chat)}
        if req.stream:
            return StreamingResponse(_sse(self._events(head, tracked, tools, req.show_thinking)),
                                     media_type="text/event-stream", headers={REQUEST_ID_HEADER: base})
        (out,) = await self.api.collect(request, [tracked])
        if out.error is not None:
            return error_response(out.error)
        thought, text = self.api.split_reasoning(tracked, out.text)
        message, finish = tools.message(text, out.finish_reason) if tools else ({"content": text}, out.finish_reason)
        blocks = ContentBlocks()
        blocks.feed({"reasoning": thought if req.show_thinking else None, "content": message["content"],
                     "tool_calls": [{"index": k, **c} for k, c in enumerate(message.get("tool_calls") or [])]})
        blocks.close()
        return JSONResponse({**head, "content": blocks.blocks, **stop_reason(finish, _stop_string(tracked)),
                             "usage": _usage(tracked)}, headers=self.api.reply_headers([tracked], base))

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the prompt tokens a Messages request would be sent as."""
        try:
            body = await json_body(request)
            req = parse_request({k: v for k, v in body.items() if k != "max_tokens"}, counting=True)
            ids = self.api.chat_prompt(req.chat)
        except SeawallError as exc:
            return error_response(exc)
        return JSONResponse({"input_tokens": len(ids)})

    async def _events(self, head: dict, tracked: TrackedRequest, tools: ToolCalling | None,
                      show_thinking: bool) -> AsyncIterator[dict]:
        """Anthropic's stream: message_start once the prompt has run (its cache reads known), each block's
        start, deltas and stop as the tokens arrive, then message_delta (stop reason, usage) and message_stop;
        an error ends it as an error event."""
        blocks, calls = ContentBlocks(), tools.stream() if tools else None
        thoughts = self.api.reasoning_stream(tracked)
        started, finish = False, None

        def message_start() -> dict:
            r = tracked.request
            return {"type": "message_start", "message": {
                **head, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": usage(len(r.prompt_token_ids), r.num_prefix_hit_tokens, 0)}}

        async for ready in self.api.stream([tracked]):
            for _, merged in ready:
                if merged.error is not None:
                    yield error_body(merged.error)
                    return
                if not started:
                    started = True
                    yield message_start()
                thought = ""
                if thoughts is not None:
                    thought, answer = thoughts.feed(merged.text, final=merged.finish_reason is not None)
                    merged = replace(merged, text=answer)
                delta, finish = calls.delta(merged) if calls else ({"content": merged.text}, merged.finish_reason)
                for e in blocks.feed({**delta, "reasoning": thought if show_thinking else ""}):
                    yield e
        if not started:  # a stream that ended with nothing to say still starts its message
            yield message_start()
        for e in blocks.close():
            yield e
        yield {"type": "message_delta", "delta": stop_reason(finish, _stop_string(tracked)), "usage": _usage(tracked)}
        yield {"type": "message_stop"}


def _stop_string(tracked: TrackedRequest) -> str | None:
    return tracked.detok.finished_by_stop_string


def _usage(tracked: TrackedRequest) -> dict[str, Any]:
    r = tracked.request
    return usage(len(r.prompt_token_ids), r.num_prefix_hit_tokens, len(r.output_token_ids))


def error_response(exc: SeawallError) -> JSONResponse:
    return http_error_response(exc, error_body(exc))


async def _sse(events: AsyncIterator[dict]) -> AsyncIterator[str]:
    async for e in events:
        yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"
