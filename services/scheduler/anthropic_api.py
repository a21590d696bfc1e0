"""Anthropic's Messages API (``/v1/messages``) on the chat path, as plain data (no I/O).

Agentic coding clients (Claude Code, the Anthropic SDKs) speak this API; pointed at Seawall they run on the
chat path with its template, tool-call and reasoning parsers. A Messages request is translated into the chat
request that runs it: ``system`` becomes a system message; a user turn's ``tool_result`` blocks become ``tool``
messages (before the turn's text, where Anthropic puts them); an assistant turn's ``tool_use`` blocks its
``tool_calls`` and its ``thinking`` blocks its ``reasoning_content`` (templates that render past thoughts get
them); ``tools`` (``input_schema``) and ``tool_choice`` (``auto``, ``any``, ``tool``, ``none``) the chat API's
shapes; ``stop_sequences`` ``stop``; ``output_config.format`` (or the older ``output_format``) a JSON-schema
``response_format`` and ``output_config.effort`` the template's ``reasoning_effort`` (``xhigh`` and ``max``
as ``high``, the most templates know); ``thinking`` the
template's ``enable_thinking`` (``budget_tokens`` is checked as Anthropic checks it, but the thought is
bounded by ``max_tokens`` alone; ``display: "omitted"`` leaves thinking blocks out of the reply). The reply comes back as content blocks (``thinking``, ``text``,
``tool_use``), built by one translator (``ContentBlocks``) from the chat path's deltas: the whole reply at
once, or piece by piece as the streaming events. A conversation that ends with the assistant's text is a
prefill: the reply continues that text (vLLM's ``continue_final_message``).

Usage follows Anthropic's accounting: ``input_tokens`` are the prompt tokens not read from the prefix cache,
``cache_read_input_tokens`` those that were. Errors take Anthropic's shape, ``{"type": "error", "error":
{"type", "message"}}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import (
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SeawallError,
    Unauthenticated,
    Unavailable,
)
from services.scheduler.chat_tools import join_text_parts

# Fields read here; anything else is refused, naming it (a field silently dropped changes what the client
# gets without telling it).
# ``cache_control`` is accepted and needs nothing: Seawall caches every prompt's prefix blocks.
_FIELDS = frozenset({"model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream",
                     "temperature", "top_k", "top_p", "tools", "tool_choice", "thinking", "service_tier",
                     "output_config", "output_format", "cache_control", "session_id", "priority"})
# vLLM's sampling extensions, which clients send beside Anthropic's fields (the SDKs' ``extra_body``).
_SAMPLING_EXTRAS = ("min_p", "seed", "stop_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty",
                    "ignore_eos", "min_tokens", "logit_bias", "allowed_token_ids", "bad_words", "cache_salt",
                    "structured_outputs")
# Anthropic's server-side features: refused with what to do instead.
_SERVER_SIDE = {"container": "code execution containers", "mcp_servers": "MCP servers (connect them client-side)",
                "context_management": "server-side context editing"}
_TEXT = ("text",)


@dataclass
class MessagesRequest:
    """A Messages request as what runs: ``chat`` is the chat request's body."""

    chat: dict[str, Any]
    stream: bool
    show_thinking: bool = True


def parse_request(body: dict[str, Any], counting: bool = False) -> MessagesRequest:
    """Translates a ``/v1/messages`` body (``counting``: a ``/v1/messages/count_tokens`` body, which has no
    ``max_tokens``); raises InvalidArgument saying what to send instead of what cannot be served."""
    _check_fields(body)
    chat: dict[str, Any] = {"messages": _system(body.get("system")) + chat_messages(body.get("messages"))}
    final = chat["messages"][-1]
    if final["role"] == "assistant" and final.get("content") and not final.get("tool_calls"):
        # Prefill: the reply continues the assistant's text (the reply holds only what follows it).
        chat.update(continue_final_message=True, add_generation_prompt=False)
    for key in ("model", "temperature", "top_p", "top_k", "session_id", "priority", *_SAMPLING_EXTRAS):
        if body.get(key) is not None:
            chat[key] = body[key]
    if not counting:
        if body.get("max_tokens") is None:
            raise InvalidArgument("max_tokens is required: the most tokens the reply may have, as in Anthropic's API")
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences") is not None:
        stops = body["stop_sequences"]
        if not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)):
            raise InvalidArgument(f"stop_sequences must be a list of non-empty strings, got {stops!r}")
        chat["stop"] = stops
    _tools(body, chat)
    thinking, show = _thinking(body.get("thinking"), body.get("max_tokens"))
    if thinking is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": thinking}
    _output(body, chat)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidArgument(f"stream must be true or false, got {stream!r}")
    return MessagesRequest(chat, stream, show)


def _check_fields(body: dict[str, Any]) -> None:
    for key, what in _SERVER_SIDE.items():
        if body.get(key) is not None:
            raise InvalidArgument(f"{key!r}: {what} are not supported here")
    unknown = sorted(set(body) - _FIELDS - set(_SAMPLING_EXTRAS))
    if unknown:
        raise InvalidArgument(f"unknown field(s) {', '.join(map(repr, unknown))}; the Messages API takes "
                              f"{', '.join(sorted(_FIELDS))} and vLLM's {', '.join(_SAMPLING_EXTRAS)}")
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and set(metadata) <= {"user_id"}):
        raise InvalidArgument(f"metadata may hold only user_id, got {metadata!r}")
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise InvalidArgument(f"service_tier must be \"auto\" or \"standard_only\", got {body['service_tier']!r}")


def _tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """``tools`` and ``tool_choice`` into the chat body."""
    # Checked even when falsy: a {} sent as tools is no list, not "no tools".
    tools = _chat_tools(body["tools"]) if body.get("tools") is not None else []
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        choice, parallel = _chat_tool_choice(body["tool_choice"], bool(tools))
        chat["tool_choice"] = choice
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel


def _system(system: Any) -> list[dict[str, Any]]:
    """``system``: a string or a list of text blocks (``cache_control`` accepted: Seawall caches every prefix)."""
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, list):
        return [{"role": "system", "content": join_text_parts(system, "system", _TEXT)}]
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    raise InvalidArgument(f"system must be a string or a list of text blocks, got {system!r}")


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` (user and assistant turns of a string or content blocks) as chat messages."""
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages must be a non-empty list of {\"role\": \"user\" or \"assistant\", "
                              "\"content\": ...}")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise InvalidArgument(f"{where} must be an object with role \"user\" or \"assistant\", got {message!r}")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            out += (_user_turn if message["role"] == "user" else _assistant_turn)(content, where)
        else:
            raise InvalidArgument(f"{where}.content must be a string or a list of content blocks, got {content!r}")
    return out


def _user_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn's tool results as ``tool`` messages, then its text (if any) as a user message."""
    if not blocks:  # Anthropic refuses it too; a conversation of it alone would have no message to run
        raise InvalidArgument(f"{where}.content is empty: a user turn needs a text or tool_result block")
    out, texts = [], []
    for k, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise InvalidArgument(f"{where}.content[{k}]: a tool_result needs the string tool_use_id it answers")
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                        "content": _result_text(block.get("content"), f"{where}.content[{k}]")})
        elif kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        else:
            raise InvalidArgument(f"{where}.content[{k}]: a user turn may hold text and tool_result blocks (this "
                                  f"model reads text), got {kind or block!r}")
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return join_text_parts(content, where, _TEXT)
    raise InvalidArgument(f"{where}.content must be a string or a list of text blocks, got {content!r}")


def _assistant_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """An assistant turn's text, tool calls and thought as one chat message."""
    texts, calls, thoughts = [], [], []
    for k, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            if not (isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
                    and isinstance(block.get("input"), dict)):
                raise InvalidArgument(f"{where}.content[{k}]: a tool_use needs a string id and name and an input "
                                      f"object, got {block!r}")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])
        elif kind != "redacted_thinking":  # another server's encrypted thought: nothing this model can read
            raise InvalidArgument(f"{where}.content[{k}]: an assistant turn may hold text, tool_use and thinking "
                                  f"blocks, got {kind or block!r}")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    return [message]


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidArgument(f"tools must be a list of {{\"name\": ..., \"input_schema\": {{...}}}}, got {tools!r}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise InvalidArgument(f"tools[{i}]: only client tools (a name and an input_schema) are supported, not "
                                  f"Anthropic's server tools, got {kind!r}")
        if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
            raise InvalidArgument(f"tools[{i}] needs a string name and an input_schema object, got {tool!r}")
        fn = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(choice: Any, has_tools: bool) -> tuple[Any, bool | None]:
    """``tool_choice`` as the chat API's, and its ``parallel_tool_calls`` (None: as the chat API defaults)."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none") or (kind == "tool" and not isinstance(choice.get("name"), str)):
        raise InvalidArgument(f"tool_choice must be {{\"type\": \"auto\"}}, {{\"type\": \"any\"}}, {{\"type\": "
                              f"\"none\"}} or {{\"type\": \"tool\", \"name\": ...}}, got {choice!r}")
    if kind != "none" and not has_tools:
        raise InvalidArgument(f"tool_choice {kind!r} needs tools")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise InvalidArgument(f"tool_choice.disable_parallel_tool_use must be true or false, got {disable!r}")
    chat = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or {
        "type": "function", "function": {"name": choice["name"]}}
    return chat, None if disable is None else not disable


_THINKING = ("enabled", "disabled", "adaptive", "between_tools")
# Anthropic's efforts as the chat templates' reasoning_effort (gpt-oss's knows low, medium and high).
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def _thinking(thinking: Any, max_tokens: Any) -> tuple[bool | None, bool]:
    """``thinking`` as the template's ``enable_thinking`` (None: the template's default), and whether the
    reply shows the thought (``display``)."""
    if thinking is None:
        return None, True
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in _THINKING:
        raise InvalidArgument(f"thinking.type must be one of {', '.join(_THINKING)}, got {thinking!r}")
    display = thinking.get("display")
    if display not in (None, "summarized", "omitted"):
        raise InvalidArgument(f"thinking.display must be \"summarized\" or \"omitted\", got {display!r}")
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1024:
            raise InvalidArgument(f"thinking.budget_tokens must be an integer >= 1024, got {budget!r}")
        if isinstance(max_tokens, int) and budget >= max_tokens:
            raise InvalidArgument(f"thinking.budget_tokens ({budget}) must be less than max_tokens ({max_tokens})")
    return kind != "disabled", display != "omitted"


def _output(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """``output_config`` (``effort``, ``format``) and the older ``output_format`` into the chat body."""
    config = body.get("output_config")
    if config is not None and not (isinstance(config, dict) and set(config) <= {"effort", "format"}):
        raise InvalidArgument(f"output_config may hold effort and format, got {config!r}")
    config = config or {}
    effort = config.get("effort")
    if effort is not None:
        if effort not in _EFFORTS:
            raise InvalidArgument(f"output_config.effort must be one of {', '.join(_EFFORTS)}, got {effort!r}")
        chat["reasoning_effort"] = _EFFORTS[effort]
    fmt = config.get("format", body.get("output_format"))
    if fmt is None:
        return
    if not (isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict)):
        raise InvalidArgument(f"output_config.format must be {{\"type\": \"json_schema\", \"schema\": {{...}}}}, "
                              f"got {fmt!r}")
    chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


@dataclass
class ContentBlocks:
    """The reply as content blocks, fed the chat path's deltas (``{"reasoning": ..., "content": ...,
    "tool_calls": [...]}``); ``feed`` and ``close`` return the streaming events they make. A block is open
    until one of another kind begins: thinking, then text, then tool calls, as the chat path produces them."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    _arguments: dict[int, str] = field(default_factory=dict)  # block index -> a tool call's arguments so far
    _calls: dict[int, int] = field(default_factory=dict)  # chat tool-call index -> block index
    _open: int | None = None

    def feed(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.get("reasoning"):
            events += self._extend("thinking", {"type": "thinking_delta", "thinking": delta["reasoning"]})
        if delta.get("content"):
            events += self._extend("text", {"type": "text_delta", "text": delta["content"]})
        for call in delta.get("tool_calls") or []:
            fn = call.get("function", {})
            index = self._calls.get(call["index"])
            if index is None:
                events += self._start({"type": "tool_use", "id": call["id"], "name": fn["name"], "input": {}})
                index = self._calls[call["index"]] = self._open
                self._arguments[index] = ""
            if fn.get("arguments"):
                self._arguments[index] += fn["arguments"]
                events.append(_delta(index, {"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return events

    def close(self) -> list[dict[str, Any]]:
        """Ends the open block; every tool call's input is its arguments read as JSON (a call cut short by
        max_tokens is no JSON object: its input stays empty, and its input_json_delta events carried what the
        model wrote)."""
        events = self._stop()
        for index, arguments in self._arguments.items():
            try:
                value = json.loads(arguments) if arguments else {}
            except ValueError:
                value = {}
            self.blocks[index]["input"] = value if isinstance(value, dict) else {}
        return events

    def _extend(self, kind: str, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self.blocks[self._open]["type"] != kind:
            events += self._start({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                                  else {"type": "text", "text": ""})
        block = self.blocks[self._open]
        block[kind] += delta[kind]
        return [*events, _delta(self._open, delta)]

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._stop()
        self.blocks.append(block)
        self._open = len(self.blocks) - 1
        return [*events, {"type": "content_block_start", "index": self._open, "content_block": dict(block)}]

    def _stop(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        return [{"type": "content_block_stop", "index": index}]


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def stop_reason(finish: str | None, stop_string: str | None) -> dict[str, Any]:
    """``stop_reason`` and ``stop_sequence`` from the chat finish reason and the stop string that ended it."""
    if finish == "tool_calls":
        return {"stop_reason": "tool_use", "stop_sequence": None}
    if finish == "length":
        return {"stop_reason": "max_tokens", "stop_sequence": None}
    if stop_string is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": stop_string}
    return {"stop_reason": "end_turn", "stop_sequence": None}


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": prompt_tokens - cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached_tokens, "output_tokens": output_tokens}


_ERROR_TYPES = ((InvalidArgument, "invalid_request_error"), (NotFound, "not_found_error"),
                (ResourceExhausted, "rate_limit_error"), (Unavailable, "overloaded_error"),
                (Unauthenticated, "authentication_error"))


def error_body(exc: SeawallError) -> dict[str, Any]:
    """An error in Anthropic's shape (its type names what the client can do about it)."""
    kind = next((name for cls, name in _ERROR_TYPES if isinstance(exc, cls)),
                "invalid_request_error" if exc.http_status == 400 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": str(exc)}}
