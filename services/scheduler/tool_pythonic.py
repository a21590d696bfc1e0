"""Tool calls written as a Python list of calls, ``[get_weather(city="Oslo", days=2), clock()]`` (Llama 3.2's
and Llama 4's pythonic format; Llama 4 wraps it in ``<|python_start|>`` ... ``<|python_end|>``), read as vLLM's
``pythonic`` parser reads it: a reply that is such a list, each call by name with keyword arguments whose values
are literals; the arguments become the JSON object of those values (tuples as arrays).

A streamed call sends that object's text up to its last complete argument (a comma or the call's closing
parenthesis after it, outside any string or bracket), so the pieces join to the whole call's."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from services.scheduler.tool_parser_base import ToolParser, openai_call, partial_suffix

_CALL_HEAD = re.compile(r"\s*([A-Za-z_]\w*)\s*\(")
_NEXT_CALL = re.compile(r"\s*,")
_KEYWORD = re.compile(r"\s*([A-Za-z_]\w*)\s*=(?!=)")


class PythonicParser(ToolParser):
    name = "pythonic"
    START, END = "<|python_start|>", "<|python_end|>"

    def _body(self, text: str) -> str | None:
        """The reply's call list (from its ``[``), or None when the reply is not one."""
        body = text.strip().removeprefix(self.START).strip()
        return body.removesuffix(self.END).rstrip() if body.startswith("[") else None

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        body = self._body(text)
        try:
            tree = ast.parse(body, mode="eval").body if body is not None else None
        except SyntaxError:  # cut short by max_tokens, or not Python
            return text, []
        if not isinstance(tree, ast.List) or not tree.elts:
            return text, []
        calls = []
        for node in tree.elts:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
                    and all(k.arg is not None for k in node.keywords)):
                return text, []
            try:
                args = {k.arg: _json_value(k.value) for k in node.keywords}
            except ValueError:
                return text, []
            calls.append(openai_call(node.func.id, json.dumps(args, ensure_ascii=False)))
        return None, calls

    def partial(self, text: str, scans: list | None = None) -> list[tuple[str, str]]:
        body = self._body(text)
        out: list[tuple[str, str]] = []
        for name, sources, closed in _scan_calls(body) if body is not None else []:
            args = {}
            for source in sources:
                keyword = _KEYWORD.match(source)
                try:
                    args[keyword[1]] = _json_value(ast.parse(source[keyword.end():].strip(), mode="eval").body)
                except (TypeError, SyntaxError, ValueError):  # not keyword=literal: no call the reply ends with
                    return out
            whole = json.dumps(args, ensure_ascii=False)
            out.append((name, whole if closed else whole[:-1]))
        return out

    def start(self, text: str) -> int | None:
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith(("[", self.START)) else None

    def held(self, text: str) -> int:
        stripped = text.lstrip()
        # Leading blanks, or a start of the tag: the reply may still turn out to be calls.
        return len(text) if not stripped or partial_suffix(stripped, self.START) == len(stripped) else 0


def _json_value(node: ast.expr) -> Any:
    """A literal's value as JSON holds it (tuples as lists); ValueError for anything else."""
    value = ast.literal_eval(node)
    try:
        return json.loads(json.dumps(value))
    except TypeError as exc:  # a set, bytes, a complex number
        raise ValueError(f"{type(value).__name__} is not a JSON value") from exc


def _scan_calls(body: str) -> list[tuple[str, list[str], bool]]:
    """Each call begun in ``body`` (which starts with ``[``) whose name is written: its name, the source of each
    of its complete arguments, and whether it closed."""
    calls: list[tuple[str, list[str], bool]] = []
    at = 1
    while (head := _CALL_HEAD.match(body, at)) is not None:
        sources, closed, at = _scan_arguments(body, head.end())
        calls.append((head[1], sources, closed))
        following = _NEXT_CALL.match(body, at) if closed else None
        if following is None:
            break
        at = following.end()
    return calls


def _scan_arguments(body: str, at: int) -> tuple[list[str], bool, int]:
    """From just after a call's ``(``: its complete arguments' sources, whether its ``)`` came, and where the
    scan stopped (after the ``)``)."""
    sources, start, depth, quote, escaped = [], at, 0, "", False
    for i in range(at, len(body)):
        ch = body[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}" and depth:
            depth -= 1
        elif ch == ")" or (ch == "," and not depth):
            if body[start:i].strip():
                sources.append(body[start:i])
            if ch == ")":
                return sources, True, i + 1
            start = i + 1
    return sources, False, len(body)
