"""gpt-oss's harmony response format, read for the chat and Responses APIs: ``--reasoning-parser harmony`` (with
``--tool-call-parser harmony`` for its function calls), as vLLM serves gpt-oss.

A harmony reply is a sequence of messages, each a header, ``<|message|>`` and its content, ended by ``<|end|>``
(another message follows, from ``<|start|>``) or by a stop token (``<|return|>``, ``<|call|>``, which the text
leaves out)::

    <|channel|>analysis<|message|>User asks for 2 + 2.<|end|><|start|>assistant<|channel|>final<|message|>4.
    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}

(the prompt ends with ``<|start|>assistant``, so the first message has no ``<|start|>``). The ``analysis``
channel is the thought (``reasoning_content``), as are messages to the built-in tools it was trained with
(``browser.*``, ``python``: not served). ``final`` and ``commentary`` messages without a recipient (a preamble
before calls) are the answer. A message to ``functions.NAME`` is a function call: it stays in the answer as
``<|channel|>commentary to=functions.NAME<|message|>ARGS``, which the harmony tool parser reads
(tool_parsers.py). The markers are special tokens, so such a reply is decoded with them
(``SamplingParams.skip_special_tokens`` false for its chat requests).

The reply is read whole on each piece (a few ``str.find`` calls per message), and what a stream sends is what
the whole reply so far gives beyond what was sent: the two cannot disagree. A reply that does not begin with a
header is not in harmony and is all answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.scheduler.tool_parser_base import partial_suffix
from services.scheduler.tool_parsers import HarmonyParser

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
# What ends a message's content: its end, a stop token the decoded text kept, or the next message's start.
_ENDS = (END, "<|return|>", "<|call|>", START)
_MARKERS = (*_ENDS, MESSAGE, CHANNEL, "<|constrain|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")


@dataclass(frozen=True)
class Message:
    channel: str | None
    recipient: str | None
    content: str
    ended: bool  # its end was seen (else the reply so far stops inside it)

    @property
    def call(self) -> str | None:
        """The function this message calls, or None."""
        return self.recipient.removeprefix("functions.") if self.recipient and self.recipient.startswith(
            "functions.") else None

    @property
    def thought(self) -> bool:
        return self.call is None and (self.channel == "analysis" or self.recipient is not None)


def messages(text: str, final: bool) -> list[Message] | None:
    """The messages of ``text`` (a reply so far) whose headers are complete, the last one's content short of
    what could still begin a marker (all of it when ``final``); None when the reply is not in harmony, or, not
    ``final``, when it cannot tell yet."""
    head = text.lstrip()
    if not head.startswith((CHANNEL, START)):
        undecided = not final and (CHANNEL.startswith(head) or START.startswith(head))
        return [] if undecided else None
    out, pos = [], len(text) - len(head)
    while pos < len(text):
        at = text.find(MESSAGE, pos)
        if at < 0:
            break  # a header still being written: nothing to show (and, at the end, markup only)
        header, body = text[pos:at], at + len(MESSAGE)
        channel, recipient = _CHANNEL.search(header), _RECIPIENT.search(header)
        ends = [(i, m) for m in _ENDS if (i := text.find(m, body)) >= 0]
        if not ends:
            content = text[body:]
            keep = len(content) if final else len(content) - max(partial_suffix(content, m) for m in _MARKERS)
            out.append(Message(channel and channel[1], recipient and recipient[1], content[:keep], False))
            break
        end, marker = min(ends)
        out.append(Message(channel and channel[1], recipient and recipient[1], text[body:end], True))
        pos = end if marker == START else end + len(marker)
    return out


def render(text: str, final: bool) -> tuple[str, str]:
    """A reply so far as (thought, answer): thoughts joined by newlines, the answer with each call as the tool
    parser reads it."""
    msgs = messages(text, final)
    if msgs is None:
        return "", text
    thoughts, answer = [], []
    for m in msgs:
        if m.call is not None:
            answer.append(f"{HarmonyParser.HEAD}{m.call}{HarmonyParser.MESSAGE}{m.content}"
                          f"{HarmonyParser.END if m.ended else ''}")
        elif m.thought:
            thoughts.append(m.content)
        else:
            answer.append(m.content)
    return "\n".join(thoughts), "".join(answer)


class HarmonyStream:
    """One reply split as it arrives: ``feed`` returns the new thinking and the new answer."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = ("", "")

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.text += text
        thought, answer = render(self.text, final)
        # Each grows only at its end (a message's kind is fixed once its header is whole), so the new part is
        # what lies beyond what was sent.
        new = thought[len(self.sent[0]):], answer[len(self.sent[1]):]
        self.sent = thought, answer
        return new


@dataclass(frozen=True)
class HarmonyReasoning:
    name: str = "harmony"
    special_tokens: bool = True  # the reply is decoded with its markers

    def split(self, text: str, constrained: bool = False) -> tuple[str | None, str | None]:
        """A whole reply as (thinking, answer), None for an empty part."""
        thought, answer = render(text, final=True)
        return thought or None, answer or None

    def stream(self, constrained: bool = False) -> HarmonyStream:
        return HarmonyStream()

    def free_thought(self) -> str:
        """A structured answer comes after any analysis messages, in the final channel."""
        return "harmony"

    def thought_tokens(self, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                       constrained: bool = False) -> int:
        """How many of a reply's tokens are its thought: through the end of its last thought message (found by
        bisection: a longer prefix ends as many); all of them when that message never ended."""
        whole = messages(decode(token_ids), final=True) or []
        thoughts = [i for i, m in enumerate(whole) if m.thought]
        if not thoughts:
            return 0
        if not whole[thoughts[-1]].ended:
            return len(token_ids)
        lo, hi = 1, len(token_ids)
        while lo < hi:
            mid = (lo + hi) // 2
            ended = sum(m.thought and m.ended for m in messages(decode(token_ids[:mid]), final=False) or [])
            lo, hi = (lo, mid) if ended >= len(thoughts) else (mid + 1, hi)
        return lo
