"""Chat messages and tool calls of the OpenAI chat API, as plain data (no I/O).

Messages: ``content`` is a string or a list of text parts (``[{"type": "text", "text": ...}]``, joined with
newlines, as vLLM does); an assistant message may carry ``tool_calls`` instead of content, and a ``tool``
message answers one (``tool_call_id``). They reach the chat template as given, so templates that render tools
see them.

Tool calls: with ``tools`` and a ``tool_choice`` that forces a call, the output is constrained by structured
output (no model-specific parser needed), as vLLM does for the same two cases:

* a named function (``{"type": "function", "function": {"name": N}}``): the output is N's arguments, a JSON
  object of its ``parameters`` schema;
* ``"required"``: the output is a JSON array of one or more ``{"name": ..., "parameters": {...}}`` objects,
  each the name of one of the tools with that tool's parameters (exactly one with ``parallel_tool_calls``
  false).

With ``"auto"`` (OpenAI's default when tools are given) the model decides, in its own tool-call syntax: the
mesh reads it with the parser it was started with (``--tool-call-parser``, services/scheduler/tool_parsers.py)
and refuses ``"auto"`` without one, saying what to send instead. ``"none"`` generates text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.common.errors import InvalidArgument
from services.scheduler.tool_parser_base import ToolParser, new_call_id, openai_call
from services.scheduler.tool_parsers import PARSERS, ValueScan

if TYPE_CHECKING:
    from services.scheduler.tracked import Delta

_ROLES = ("system", "developer", "user", "assistant", "tool")


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as the chat template gets them (text parts joined); raises InvalidArgument naming the bad
    message."""
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages must be a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            raise InvalidArgument(f"messages[{i}] must be an object with a string role and content")
        if m["role"] not in _ROLES:
            raise InvalidArgument(f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {m['role']!r}")
        content = _content(m.get("content"), f"messages[{i}]")
        calls = m.get("tool_calls")
        if content is None and not (m["role"] == "assistant" and calls):
            raise InvalidArgument(f"messages[{i}] must have string content (only an assistant message with "
                                  "tool_calls may leave it out)")
        if calls is not None and not (m["role"] == "assistant" and isinstance(calls, list)):
            raise InvalidArgument(f"messages[{i}].tool_calls must be a list, on an assistant message")
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise InvalidArgument(f"messages[{i}] is a tool result: it needs the tool_call_id it answers")
        out.append({**m, "content": content})
    return out


def open_final_message(rendered: str, final: dict[str, Any]) -> str:
    """The rendered chat cut right after the final message's text, so that the model continues that message
    (``continue_final_message``): whatever the template wrote after it (its end of turn) is dropped. The cut is
    transformers' ``apply_chat_template`` one, whitespace included: a template that trims the text ("... is "
    rendered "... is") is cut after the trimmed text."""
    content = final.get("content") or ""
    if not content.strip():
        raise InvalidArgument("continue_final_message needs a final message with text to continue")
    at = rendered.rfind(content.strip())
    if at < 0:
        raise InvalidArgument("continue_final_message: the chat template does not write the final message's "
                              "text as sent, so there is no place to continue it")
    if rendered[at:at + len(content.lstrip())] == content:
        return rendered[:at + len(content.lstrip())]
    return rendered[:at + len(content.strip())]


def _content(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return join_text_parts(content, where, ("text",))
    raise InvalidArgument(f"{where}.content must be a string or a list of text parts, got {content!r}")


def join_text_parts(parts: list[Any], where: str, kinds: tuple[str, ...]) -> str:
    """Text parts (``{"type": <one of kinds>, "text": ...}``) joined with newlines, as vLLM joins them; any other
    part (an image, a file) is refused, naming it."""
    texts = []
    for k, part in enumerate(parts):
        if not (isinstance(part, dict) and part.get("type") in kinds and isinstance(part.get("text"), str)):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidArgument(f"{where}.content[{k}]: only text parts (type {' or '.join(kinds)}, with a text) "
                                  f"are supported (this model reads text), got {kind!r}")
        texts.append(part["text"])
    return "\n".join(texts)


@dataclass(frozen=True)
class ToolCalling:
    """A chat request that may answer with tool calls: forced ones (``structured_output`` makes the output their
    JSON; ``function`` names the one function, None for ``"required"``), or the model's own choice read back
    by ``parser`` (``"auto"``)."""

    structured_output: tuple[str, str] | None
    function: str | None = None
    parser: ToolParser | None = None

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """A forced call's output as OpenAI ``tool_calls``; None when nothing of it was written, or, for
        ``"required"``, when it is not complete JSON (cut by max_tokens). A named function's call is its
        arguments as far as they were written, complete or not: streamed, they went out piece by piece (as vLLM
        answers both)."""
        if self.function is not None:
            return [openai_call(self.function, text)] if text else None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return [openai_call(item["name"], json.dumps(item["parameters"])) for item in value]

    def message(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """The whole output as the assistant message, and the choice's finish reason."""
        if self.parser is not None:
            content, calls = self.parser.split(text)
        else:
            content, calls = None, self.calls(text) or []
        if not calls:  # no call, or the calls "required" asked for cut short by max_tokens: the text it got to
            return {"role": "assistant", "content": text}, finish
        return {"role": "assistant", "content": content, "tool_calls": calls}, tool_finish_reason(finish)

    def stream(self) -> ToolCallStream | AutoToolStream:
        return AutoToolStream(self.parser) if self.parser is not None else ToolCallStream(self)


class ToolCallStream:
    """One choice's forced tool call, streamed as OpenAI streams them: a named function's arguments piece by
    piece as they are generated; the calls of ``"required"`` (a JSON array naming its functions) once complete."""

    def __init__(self, tools: ToolCalling) -> None:
        self.tools = tools
        self.text = ""
        self.started = False
        self.call_started = False  # the named call's id and name went out (with its first arguments)
        self.id = new_call_id()

    def delta(self, merged: Delta) -> tuple[dict[str, Any], str | None]:
        self.text += merged.text
        out: dict[str, Any] = {} if self.started else {"role": "assistant"}
        finish = merged.finish_reason
        # A piece without arguments (a reasoning parser's thought comes before them) adds no empty call delta: the
        # call begins, id and name, with its first arguments, after any thought.
        if self.tools.function is not None and merged.text:
            call: dict[str, Any] = {"index": 0, "function": {"arguments": merged.text}}
            if not self.call_started:
                call = {"index": 0, "id": self.id, "type": "function",
                        "function": {"name": self.tools.function, "arguments": merged.text}}
                self.call_started = True
            out["tool_calls"] = [call]
        elif self.tools.function is None and finish is not None:
            calls = self.tools.calls(self.text)
            if calls is None:  # cut short by max_tokens: the text it got to
                out["content"] = self.text
            else:
                out["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
        self.started = True
        return out, tool_finish_reason(finish)


class AutoToolStream:
    """One choice of a ``"auto"`` request, streamed: text goes out as text until the parser sees a tool call
    begin (what could still be the start of one is held back); from there each call goes out as OpenAI streams
    them: its id and name once the name is written, then its arguments piece by piece. A reply that turns out
    not to hold a call (cut short before any call's name was complete) goes out as text."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent = 0  # characters of text sent as content
        self.calling = False
        self.started = False
        self.calls: list[tuple[str, int]] = []  # per call streamed: its id, characters of arguments sent
        self._scans: list[ValueScan] = []  # per call begun: where its arguments end, scanned as they grow

    def delta(self, merged: Delta) -> tuple[dict[str, Any], str | None]:
        self.text += merged.text
        out: dict[str, Any] = {} if self.started else {"role": "assistant"}
        self.started = True
        finish = merged.finish_reason
        if not self.calling:
            begin = self.parser.start(self.text)
            self.calling = begin is not None
            upto = begin if begin is not None else len(self.text) - self.parser.held(self.text)
            if finish is not None and not self.calling:
                upto = len(self.text)
            self._send(out, upto)
        if not self.calling:
            return out, finish
        if finish is None:
            self._stream_calls(out, self.parser.partial(self.text, self._scans))
            return out, None
        _, calls = self.parser.split(self.text)
        if calls:
            self._stream_calls(out, [(c["function"]["name"], c["function"]["arguments"]) for c in calls])
            return out, tool_finish_reason(finish)
        # Cut short (max_tokens): what it got to.
        self._stream_calls(out, self.parser.partial(self.text, self._scans))
        if not self.calls:  # not even a call's name: the reply was text after all
            self._send(out, len(self.text))
        return out, finish

    def _stream_calls(self, out: dict[str, Any], calls: list[tuple[str, str]]) -> None:
        """What each call has that was not sent: a new call's id, name and arguments so far; more arguments."""
        deltas = []
        for k, (name, args) in enumerate(calls):
            if k == len(self.calls):
                self.calls.append((self.parser.call_id(self.text, k) or new_call_id(), 0))
                deltas.append({"index": k, "id": self.calls[k][0], "type": "function",
                               "function": {"name": name, "arguments": args}})
            elif len(args) > self.calls[k][1]:
                deltas.append({"index": k, "function": {"arguments": args[self.calls[k][1]:]}})
            self.calls[k] = (self.calls[k][0], len(args))
        if deltas:
            out["tool_calls"] = deltas

    def _send(self, out: dict[str, Any], upto: int) -> None:
        if upto > self.sent:
            out["content"] = out.get("content", "") + self.text[self.sent:upto]
            self.sent = upto
        elif "role" in out:
            out["content"] = ""


def tool_finish_reason(reason: str | None) -> str | None:
    """A reply that ended with tool calls reports ``tool_calls``, as OpenAI does."""
    return "tool_calls" if reason == "stop" else reason


def tool_calling(body: dict[str, Any], parser: ToolParser | None = None) -> ToolCalling | None:
    """What ``tools`` and ``tool_choice`` ask for: a ToolCalling when a call is forced, or with ``"auto"`` when
    ``parser`` reads this model's calls; None when the output is text (no tools, or ``"none"``); raises
    InvalidArgument for what cannot be served, saying what to send."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise InvalidArgument(f"tool_choice {choice!r} needs tools; send tools or omit tool_choice")
        return None
    schemas = _tool_schemas(tools)
    if choice == "none":
        return None
    if choice is None or choice == "auto":
        if parser is not None:
            return ToolCalling(None, parser=parser.for_tools(schemas))
        raise InvalidArgument("tool_choice \"auto\" (the default with tools) needs a parser of this model's own "
                              f"tool-call format: start the mesh with --tool-call-parser ({', '.join(PARSERS)}), or "
                              "send tool_choice \"required\" or {\"type\": \"function\", \"function\": "
                              "{\"name\": ...}}, or \"none\"")
    if choice == "required":
        variants = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                                      "parameters": schema},
                     "required": ["name", "parameters"], "additionalProperties": False}
                    for name, schema in schemas.items()]
        array = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
        if body.get("parallel_tool_calls") is False:  # OpenAI's switch for one call per reply
            array["maxItems"] = 1
        return ToolCalling(("json", json.dumps(array)), None)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(name, str)):
        raise InvalidArgument(f"tool_choice must be \"none\", \"auto\", \"required\" or "
                              f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {choice!r}")
    if name not in schemas:
        raise InvalidArgument(f"tool_choice names function {name!r}, which is not in tools ({', '.join(schemas)})")
    return ToolCalling(("json", json.dumps(schemas[name])), name)


def _tool_schemas(tools: Any) -> dict[str, dict]:
    """Function name -> its parameters schema ({"type": "object"} when it has none)."""
    if not isinstance(tools, list):
        raise InvalidArgument(f"tools must be a list of {{\"type\": \"function\", \"function\": {{...}}}}, got {tools!r}")
    out: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(fn, dict)
                and isinstance(fn.get("name"), str) and fn["name"]):
            raise InvalidArgument(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                  f"\"parameters\": {{...}}}}}}, got {tool!r}")
        params = fn.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            raise InvalidArgument(f"tools[{i}].function.parameters must be a JSON schema object, got {params!r}")
        if fn["name"] in out:
            raise InvalidArgument(f"tools[{i}]: function {fn['name']!r} is defined twice")
        out[fn["name"]] = params
    return out
