"""OpenAI's Responses API (``/v1/responses``) on the chat path, as plain data (no I/O).

A Responses request is translated into the chat request that runs it: ``instructions`` become a system
message, ``input`` items chat messages (``function_call`` items an assistant turn's ``tool_calls``,
``function_call_output`` items ``tool`` turns), ``tools`` and ``tool_choice`` the chat API's shapes,
``text.format`` a ``response_format``, ``max_output_tokens`` ``max_completion_tokens``. The reply comes back as
Responses output items, built by one translator (``OutputItems``) from the chat deltas the chat path
produces: the whole reply at once, or piece by piece with the streaming events.

``previous_response_id`` continues a stored response (``store``, default true as in OpenAI's API; kept in a
bounded in-memory ``ResponseStore``): its conversation and output come first, without its ``instructions``
(OpenAI drops them too). A stored conversation is a Seawall session named after its first response, so each
turn's KV is kept in the kvcache service for the next one (DualPath, services/scheduler/dual_path.py): agentic
clients of this API continue nearly every response. ``session_id`` names the session instead.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import InvalidArgument, NotFound
from services.scheduler.chat_tools import join_text_parts

# Responses kept for previous_response_id and GET; the oldest go first. A stored response is its messages and
# its response object, a few KB for a chat-sized conversation.
STORE_CAPACITY = 4096

# Fields that shape the response, read here; the rest (vLLM's sampling extras: top_k, seed, stop...) go to
# the chat request, which refuses what it does not know.
_HANDLED = frozenset({
    "model", "input", "instructions", "previous_response_id", "store", "stream", "stream_options",
    "max_output_tokens", "tools", "tool_choice", "parallel_tool_calls", "text", "include", "top_logprobs",
    "metadata", "user", "truncation", "reasoning", "background", "service_tier", "prompt_cache_key",
    "safety_identifier", "max_tool_calls", "session_id", "temperature", "top_p", "priority",
})
# Chat fields whose Responses spelling differs: refused with the one to send.
_CHAT_SPELLINGS = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens":
                   "max_output_tokens", "response_format": "text.format", "logprobs":
                   "include [\"message.output_text.logprobs\"]", "n": "one request per response"}
_LOGPROBS = "message.output_text.logprobs"
_TEXT_PARTS = ("input_text", "output_text", "text")
_ROLES = ("user", "system", "developer", "assistant")
_RUNNING = ("queued", "in_progress")  # a background response's statuses before it ends


@dataclass
class StoredResponse:
    """A response kept for ``previous_response_id`` and ``GET /v1/responses/{id}``."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]  # the conversation including this reply, without instructions
    session_id: str
    input_items: list[dict[str, Any]] = field(default_factory=list)  # this request's input, as items with ids


@dataclass
class ResponsesRequest:
    """A Responses request as what runs: ``chat`` is the chat request's body."""

    chat: dict[str, Any]
    messages: list[dict[str, Any]]  # the conversation sent to the model, without instructions
    echoed: dict[str, Any]  # request fields the response object repeats
    logprobs: bool
    store: bool
    session_id: str
    input_items: list[dict[str, Any]] = field(default_factory=list)
    background: bool = False  # runs past the request that created it (responses_background.py)


def parse_request(body: dict[str, Any], previous: StoredResponse | None, response_id: str) -> ResponsesRequest:
    """Translates a ``/v1/responses`` body (``previous``: the stored response it continues, if it names one;
    ``response_id``: the id its response will have); raises InvalidArgument saying what to send instead of what
    cannot be served."""
    for key, instead in _CHAT_SPELLINGS.items():
        if key in body:
            raise InvalidArgument(f"{key!r} is a chat completions field; the Responses API takes {instead}")
    _refuse_unsupported(body)
    _check_echoed(body)
    messages = _history(previous) + input_messages(body.get("input"))
    if not messages:
        raise InvalidArgument("input holds only reasoning items, which give the model nothing to answer: send a "
                              "message (or function_call_output) item too")
    system = body.get("instructions")
    if system is not None and not isinstance(system, str):
        raise InvalidArgument(f"instructions must be a string, got {system!r}")
    chat: dict[str, Any] = {k: v for k, v in body.items() if k not in _HANDLED}
    chat["messages"] = ([{"role": "system", "content": system}] if system else []) + messages
    for key in ("model", "temperature", "top_p", "parallel_tool_calls"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    effort = _reasoning_effort(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    # Checked even when falsy: a {} sent as tools is no list, not "no tools", and the response repeats it.
    tools = _chat_tools(body["tools"]) if body.get("tools") is not None else []
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    text_format = _response_format(body.get("text"))
    if text_format is not None:
        chat["response_format"] = text_format
    logprobs = _logprobs(body, chat)
    store, background = _storage(body)
    echoed = {
        "instructions": system, "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {}, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"), "store": store, "background": background,
        "temperature": body.get("temperature"), "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or ("auto" if body.get("tools") else "none"),
        "tools": body.get("tools") or [], "top_logprobs": body.get("top_logprobs"), "top_p": body.get("top_p"),
        "truncation": "disabled", "user": body.get("user"),
    }
    session = _session(body, previous) or (response_id if store else "")
    return ResponsesRequest(chat, messages, echoed, logprobs, store, session, input_items(body["input"]), background)


def _history(previous: StoredResponse | None) -> list[dict[str, Any]]:
    """The conversation a continuation starts from; a background response still running has none yet."""
    if previous is None:
        return []
    if previous.response["status"] in _RUNNING:
        rid = previous.response["id"]
        raise InvalidArgument(f"previous_response_id {rid!r} is still {previous.response['status']}: continue it "
                              f"once it has ended (poll GET /v1/responses/{rid})")
    return previous.messages


def _storage(body: dict[str, Any]) -> tuple[bool, bool]:
    """``store`` (default true) and ``background`` (default false; only with store)."""
    store, background = body.get("store", True), body.get("background") or False
    for key, value in (("store", store), ("background", background)):
        if not isinstance(value, bool):
            raise InvalidArgument(f"{key} must be true or false, got {value!r}")
    if background and not store:
        raise InvalidArgument("a background response is stored, to be polled and cancelled: leave store out (or "
                              "true) with background true")
    return store, background


def _reasoning_effort(reasoning: Any) -> str | None:
    """``reasoning``: its ``effort`` goes to the chat request (the template's ``reasoning_effort``). A
    ``summary`` is accepted, but none is written: the reasoning item carries the thought itself."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict) or set(reasoning) - {"effort", "summary", "generate_summary"}:
        raise InvalidArgument(f"reasoning must be {{\"effort\": ..., \"summary\": ...}}, got {reasoning!r}")
    summary = reasoning.get("summary", reasoning.get("generate_summary"))
    if summary not in (None, "auto", "concise", "detailed"):
        raise InvalidArgument(f"reasoning.summary must be auto, concise or detailed, got {summary!r}")
    return reasoning.get("effort")


def _logprobs(body: dict[str, Any], chat: dict[str, Any]) -> bool:
    """Whether the output text carries logprobs (``include``), asking the chat request for them if so."""
    include = body.get("include") or []
    if not (isinstance(include, list) and all(i == _LOGPROBS for i in include)):
        raise InvalidArgument(f"include may list only {_LOGPROBS!r} here (no hosted tools or reasoning), "
                              f"got {include!r}")
    if _LOGPROBS in include:
        chat["logprobs"] = True
        chat["top_logprobs"] = body.get("top_logprobs") or 0
        return True
    if body.get("top_logprobs"):
        raise InvalidArgument(f"top_logprobs needs include [{_LOGPROBS!r}]")
    return False


def _session(body: dict[str, Any], previous: StoredResponse | None) -> str:
    """The request's session: its ``session_id``, else the conversation's it continues."""
    session = body.get("session_id") or (previous.session_id if previous is not None else "")
    if not isinstance(session, str):
        raise InvalidArgument("session_id must be a string")
    return session


def _check_echoed(body: dict[str, Any]) -> None:
    """The fields the response object repeats as they were sent, which a client's SDK reads back typed."""
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise InvalidArgument(f"metadata must be an object of string values, got {metadata!r}")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise InvalidArgument(f"user must be a string, got {body['user']!r}")
    if body.get("parallel_tool_calls") is not None and not isinstance(body["parallel_tool_calls"], bool):
        raise InvalidArgument(f"parallel_tool_calls must be true or false, got {body['parallel_tool_calls']!r}")


def _refuse_unsupported(body: dict[str, Any]) -> None:
    if body.get("truncation") not in (None, "disabled"):
        raise InvalidArgument("truncation \"auto\" is not supported: a conversation longer than the context is "
                              "refused; send \"disabled\" (the default)")
    for key in ("conversation", "prompt"):
        if body.get(key) is not None:
            raise InvalidArgument(f"{key!r} (stored on OpenAI's side) is not supported: send input, and "
                                  "previous_response_id to continue a response")


def input_messages(items: Any) -> list[dict[str, Any]]:
    """``input`` (a string, or a list of message, ``function_call`` and ``function_call_output`` items) as chat
    messages; consecutive function calls join one assistant turn, as the chat API carries them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise InvalidArgument("input must be a string or a non-empty list of items (messages, function_call, "
                              "function_call_output)")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidArgument(f"{where} must be an object, got {item!r}")
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in _ROLES:
                raise InvalidArgument(f"{where}.role must be one of {', '.join(_ROLES)}, got {item.get('role')!r}")
            out.append({"role": item["role"], "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                        "content": _text(item.get("output"), where, "output")})
        elif kind != "reasoning":  # a reasoning item carries nothing a non-reasoning model's template renders
            raise InvalidArgument(f"{where}: items of type {kind!r} are not supported (message, function_call, "
                                  "function_call_output)")
    return out


_ITEM_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def input_items(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` (already read by ``input_messages``) as the items ``GET .../input_items`` lists: each with an id
    (the client's, else a new one) and a message's text as content parts."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    out = []
    for item in items:
        kind = item.get("type", "message")
        entry = {"id": item.get("id") or f"{_ITEM_ID_PREFIX[kind]}_{uuid.uuid4().hex}", **item, "type": kind}
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item["role"] == "assistant" else "input_text"
            entry["content"] = [{"type": part, "text": item["content"]}]
        out.append(entry)
    return out


def list_page(items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """One page of ``items`` as OpenAI lists them (``limit`` 1-100, default 20; ``order`` ``desc``, the
    default, or ``asc``; ``after`` an item id: the items that follow it in that order)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidArgument(f"order must be \"asc\" or \"desc\", got {order!r}")
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise InvalidArgument(f"limit must be an integer from 1 to 100, got {query.get('limit')!r}")
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if "after" in query:
        ids = [item["id"] for item in ordered]
        if query["after"] not in ids:
            raise InvalidArgument(f"after names no input item of this response: {query['after']!r}")
        start = ids.index(query["after"]) + 1
    page = ordered[start:start + limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ordered)}


def _text(content: Any, where: str, key: str = "content") -> str:
    """A message's content (``key``: the item's field that holds it): a string, or text parts joined with
    newlines (as the chat path joins them)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return join_text_parts(content, where, _TEXT_PARTS)
    raise InvalidArgument(f"{where}.{key} must be a string or a list of input_text parts, got {content!r}")


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidArgument(f"{where} ({item.get('type')}) needs a string {key!r}, got {value!r}")
    return value


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidArgument(f"tools must be a list of {{\"type\": \"function\", \"name\": ...}}, got {tools!r}")
    out = []
    for i, tool in enumerate(tools):
        if not (isinstance(tool, dict) and tool.get("type") == "function"):
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise InvalidArgument(f"tools[{i}]: only function tools are supported (no hosted tools), got {kind!r}")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidArgument(f"tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", "
                          f"\"name\": ...}}, got {choice!r}")


def _response_format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as the chat API's ``response_format`` (None: free text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InvalidArgument(f"text must be an object such as {{\"format\": {{\"type\": \"json_object\"}}}}, got "
                              f"{text!r}")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise InvalidArgument("text.format json_schema needs \"schema\": {...} (and a \"name\")")
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise InvalidArgument(f"text.format type must be text, json_object or json_schema, got {fmt!r}")


class OutputItems:
    """The reply as Responses output items, fed the chat path's deltas (``{"reasoning": ..., "content": ...,
    "tool_calls": [...]}``); each ``feed`` and ``close`` returns the streaming events it makes (without sequence
    numbers). Thinking comes first, as a reasoning item."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._thought: dict[str, Any] | None = None  # the open reasoning item's reasoning_text part
        self._text: dict[str, Any] | None = None  # the open message item's output_text part
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its function_call item
        self._open: list[dict[str, Any]] = []

    def feed(self, delta: dict[str, Any], logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.get("reasoning"):
            if self._thought is None:
                self._thought = {"type": "reasoning_text", "text": ""}
                events += self._add({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [],
                                     "content": [self._thought], "status": "in_progress"})
            self._thought["text"] += delta["reasoning"]
            events.append({"type": "response.reasoning_text.delta", **self._where(self._open[-1]), "content_index": 0,
                           "delta": delta["reasoning"]})
        if delta.get("content"):
            if self._text is None:
                events += self._close_reasoning("completed")
                events += self._open_message()
            item = self._open[-1]
            self._text["text"] += delta["content"]
            self._text["logprobs"] += logprobs or []
            events.append({"type": "response.output_text.delta", **self._where(item), "content_index": 0,
                           "delta": delta["content"], "logprobs": logprobs or []})
        for call in delta.get("tool_calls") or []:
            fn = call.get("function", {})
            item = self._calls.get(call["index"])
            if item is None:
                # Items are done one after another, as OpenAI streams them: the calls before this one are whole.
                events += (self._close_reasoning("completed") + self._close_message("completed")
                           + self._close_calls("completed"))
                item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                        "name": fn["name"], "arguments": "", "status": "in_progress"}
                self._calls[call["index"]] = item
                events += self._add(item)
            if fn.get("arguments"):
                item["arguments"] += fn["arguments"]
                events.append({"type": "response.function_call_arguments.delta", **self._where(item),
                               "delta": fn["arguments"]})
        return events

    def close(self, status: str) -> list[dict[str, Any]]:
        """Ends every open item (``status``: completed or incomplete); a reply of nothing is an empty message."""
        events = [] if self.items else self._open_message()
        return events + self._close_reasoning(status) + self._close_message(status) + self._close_calls(status)

    def _open_message(self) -> list[dict[str, Any]]:
        self._text = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item = {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "in_progress", "role": "assistant",
                "content": []}
        events = self._add(item)
        item["content"].append(self._text)
        events.append({"type": "response.content_part.added", **self._where(item), "content_index": 0,
                       "part": {**self._text, "logprobs": []}})
        return events

    def _close_reasoning(self, status: str) -> list[dict[str, Any]]:
        if self._thought is None:
            return []
        item, part = next(i for i in self._open if i["type"] == "reasoning"), self._thought
        self._thought = None
        item["status"] = status
        return [{"type": "response.reasoning_text.done", **self._where(item), "content_index": 0, "text": part["text"]},
                *self._done(item)]

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        if self._text is None:
            return []
        item, part = next(i for i in self._open if i["type"] == "message"), self._text
        self._text = None
        item["status"] = status
        return [{"type": "response.output_text.done", **self._where(item), "content_index": 0, "text": part["text"],
                 "logprobs": part["logprobs"]},
                {"type": "response.content_part.done", **self._where(item), "content_index": 0, "part": dict(part)},
                *self._done(item)]

    def _close_calls(self, status: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for item in [i for i in self._open if i["type"] == "function_call"]:
            item["status"] = status
            events.append({"type": "response.function_call_arguments.done", **self._where(item),
                           "name": item["name"], "arguments": item["arguments"]})
            events += self._done(item)
        return events

    def _add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.items.append(item)
        self._open.append(item)
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                 "item": {**item, "content": []} if "content" in item else dict(item)}]

    def _done(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self._open.remove(item)
        return [{"type": "response.output_item.done", "output_index": self.items.index(item), "item": item}]

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.items.index(item)}


def status_of(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    """A response's status and ``incomplete_details`` from its chat finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "abort":
        return "cancelled", None
    if finish_reason == "error":
        return "failed", None
    return "completed", None


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reply's items as the chat messages a continuation starts from."""
    return input_messages([{k: v for k, v in item.items() if k != "id"} if item["type"] != "message" else
                           {"role": "assistant", "content": item["content"]} for item in items])


@dataclass
class ResponseStore:
    """Stored responses by id, the least recently used dropped past ``capacity``."""

    capacity: int = STORE_CAPACITY
    _items: OrderedDict[str, StoredResponse] = field(default_factory=OrderedDict)

    def put(self, stored: StoredResponse) -> None:
        self._items[stored.response["id"]] = stored
        self._items.move_to_end(stored.response["id"])
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: Any) -> StoredResponse:
        stored = self._items.get(response_id) if isinstance(response_id, str) else None
        if stored is None:
            raise NotFound(f"no stored response {response_id!r}: it was sent with store false, evicted (this "
                           f"server keeps the last {self.capacity}), or never existed")
        self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._items[response_id]
