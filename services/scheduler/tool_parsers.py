"""Tool calls in a model's own words: parsers for ``tool_choice: "auto"`` (``--tool-call-parser NAME``).

With ``"auto"`` the model decides whether to call a tool, and writes the call in its family's own syntax; the
parser finds it in the text. As vLLM's parsers of the same names:

* ``hermes`` (Hermes 2/3, Qwen 2.5/3 and most models trained on their format): ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>`` blocks, after optional text;
* ``llama3_json`` (Llama 3.1-3.3): the whole reply is ``{"name": ..., "parameters": {...}}`` (several joined
  by ``;``), optionally after ``<|python_tag|>``;
* ``harmony`` (gpt-oss; with ``--reasoning-parser harmony``, which reads the reply's messages): a message to
  ``functions.NAME`` whose content is the call's arguments (services/scheduler/harmony.py);
* ``mistral`` (Mistral 7B v0.3, Nemo, Small): ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}``
  objects, or (tokenizers v11 on) ``NAME[ARGS]{...}`` after each ``[TOOL_CALLS]``;
* ``granite`` (Granite 3.x): the whole reply is such an array, after ``<|tool_call|>`` (or ``<tool_call>``);
* ``phi4_mini_json`` (Phi-4-mini): the whole reply is ``functools`` and such an array;
* ``pythonic`` (Llama 3.2, Llama 4): services/scheduler/tool_pythonic.py; the newer families' syntaxes
  (``qwen3_coder``, ``seed_oss``, ``glm45``, ``minimax_m2``, ``deepseek_v3``, ``deepseek_v31``, ``kimi_k2``,
  ``gemma4``): services/scheduler/tool_formats.py.

A parser also says where in a reply so far the tool calls begin, and how much of its end could still be the
start of one, so that streaming sends text as text and holds back what may turn out to be a call; and which
calls a reply so far has begun (``partial``), so that a call's name goes out once written and its arguments
piece by piece as they are generated, as OpenAI streams them. A call's ``arguments`` are the text the model
wrote for them (valid JSON: the whole call parsed), so the streamed pieces join to the non-streamed string.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from typing import Any

from services.common.errors import InvalidArgument
from services.scheduler.tool_formats import (
    DeepSeekV3Parser,
    DeepSeekV31Parser,
    Gemma4Parser,
    Glm45Parser,
    KimiK2Parser,
    MiniMaxM2Parser,
    Qwen3CoderParser,
    SeedOssParser,
)
from services.scheduler.tool_parser_base import (
    MarkedParser,
    ToolParser,
    is_json_object,
    openai_call,
)
from services.scheduler.tool_pythonic import PythonicParser


def _head(key: str) -> re.Pattern[str]:
    """A call object's start written name first, up to where its arguments' value begins."""
    return re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:' + key + r')"\s*:\s*')


class ValueScan:
    """Where the JSON object, array or string at the start of a growing text ends. ``end(text)`` resumes from
    the characters it has already seen, so a streamed call's arguments are scanned once in all rather than
    from their start at every token."""

    __slots__ = ("pos", "depth", "in_string", "escaped", "found")

    def __init__(self) -> None:
        self.pos, self.depth, self.in_string, self.escaped = 0, 0, False, False
        self.found: int | None = None

    def end(self, text: str) -> int | None:
        """The value's end in ``text`` (which starts with what earlier calls saw), or None while it is unfinished
        (or is another kind of value, whose end shows only in what follows it)."""
        if self.found is not None or not text or text[0] not in '{["':
            return self.found
        for i in range(self.pos, len(text)):
            ch = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        self.found = i + 1
                        return self.found
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.found = i + 1
                    return self.found
        self.pos = len(text)
        return None


def value_end(text: str) -> int | None:
    """Where the JSON object, array or string at the start of ``text`` ends (``ValueScan`` in one go)."""
    return ValueScan().end(text)


def call_prefix(body: str, head: re.Pattern[str], scan: ValueScan | None = None) -> tuple[str, str, bool] | None:
    """A call object being written (``body``, from its ``{``): its name, its arguments' text so far and whether
    they are complete; None until the name is written, or for a call not written name first. ``scan``: this
    call's scanner from the previous, shorter ``body`` (the arguments' start does not move once they began)."""
    m = head.match(body)
    if m is None:
        return None
    try:
        name = json.loads(m.group(1))
    except ValueError:
        return None
    args = body[m.end():]
    end = (scan or ValueScan()).end(args)
    if end is None and args[:1] not in ("", "{", "[", '"'):
        return None  # a number or a literal as arguments: not a prefix we can vouch for
    return name, args if end is None else args[:end], end is not None


def _read_calls(bodies: list[str], head: re.Pattern[str], key: str) -> list[dict[str, Any]] | None:
    """Whole call bodies as OpenAI calls, each's arguments as written; None if any is not a call."""
    try:
        objects = [json.loads(body) for body in bodies]
    except ValueError:  # e.g. cut short by max_tokens
        return None
    calls = _calls(objects, key)
    if not calls:
        return None
    for call, body in zip(calls, bodies, strict=True):
        written = call_prefix(body, head)
        if written is not None and written[2] and written[0] == call["function"]["name"]:
            call["function"]["arguments"] = written[1]
    return calls


def _partial(bodies: list[str], head: re.Pattern[str], scans: list[ValueScan] | None) -> list[tuple[str, str]]:
    out = []
    for k, body in enumerate(bodies):
        if scans is not None and k == len(scans):
            scans.append(ValueScan())
        written = call_prefix(body, head, scans[k] if scans is not None else None)
        if written is None:
            break
        out.append(written[:2])
        if not written[2]:
            break
    return out


def _calls(objects: list[Any], key: str) -> list[dict[str, Any]] | None:
    """``[{"name": ..., key: {...}}]`` as OpenAI calls, or None if any is not of that shape."""
    calls = []
    for obj in objects:
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
            return None
        args = obj.get(key, obj.get("arguments", {}))
        calls.append(openai_call(obj["name"], args if isinstance(args, str) else json.dumps(args)))
    return calls


class HermesParser(MarkedParser):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _HEAD = _head("arguments")

    def _blocks(self, text: str) -> list[str]:
        """Each ``<tool_call>`` block's body, up to its ``</tool_call>`` or the end of ``text`` (str.find: this
        runs on every streamed piece of a call, where a lazy regex over the reply cost ~0.1 ms per 5 KB)."""
        out, at = [], text.find(self.OPEN)
        while at >= 0:
            start = at + len(self.OPEN)
            close = text.find(self.CLOSE, start)
            out.append(text[start:] if close < 0 else text[start:close])
            at = -1 if close < 0 else text.find(self.OPEN, close + len(self.CLOSE))
        return out

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        at = text.find(self.OPEN)
        if at < 0:
            return text, []
        calls = _read_calls(self._blocks(text), self._HEAD, "arguments")
        if not calls:  # e.g. cut short by max_tokens: the reply stays text
            return text, []
        return (text[:at] or None), calls

    def partial(self, text: str, scans: list[ValueScan] | None = None) -> list[tuple[str, str]]:
        return _partial(self._blocks(text), self._HEAD, scans)


class _WholeReplyCalls(ToolParser):
    """A reply that is nothing but calls (opening with ``FIRST``), after one of ``TAGS`` or none: ``_bodies``
    finds each call object, read name first by ``_HEAD``, its arguments under ``KEY``."""

    TAGS: tuple[str, ...] = ()
    FIRST = "{"
    KEY = "arguments"
    _HEAD = _head("arguments")

    def _bodies(self, text: str) -> list[str]:
        raise NotImplementedError

    def _untagged(self, text: str) -> str:
        body = text.strip()
        for tag in self.TAGS:
            body = body.removeprefix(tag)
        return body.strip()

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        calls = _read_calls(self._bodies(text), self._HEAD, self.KEY)
        return (None, calls) if calls else (text, [])

    def partial(self, text: str, scans: list[ValueScan] | None = None) -> list[tuple[str, str]]:
        return _partial(self._bodies(text), self._HEAD, scans)

    def start(self, text: str) -> int | None:
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith((self.FIRST, *self.TAGS)) else None

    def held(self, text: str) -> int:
        stripped = text.lstrip()
        # Leading blanks, or a start of a tag: the reply may still turn out to be calls.
        return len(text) if not stripped or any(tag.startswith(stripped) for tag in self.TAGS) else 0


class Llama3JsonParser(_WholeReplyCalls):
    name = "llama3_json"
    TAGS = ("<|python_tag|>",)
    KEY = "parameters"
    _HEAD = _head("parameters|arguments")

    def _bodies(self, text: str) -> list[str]:
        body = self._untagged(text)
        return [part for part in body.split(";") if part.strip()] if body.startswith("{") else []


class HarmonyParser(MarkedParser):
    """Reads the answer the harmony reasoning parser leaves (services/scheduler/harmony.py): text, with each
    function call written ``<|channel|>commentary to=functions.NAME<|message|>ARGUMENTS``, then ``<|call|>``
    once its message ended (the reasoning parser writes a call's head whole, once the model's header is)."""

    name = "harmony"
    HEAD, MESSAGE, END = "<|channel|>commentary to=functions.", "<|message|>", "<|call|>"
    OPEN = HEAD

    def _calls(self, text: str) -> list[tuple[str, str]]:
        """Each call begun: its name and the arguments written so far."""
        out, at = [], text.find(self.HEAD)
        while at >= 0:
            name_at = at + len(self.HEAD)
            body = text.find(self.MESSAGE, name_at)
            if body < 0:
                break
            end = text.find(self.END, body)
            out.append((text[name_at:body], text[body + len(self.MESSAGE): end if end >= 0 else len(text)]))
            at = -1 if end < 0 else text.find(self.HEAD, end)
        return out

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        at = text.find(self.HEAD)
        calls = self._calls(text)
        if at < 0 or not all(is_json_object(args) for _, args in calls):  # none, or cut short by max_tokens
            return text, []
        return (text[:at] or None), [openai_call(name, args) for name, args in calls]

    def partial(self, text: str, scans: list[ValueScan] | None = None) -> list[tuple[str, str]]:
        return self._calls(text)


class MistralParser(MarkedParser):
    """``[TOOL_CALLS]`` is a control token, so such replies are decoded with their special tokens. Call ids are
    nine letters and digits: Mistral's chat templates refuse any other id sent back in a later turn."""

    name = "mistral"
    OPEN, ARGS = "[TOOL_CALLS]", "[ARGS]"
    special_tokens = True
    _HEAD = _head("arguments")

    def _bodies(self, text: str) -> list[str] | None:
        """The array format's call objects; None for the v11 format."""
        at = text.find(self.OPEN)
        return array_bodies(text[at + len(self.OPEN):] if at >= 0 else "")

    def _named(self, text: str) -> list[tuple[str, str, bool]]:
        """The v11 format's calls begun: name, arguments so far, whether they ended."""
        out = []
        for segment in text.split(self.OPEN)[1:]:
            name, sep, args = segment.partition(self.ARGS)
            if not sep:
                break  # the name is still being written
            args = args.lstrip()
            end = value_end(args)
            out.append((name.strip(), args if end is None else args[:end], end is not None))
            if end is None:
                break
        return out

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        at, bodies = text.find(self.OPEN), self._bodies(text)
        if at < 0:
            return text, []
        if bodies is not None:
            calls = _read_calls(bodies, self._HEAD, "arguments") or []
        else:
            named = self._named(text)
            complete = named and all(done and is_json_object(args) for _, args, done in named)
            calls = [openai_call(name, args) for name, args, _ in named] if complete else []
        if not calls:  # e.g. cut short by max_tokens: the reply stays text
            return text, []
        return (text[:at] or None), [{**call, "id": mistral_call_id()} for call in calls]

    def partial(self, text: str, scans: list[ValueScan] | None = None) -> list[tuple[str, str]]:
        bodies = self._bodies(text)
        if bodies is not None:
            return _partial(bodies, self._HEAD, scans)
        return [(name, args) for name, args, _ in self._named(text)]

    def call_id(self, text: str, index: int) -> str | None:
        return mistral_call_id()


class _WholeReplyArray(_WholeReplyCalls):
    """A reply that is a JSON array of call objects, after one of ``TAGS`` or none."""

    FIRST = "["

    def _bodies(self, text: str) -> list[str]:
        return array_bodies(self._untagged(text)) or []


class GraniteParser(_WholeReplyArray):
    name = "granite"
    TAGS = ("<|tool_call|>", "<tool_call>")


class Phi4MiniJsonParser(_WholeReplyArray):
    name = "phi4_mini_json"
    TAGS = ("functools",)
    KEY = "parameters"  # or "arguments", which it writes too
    _HEAD = _head("arguments|parameters")


def array_bodies(text: str) -> list[str] | None:
    """A JSON array of objects being written (``text``, blanks before its ``[`` allowed): each object's text, up
    to its end or the end of ``text``; None when ``text`` is not such an array."""
    rest = text.lstrip()
    if not rest.startswith("["):
        return None
    out, pos = [], 1
    while (start := rest.find("{", pos)) >= 0 and not rest[pos:start].strip(" \n,"):
        end = value_end(rest[start:])
        out.append(rest[start:] if end is None else rest[start:start + end])
        if end is None:
            break
        pos = start + end
    return out


def mistral_call_id() -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (
    HermesParser, Llama3JsonParser, HarmonyParser, Qwen3CoderParser, Glm45Parser, MiniMaxM2Parser, DeepSeekV3Parser,
    DeepSeekV31Parser, KimiK2Parser, PythonicParser, MistralParser, GraniteParser, SeedOssParser, Phi4MiniJsonParser,
    Gemma4Parser)}


def tool_parser(name: str | None) -> ToolParser | None:
    if name is None:
        return None
    if name not in PARSERS:
        raise InvalidArgument(f"--tool-call-parser must be one of {', '.join(PARSERS)}, got {name!r}")
    return PARSERS[name]()
