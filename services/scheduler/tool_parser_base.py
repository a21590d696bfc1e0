"""What every tool-call parser is (``ToolParser``; ``MarkedParser``: one whose calls begin at a marker) and the
helpers they share: an OpenAI call entry, how much of a reply's end could still begin a marker, and whether a
call's arguments are a JSON object."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.scheduler.tool_parsers import ValueScan


def openai_call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    """One entry of an OpenAI ``tool_calls`` list; its id ``call_id``, else a new one."""
    return {"id": call_id or new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolParser:
    name = ""
    special_tokens = False  # whether its markers are special tokens: replies are then decoded with them

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The reply's text (None when there is none) and its tool calls (empty: a plain reply)."""
        raise NotImplementedError

    def start(self, text: str) -> int | None:
        """Where the tool calls begin in ``text`` (a reply so far), or None if they have not begun."""
        raise NotImplementedError

    def held(self, text: str) -> int:
        """How many characters at the end of ``text`` could begin a tool call: not yet sent as text."""
        raise NotImplementedError

    def for_tools(self, schemas: dict[str, dict]) -> ToolParser:
        """This parser for one request whose tools' parameter schemas are ``schemas`` (function name -> JSON
        schema): syntaxes that write arguments as raw text type them by it; the others need nothing."""
        return self

    def call_id(self, text: str, index: int) -> str | None:
        """The id the model wrote for call ``index`` of ``text`` (Kimi K2 numbers its calls and reads the ids back
        in later turns), or None where its syntax has none."""
        return None

    def partial(self, text: str, scans: list[ValueScan] | None = None) -> list[tuple[str, str]]:
        """The calls begun in ``text`` (a reply so far) whose name is complete: (name, the arguments written so
        far, a prefix of the call's final ``arguments``). Stops at the first call it cannot read yet. ``scans``:
        one scanner per call, kept by the caller between calls on a growing reply (filled in as calls begin)."""
        raise NotImplementedError


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    return next((k for k in range(min(len(text), len(marker) - 1), 0, -1) if marker.startswith(text[-k:])), 0)


class MarkedParser(ToolParser):
    """A syntax whose tool calls begin at the marker ``OPEN``: text before it is content, and a reply's end that
    could still begin it is held back."""

    OPEN = ""

    def start(self, text: str) -> int | None:
        at = text.find(self.OPEN)
        return at if at >= 0 else None

    def held(self, text: str) -> int:
        return partial_suffix(text, self.OPEN)


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
