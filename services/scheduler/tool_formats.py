"""Tool-call syntaxes of the newer model families, as vLLM's parsers of the same names read them:

* ``qwen3_coder`` (Qwen3-Coder, Qwen3.5): ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...
  </function></tool_call>``; ``seed_oss`` (Seed-OSS) the same inside ``<seed:tool_call>`` blocks;
* ``glm45`` (GLM-4.5, GLM-4.6): ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...
  </tool_call>``;
* ``minimax_m2``: ``<minimax:tool_call><invoke name="NAME"><parameter name="KEY">VALUE</parameter>...
  </invoke>...</minimax:tool_call>``;
* ``deepseek_v3`` (DeepSeek-V3-0324, R1-0528) and ``deepseek_v31`` (DeepSeek-V3.1): calls between
  ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``, each ``<｜tool▁call▁begin｜>`` name ``<｜tool▁sep｜>``
  JSON arguments (V3: ``function<｜tool▁sep｜>NAME`` and the JSON in a ```` ```json ```` fence)
  ``<｜tool▁call▁end｜>``;
* ``kimi_k2`` (Kimi K2): the same shape with Kimi's markers, each call headed by its id,
  ``functions.NAME:INDEX``, which becomes the call's id (its chat template writes the ids back in later turns);
* ``gemma4`` (Gemma 4): ``<|tool_call>call:NAME{KEY:VALUE,...}<tool_call|>`` per call, keys bare, a string
  between two ``<|"|>`` (verbatim: nothing in it is escaped), numbers, ``true``, ``false`` and ``null`` bare,
  objects and arrays nested in ``{...}`` and ``[...]``.

The first three write each argument as a key and a raw value: a call's ``arguments`` are the JSON object of
its values, each read as JSON where it is JSON (``2``, ``true``, ``{"a": 1}``) and as a string otherwise; where
the request's tool declares the parameter's type, a value whose JSON reading is not of that type stays the
text written when the type admits a string (a ``string`` parameter keeps ``"007"``, ``"12"`` and ``"true"``
as written, as vLLM's parsers type them by the schema); a streamed call sends that object's text up to its
last complete argument, so the pieces join to the whole call's. DeepSeek's are the JSON text the model wrote.
Gemma 4's are its values rewritten as JSON, which its syntax types (no schema needed), streamed as far as they
are read (a string piece by piece, a number once it ended), so they too join to the whole call's. Values and
names are cut at their closing tags; text before the first call is the reply's content.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.scheduler.tool_parser_base import MarkedParser, is_json_object, openai_call, partial_suffix


@dataclass
class _Call:
    name: str
    pairs: list[tuple[str, str]] = field(default_factory=list)  # the arguments whose value is complete
    args: str | None = None  # JSON-argument formats: the text written so far
    complete: bool = False  # its closing tag was seen
    id: str | None = None  # as the model wrote it (Kimi K2), else None: a new one
    params: dict[str, Any] = field(default_factory=dict)  # the tool's parameter schemas, by name

    def arguments(self) -> str:
        """The call's ``arguments``; while incomplete, a prefix of them."""
        if self.args is not None:
            return self.args
        text = json.dumps({key: _value(value, self.params.get(key)) for key, value in self.pairs}, ensure_ascii=False)
        return text if self.complete else text[:-1]


# JSON schema's name for each type json.loads returns.
_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object", list: "array",
               type(None): "null"}


def _value(raw: str, schema: Any = None) -> Any:
    """A raw argument value: its JSON reading, unless the schema declares types that reading is not of and
    that admit a string, then the text itself."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw
    kinds = _declared_types(schema)
    kind = _JSON_TYPES[type(parsed)]
    if not kinds or kind in kinds or (kind == "integer" and "number" in kinds):
        return parsed
    return raw if "string" in kinds else parsed


def _declared_types(schema: Any) -> set[str]:
    """The JSON types a parameter's schema admits: its ``type`` (a name or a list), its ``enum`` values' types,
    or its ``anyOf`` / ``oneOf`` members' types; empty when it declares none."""
    if not isinstance(schema, dict):
        return set()
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    if isinstance(schema.get("enum"), list):
        return {_JSON_TYPES.get(type(v), "string") for v in schema["enum"]}
    members = schema.get("anyOf") or schema.get("oneOf")
    return set().union(*(_declared_types(m) for m in members)) if isinstance(members, list) else set()


class _BlockParser(MarkedParser):
    """Calls from ``OPEN`` on; ``_calls`` reads them from there."""

    _schemas: dict[str, dict] = {}  # for_tools replaces it (never changes it): the function schemas

    def for_tools(self, schemas: dict[str, dict]) -> _BlockParser:
        typed = copy.copy(self)
        typed._schemas = schemas
        return typed

    def _params(self, function: str) -> dict[str, Any]:
        """The parameter schemas of ``function``'s tool (none if the request has no such tool)."""
        properties = self._schemas.get(function, {}).get("properties")
        return properties if isinstance(properties, dict) else {}

    def _calls(self, text: str) -> list[_Call]:
        raise NotImplementedError

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        at = text.find(self.OPEN)
        calls = self._calls(text[at:]) if at >= 0 else []
        if not calls or not all(c.complete and is_json_object(c.arguments()) for c in calls):
            return text, []  # no call, or one cut short by max_tokens: the reply stays text
        return (text[:at] or None), [openai_call(c.name, c.arguments(), c.id) for c in calls]

    def partial(self, text: str, scans: list | None = None) -> list[tuple[str, str]]:
        at = text.find(self.OPEN)
        return [(c.name, c.arguments()) for c in self._calls(text[at:])] if at >= 0 else []

    def call_id(self, text: str, index: int) -> str | None:
        at = text.find(self.OPEN)
        calls = self._calls(text[at:]) if at >= 0 else []
        return calls[index].id if index < len(calls) else None


def _blocks(text: str, open_tag: str, close_tag: str) -> list[tuple[str, bool]]:
    """Each ``open_tag ... close_tag`` block's body and whether it closed (the last may still be written)."""
    out, at = [], text.find(open_tag)
    while at >= 0:
        body = at + len(open_tag)
        end = text.find(close_tag, body)
        out.append((text[body:] if end < 0 else text[body:end], end >= 0))
        at = -1 if end < 0 else text.find(open_tag, end + len(close_tag))
    return out


def _strip_newline(value: str) -> str:
    """A value without the one newline its tags are written on lines of their own with."""
    return value.removeprefix("\n").removesuffix("\n")


class Qwen3CoderParser(_BlockParser):
    name = "qwen3_coder"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _FUNCTION = re.compile(r"<function=([^>\n]+)>")
    _PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)

    def _calls(self, text: str) -> list[_Call]:
        out = []
        for body, _ in _blocks(text, self.OPEN, self.CLOSE):
            function = self._FUNCTION.search(body)
            if function is None:
                break
            pairs = [(k, _strip_newline(v)) for k, v in self._PARAMETER.findall(body, function.end())]
            out.append(_Call(function[1], pairs, complete="</function>" in body, params=self._params(function[1])))
        return out


class SeedOssParser(Qwen3CoderParser):
    """Seed-OSS: Qwen3-Coder's calls inside ``<seed:tool_call>`` blocks."""

    name = "seed_oss"
    special_tokens = True  # its markers reach the parser however the tokenizer lists them
    OPEN, CLOSE = "<seed:tool_call>", "</seed:tool_call>"


class Glm45Parser(_BlockParser):
    name = "glm45"
    OPEN = "<tool_call>"
    _PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)

    def _calls(self, text: str) -> list[_Call]:
        out = []
        for body, closed in _blocks(text, self.OPEN, "</tool_call>"):
            ends = [i for i in (body.find("\n"), body.find("<arg_key>")) if i >= 0]
            if not ends and not closed:
                break  # the name is still being written
            name = body[: min(ends) if ends else len(body)].strip()
            out.append(_Call(name, self._PAIR.findall(body), complete=closed, params=self._params(name)))
        return out


class MiniMaxM2Parser(_BlockParser):
    name = "minimax_m2"
    OPEN = "<minimax:tool_call>"
    _INVOKE = re.compile(r'<invoke name="([^"]*)">')
    _PARAMETER = re.compile(r'<parameter name="([^"]*)">(.*?)</parameter>', re.S)

    def _calls(self, text: str) -> list[_Call]:
        out = []
        for block, _ in _blocks(text, self.OPEN, "</minimax:tool_call>"):
            for invoke in self._INVOKE.finditer(block):
                end = block.find("</invoke>", invoke.end())
                body = block[invoke.end(): end if end >= 0 else len(block)]
                pairs = [(k, _strip_newline(v)) for k, v in self._PARAMETER.findall(body)]
                out.append(_Call(invoke[1], pairs, complete=end >= 0, params=self._params(invoke[1])))
                if end < 0:
                    return out
        return out


class DeepSeekV31Parser(_BlockParser):
    name = "deepseek_v31"
    OPEN, CALL, SEP, END = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"

    def _calls(self, text: str) -> list[_Call]:
        out = []
        for body, closed in _blocks(text, self.CALL, self.END):
            head, sep, rest = body.partition(self.SEP)
            read = self._name_and_arguments(head, rest) if sep else None
            if read is None:
                break  # the name is still being written
            name, args, args_closed = read
            if not (closed or args_closed):  # still written: short of what could begin the end of the arguments
                args = args[: len(args) - max(partial_suffix(args, marker) for marker in self._ends())]
            out.append(_Call(name, args=args, complete=closed, id=self._id(head)))
        return out

    def _name_and_arguments(self, head: str, rest: str) -> tuple[str, str, bool] | None:
        """The call's name, its arguments' text so far, and whether they ended; None until the name is whole."""
        return head.strip(), rest, False

    def _ends(self) -> tuple[str, ...]:
        return (self.END,)

    def _id(self, head: str) -> str | None:
        return None


class DeepSeekV3Parser(DeepSeekV31Parser):
    """``function<｜tool▁sep｜>NAME`` on a line, then the arguments in a ```` ```json ```` fence."""

    name = "deepseek_v3"
    FENCE_OPEN, FENCE_CLOSE = "\n```json\n", "\n```"

    def _name_and_arguments(self, head: str, rest: str) -> tuple[str, str, bool] | None:
        line_end = rest.find("\n")
        if line_end < 0:
            return None
        fenced = rest[line_end:]
        if not fenced.startswith(self.FENCE_OPEN):
            return rest[:line_end].strip(), "", False  # the fence is still being written
        args, close, _ = fenced[len(self.FENCE_OPEN):].partition(self.FENCE_CLOSE)
        return rest[:line_end].strip(), args, bool(close)

    def _ends(self) -> tuple[str, ...]:
        return (self.FENCE_CLOSE, self.END)


class KimiK2Parser(DeepSeekV31Parser):
    """``<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>`` JSON ``<|tool_call_end|>``, as
    vLLM's ``kimi_k2`` reads it: the name is what follows the last dot before the colon, the head the id."""

    name = "kimi_k2"
    special_tokens = True  # its tokenizer may list the markers as special tokens: decode with them either way
    OPEN, CALL = "<|tool_calls_section_begin|>", "<|tool_call_begin|>"
    SEP, END = "<|tool_call_argument_begin|>", "<|tool_call_end|>"

    def _name_and_arguments(self, head: str, rest: str) -> tuple[str, str, bool] | None:
        return head.strip().split(":")[0].split(".")[-1], rest.lstrip(), False

    def _id(self, head: str) -> str | None:
        return head.strip()


class Gemma4Parser(_BlockParser):
    """``<|tool_call>call:NAME{...}<tool_call|>``: the arguments are Gemma 4's own notation, rewritten as JSON as
    far as they are read (``_gemma_arguments``)."""

    name = "gemma4"
    special_tokens = True  # its tokenizer lists the markers (and the string quote) as special tokens
    OPEN, CLOSE = "<|tool_call>", "<tool_call|>"
    _HEAD = re.compile(r"\s*call:([\w.-]+)\{")

    def _calls(self, text: str) -> list[_Call]:
        out = []
        for body, _ in _blocks(text, self.OPEN, self.CLOSE):
            head = self._HEAD.match(body)
            if head is None:
                break  # the name is still being written, or the block is not a call
            args, end = _gemma_arguments(body, head.end() - 1)
            # Whole once its object closed: a last block may lack <tool_call|> where a stop token ate it.
            out.append(_Call(head[1], args=args, complete=end is not None and not body[end:].strip()))
            if not out[-1].complete:
                break
        return out

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        at = text.find(self.OPEN)
        if at >= 0 and len(self._calls(text[at:])) < len(_blocks(text[at:], self.OPEN, self.CLOSE)):
            return text, []  # a block that is not a call (the base class would drop it): the reply stays text
        return super().split(text)


_QUOTE = '<|"|>'  # Gemma 4 writes a string between two of these
_BLANKS = re.compile(r"\s*")
_GEMMA_KEY = re.compile(r'([^\s:,{}\[\]<>"]+)\s*:')
_GEMMA_SCALAR = re.compile(r"[^\s,}\]]+")


class _Unread(Exception):
    """Gemma 4's notation stops being readable here: the text ends inside a value, or is not the notation."""


def _gemma_arguments(text: str, at: int) -> tuple[str, int | None]:
    """The arguments object at ``text[at]`` (its ``{``) as JSON text, as far as it can be read, and where the
    object ends (None while it is unfinished, or where it is not the notation). What is read is written at once
    and never revised, so the text of a call still being written is a prefix of the whole call's."""
    out: list[str] = []
    try:
        end = _gemma_value(text, at, out)
    except (_Unread, RecursionError):  # a nesting too deep to read is no call either
        return "".join(out), None
    return "".join(out), end


def _gemma_value(text: str, at: int, out: list[str]) -> int:
    """Writes the value at ``at`` (after blanks) to ``out`` as JSON; returns where it ends."""
    at = _BLANKS.match(text, at).end()
    if text.startswith(_QUOTE, at):
        return _gemma_string(text, at + len(_QUOTE), out)
    if text.startswith("{", at):
        return _gemma_items(text, at, out, _gemma_pair)
    if text.startswith("[", at):
        return _gemma_items(text, at, out, _gemma_value)
    return _gemma_scalar(text, at, out)


def _gemma_string(text: str, at: int, out: list[str]) -> int:
    """A string's text from ``at`` to the next quote. Unfinished, what is written of it (short of what could
    begin the closing quote) goes out without its closing ``"``, as a prefix of the whole string's JSON."""
    end = text.find(_QUOTE, at)
    if end >= 0:
        out.append(json.dumps(text[at:end], ensure_ascii=False))
        return end + len(_QUOTE)
    written = text[at:]
    out.append(json.dumps(written[: len(written) - partial_suffix(written, _QUOTE)], ensure_ascii=False)[:-1])
    raise _Unread


def _gemma_scalar(text: str, at: int, out: list[str]) -> int:
    """A bare number, ``true``, ``false`` or ``null``: read once something follows it (``2`` may become ``25``)."""
    token = _GEMMA_SCALAR.match(text, at)
    if token is None or token.end() == len(text):
        raise _Unread
    try:
        value = json.loads(token[0], parse_constant=_refuse_constant)
    except ValueError as exc:
        raise _Unread from exc
    if isinstance(value, str):
        raise _Unread  # a string must be quoted with <|"|>
    out.append(json.dumps(value))
    return token.end()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _gemma_pair(text: str, at: int, out: list[str]) -> int:
    key = _GEMMA_KEY.match(text, at)
    if key is None:
        raise _Unread
    out.append(json.dumps(key[1], ensure_ascii=False) + ": ")
    return _gemma_value(text, key.end(), out)


def _gemma_items(text: str, at: int, out: list[str], read_item: Callable[[str, int, list[str]], int]) -> int:
    """The object or array opening at ``text[at]``: its comma-separated items, each written by ``read_item``
    (which returns where the item ends); returns where the closing bracket ends."""
    close = "}" if text[at] == "{" else "]"
    out.append(text[at])
    at = _BLANKS.match(text, at + 1).end()
    if not text.startswith(close, at):
        while True:
            at = _BLANKS.match(text, read_item(text, at, out)).end()
            if not text.startswith(",", at):
                break
            out.append(", ")
            at = _BLANKS.match(text, at + 1).end()
    if not text.startswith(close, at):
        raise _Unread
    out.append(close)
    return at + 1
