"""OpenAI's Responses API endpoints (``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel``, ``GET /v1/responses/{id}/input_items``), served next to the chat API whose
path runs them: services/scheduler/responses_api.py translates a request into the chat request and the reply
back into output items; this module submits, streams and stores, and runs background responses
(services/scheduler/responses_background.py)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING

from anyio.abc import TaskGroup
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from services.common.errors import InvalidArgument, SeawallError
from services.common.openai_logprobs import chat_logprobs
from services.common.sampling_params import FinishReason
from services.scheduler.chat_tools import ToolCalling
from services.scheduler.http_io import REQUEST_ID_HEADER, error_response, json_body, request_id, streaming
from services.scheduler.responses_api import (
    OutputItems,
    ResponsesRequest,
    ResponseStore,
    StoredResponse,
    list_page,
    output_messages,
    parse_request,
    status_of,
)
from services.scheduler.responses_background import BackgroundRun, BackgroundRuns
from services.scheduler.tracked import Delta, TrackedRequest

if TYPE_CHECKING:
    from services.scheduler.http_api import OpenAIApi


class ResponsesEndpoint:
    def __init__(self, api: OpenAIApi, tasks: TaskGroup) -> None:
        """``tasks``: where background responses run (the scheduler process's task group)."""
        self.api = api
        self.store = ResponseStore()
        self.background = BackgroundRuns(tasks)

    async def create(self, request: Request) -> Response:
        """OpenAI's Responses API, run as the chat request it translates to (services/scheduler/responses_api.py)."""
        try:
            body = await json_body(request)
            # The client's X-Request-Id names the request in the mesh (its traces, Abort) and the response, as
            # vLLM names it (resp_ID).
            base = request_id(request)
            previous, rid = body.get("previous_response_id"), f"resp_{base}"
            stream, _ = streaming(body)
            req = parse_request(body, self.store.get(previous) if previous is not None else None, rid)
            prompt, params, _, tools = self.api.chat_request(req.chat)
            (tracked,) = self.api.submit(request, {"session_id": req.session_id, "priority": body.get("priority"),
                                                   "model": body.get("model"), "cache_salt": body.get("cache_salt")},
                                         [prompt], params, 1, base)
        except SeawallError as exc:
            return error_response(exc)
        headers = {REQUEST_ID_HEADER: base}
        head = {"id": rid, "object": "response", "created_at": int(time.time()),
                "model": self.api.served_name(body), **req.echoed}
        if req.background:
            return self._start_background(head, req, tracked, tools, stream=stream, headers=headers)
        if stream:
            return StreamingResponse(_sse(self._response_events(head, req, tracked, tools)),
                                     media_type="text/event-stream", headers=headers)
        (out,) = await self.api.collect(request, [tracked])
        thought, text = self.api.split_reasoning(tracked, out.text)
        message, finish = tools.message(text, out.finish_reason) if tools else ({"content": text}, out.finish_reason)
        items = OutputItems()
        calls = [{"index": k, **c} for k, c in enumerate(message.get("tool_calls") or [])]
        items.feed({"reasoning": thought, "content": message["content"], "tool_calls": calls},
                   self._output_logprobs(req, out))
        items.close(_item_status(finish))
        return JSONResponse(self._finish_response(head, req, tracked, items, finish, out.detail, out.error),
                            headers=self.api.reply_headers([tracked], base))

    def _start_background(self, head: dict, req: ResponsesRequest, tracked: TrackedRequest,
                          tools: ToolCalling | None, stream: bool, headers: dict[str, str]) -> Response:
        """Answers at once with the queued response (or its event stream, which the client may leave and come
        back to); the response runs on, stored, until it ends or is cancelled."""
        queued = _snapshot(head, "queued")
        stored = StoredResponse(queued, req.messages, req.session_id, req.input_items)
        self.store.put(stored)

        async def events() -> AsyncIterator[dict]:
            async for e in self._response_events(head, req, tracked, tools):
                if e["type"] == "response.in_progress":
                    stored.response = e["response"]  # what a poll sees until the final response replaces it
                yield e

        def failed(run: BackgroundRun, exc: Exception) -> dict:
            self.api.frontend.mesh.abort(tracked.request_id, FinishReason.ERROR)
            response = {**_snapshot(head, "failed"), "error": {"code": "server_error", "message": str(exc)}}
            stored.response = response
            self.store.put(stored)
            return {"type": "response.failed", "response": response, "sequence_number": len(run.events)}

        run = self.background.start(head["id"], tracked.request_id, events(), failed)
        if stream:
            return StreamingResponse(_sse(run.follow()), media_type="text/event-stream", headers=headers)
        return JSONResponse(queued, headers=headers)

    async def _response_events(self, head: dict, req: ResponsesRequest, tracked: TrackedRequest,
                               tools: ToolCalling | None) -> AsyncIterator[dict]:
        """The Responses API's typed events: created, the output items' added / delta / done events as the
        tokens arrive, then completed (or incomplete, failed) with the whole response. A background response is
        queued first, and in progress from its first token on."""
        seq = itertools.count()

        def event(e: dict) -> dict:
            return {**e, "sequence_number": next(seq)}

        status = "queued" if req.background else "in_progress"
        yield event({"type": "response.created", "response": _snapshot(head, status)})
        yield event({"type": f"response.{status}", "response": _snapshot(head, status)})
        items, calls = OutputItems(), tools.stream() if tools else None
        thoughts = self.api.reasoning_stream(tracked)
        finish, detail, error = None, "", None
        async for ready in self.api.stream([tracked]):
            if status == "queued":
                status = "in_progress"
                yield event({"type": "response.in_progress", "response": _snapshot(head, status)})
            for _, merged in ready:
                thought = ""
                if thoughts is not None:
                    thought, answer = thoughts.feed(merged.text, final=merged.finish_reason is not None)
                    merged = replace(merged, text=answer)
                delta, finish = calls.delta(merged) if calls else ({"content": merged.text}, merged.finish_reason)
                delta = {**delta, "reasoning": thought}
                detail, error = merged.detail or detail, merged.error or error
                for e in items.feed(delta, self._output_logprobs(req, merged)):
                    yield event(e)
        for e in items.close(_item_status(finish)):
            yield event(e)
        response = self._finish_response(head, req, tracked, items, finish, detail, error)
        kind = {"completed": "completed", "incomplete": "incomplete"}.get(response["status"], "failed")
        yield event({"type": f"response.{kind}", "response": response})

    def _output_logprobs(self, req: ResponsesRequest, delta: Delta) -> list[dict] | None:
        return chat_logprobs(delta.logprobs, self.api.texts)["content"] if req.logprobs else None

    def _finish_response(self, head: dict, req: ResponsesRequest, tracked: TrackedRequest, items: OutputItems,
                         finish: str | None, detail: str, error: SeawallError | None) -> dict:
        """The whole response object, kept for previous_response_id and GET when the request asked to store it."""
        status, incomplete = status_of(finish)
        r = tracked.request
        n_in, n_out = len(r.prompt_token_ids), len(r.output_token_ids)
        # OpenAI's codes: a request that cannot go on as asked is an invalid prompt, anything else the server's.
        code = "invalid_prompt" if isinstance(error, InvalidArgument) else "server_error"
        response = {**head, "status": status, "completed_at": int(time.time()), "incomplete_details": incomplete,
                    "error": {"code": code, "message": detail} if status == "failed" else None,
                    "output": items.items,
                    "usage": {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": r.num_prefix_hit_tokens},
                              "output_tokens": n_out,
                              "output_tokens_details": {"reasoning_tokens": self.api.reasoning_tokens(tracked)},
                              "total_tokens": n_in + n_out}}
        if req.store:
            self.store.put(StoredResponse(response, req.messages + output_messages(items.items), req.session_id,
                                          req.input_items))
        return response

    async def stored(self, request: Request) -> Response:
        """``GET`` or ``DELETE /v1/responses/{id}`` of a stored response; ``GET ...?stream=true`` follows a
        background response's events (``starting_after``: the sequence number of the last one already seen)."""
        rid = request.path_params["response_id"]
        try:
            stored = self.store.get(rid)
            if request.method == "DELETE":
                if self.background.running(rid) is not None:
                    raise InvalidArgument(f"response {rid!r} is still {stored.response['status']}: cancel it first "
                                          f"(POST /v1/responses/{rid}/cancel)")
                self.store.delete(rid)
                self.background.forget(rid)
                return JSONResponse({"id": rid, "object": "response", "deleted": True})
            query = request.query_params
            if query.get("stream", "false").lower() not in ("true", "1"):
                return JSONResponse(stored.response)
            if not stored.response.get("background"):
                raise InvalidArgument(f"response {rid!r} was not created with background: true, so it cannot be "
                                      "streamed again; GET it without stream")
            after = _starting_after(query.get("starting_after"))
            return StreamingResponse(_sse(self.background.events(rid).follow(after)), media_type="text/event-stream")
        except SeawallError as exc:
            return error_response(exc)

    async def cancel(self, request: Request) -> Response:
        """``POST /v1/responses/{id}/cancel``: stops a background response, which ends ``cancelled`` with the
        output it had; cancelling one that already was returns it again."""
        rid = request.path_params["response_id"]
        try:
            stored = self.store.get(rid)
            run = self.background.running(rid)
            if run is not None:
                self.api.frontend.mesh.abort(run.request_id, FinishReason.ABORT)
                await run.finished.wait()
                return JSONResponse(self.store.get(rid).response)
            status = stored.response["status"]
            if not stored.response.get("background"):
                raise InvalidArgument(f"response {rid!r} was not created with background: true; only background "
                                      "responses can be cancelled")
            if status != "cancelled":
                raise InvalidArgument(f"response {rid!r} has already ended ({status}); there is nothing to cancel")
            return JSONResponse(stored.response)
        except SeawallError as exc:
            return error_response(exc)

    async def input_items(self, request: Request) -> Response:
        """``GET /v1/responses/{id}/input_items``: the items a stored response was sent as input, a page at a time."""
        try:
            stored = self.store.get(request.path_params["response_id"])
            return JSONResponse(list_page(stored.input_items, dict(request.query_params)))
        except SeawallError as exc:
            return error_response(exc)


def _snapshot(head: dict, status: str) -> dict:
    """The response object before its output: what the first events and a poll of a running response show."""
    return {**head, "status": status, "output": [], "usage": None, "incomplete_details": None, "error": None}


async def _sse(events: AsyncIterator[dict]) -> AsyncIterator[str]:
    async for e in events:
        yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"


def _starting_after(value: str | None) -> int:
    if value is None:
        return -1
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"starting_after must be an event's sequence number (an integer), got {value!r}") from None


def _item_status(finish: str | None) -> str:
    """An output item is complete unless the reply was cut short."""
    return "completed" if status_of(finish)[0] == "completed" else "incomplete"
