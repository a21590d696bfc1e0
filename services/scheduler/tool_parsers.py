"""Tool calls in a model's own words: parsers for ``tool_choice: "auto"`` (``--tool-call-parser NAME``).

With ``"auto"`` the model decides whether to call a tool, and writes the call in its family's own syntax; the
parser finds it in the text. As vLLM's parsers of the same names:

* ``hermes`` (Hermes 2/3, Qwen 2.5/3 and most models trained on their format): ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>`` blocks, after optional text;
* ``llama3_json`` (Llama 3.1-3.3): the whole reply is ``{"name": ..., "parameters": {...}}`` (several joined
  by ``;``), optionally after ``<|python_tag|>``.

A parser also says where in a reply so far the tool calls begin, and how much of its end could still be the
start of one, so that streaming sends text as text and holds back what may turn out to be a call.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from services.common.errors import InvalidArgument


def openai_call(name: str, arguments: str) -> dict[str, Any]:
    """One entry of an OpenAI ``tool_calls`` list."""
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}


class ToolParser:
    name = ""

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The reply's text (None when there is none) and its tool calls (empty: a plain reply)."""
        raise NotImplementedError

    def start(self, text: str) -> int | None:
        """Where the tool calls begin in ``text`` (a reply so far), or None if they have not begun."""
        raise NotImplementedError

    def held(self, text: str) -> int:
        """How many characters at the end of ``text`` could begin a tool call: not yet sent as text."""
        raise NotImplementedError


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    return next((k for k in range(min(len(text), len(marker) - 1), 0, -1) if marker.startswith(text[-k:])), 0)


def _calls(objects: list[Any], key: str) -> list[dict[str, Any]] | None:
    """``[{"name": ..., key: {...}}]`` as OpenAI calls, or None if any is not of that shape."""
    calls = []
    for obj in objects:
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
            return None
        args = obj.get(key, obj.get("arguments", {}))
        calls.append(openai_call(obj["name"], args if isinstance(args, str) else json.dumps(args)))
    return calls


class HermesParser(ToolParser):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        at = text.find(self.OPEN)
        if at < 0:
            return text, []
        try:
            objects = [json.loads(body) for body in self._BLOCK.findall(text[at:])]
        except ValueError:  # e.g. cut short by max_tokens: the reply stays text
            return text, []
        calls = _calls(objects, "arguments")
        if not calls:
            return text, []
        return (text[:at].strip() or None), calls

    def start(self, text: str) -> int | None:
        at = text.find(self.OPEN)
        return at if at >= 0 else None

    def held(self, text: str) -> int:
        return partial_suffix(text, self.OPEN)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    TAG = "<|python_tag|>"

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        body = text.strip().removeprefix(self.TAG).strip()
        if not body.startswith("{"):
            return text, []
        try:
            objects = [json.loads(part) for part in body.split(";") if part.strip()]
        except ValueError:
            return text, []
        calls = _calls(objects, "parameters")
        return (None, calls) if calls else (text, [])

    def start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith(("{", self.TAG)):
            return len(text) - len(stripped)
        return None

    def held(self, text: str) -> int:
        stripped = text.lstrip()
        # Leading blanks, or a start of the tag: the reply may still turn out to be a call.
        return len(text) if not stripped or self.TAG.startswith(stripped) else 0


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Llama3JsonParser)}


def tool_parser(name: str | None) -> ToolParser | None:
    if name is None:
        return None
    if name not in PARSERS:
        raise InvalidArgument(f"--tool-call-parser must be one of {', '.join(PARSERS)}, got {name!r}")
    return PARSERS[name]()
