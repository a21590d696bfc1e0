"""Reasoning in a model's own words: ``--reasoning-parser NAME`` splits a reply's thinking from its answer, as
vLLM's parsers of the same names. The chat API returns the thinking as ``reasoning_content`` (DeepSeek's and
vLLM's field), the Responses API as a reasoning item; tool calls are read from the answer only.

* ``deepseek_r1`` (DeepSeek-R1 and its distills): thinking up to ``</think>``, then the answer; the opening
  ``<think>`` is optional (newer chat templates put it in the prompt), so a reply that never closes its thought
  is all thinking.
* ``qwen3`` (Qwen3, QwQ): thinking only inside ``<think>...</think>`` at the start of the reply; a reply without
  it (``"chat_template_kwargs": {"enable_thinking": false}``) is all answer;
* ``seed_oss`` (Seed-OSS): as ``qwen3``, inside ``<seed:think>...</seed:think>``; decoded with special tokens
  (the markers reach the splitter however the tokenizer lists them);
* ``gemma4`` (Gemma 4): as ``seed_oss``, inside ``<|channel>thought\n...<channel|>``; ``thought`` and its
  newline name the channel and are neither thinking nor answer;
* ``harmony`` (gpt-oss): the ``analysis`` channel's messages are the thinking, ``final``'s the answer
  (services/scheduler/harmony.py).

A structured output (or a forced tool call) applies to the answer after the thought: the chat path sets
``SamplingParams.free_thought`` and the worker's grammar lets the thought run free up to ``</think>``. With
``--structured-output-in-reasoning`` the grammar writes the reply from its first token instead, and such a
reply is thinking only if it opens with ``<think>``.

One splitter serves the whole reply and the stream (``ReasoningStream``), so the two cannot disagree: markers
split across pieces are found, and what could still begin one is held back, as stop strings are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.errors import InvalidArgument
from services.scheduler.harmony import HarmonyReasoning, HarmonyStream
from services.scheduler.tool_parser_base import partial_suffix

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    open_optional: bool  # thinking may start without <think> (the template opened it)
    special_tokens: bool = False  # the markers are plain text: the reply is decoded as the request asks
    open_tag: str = OPEN
    close_tag: str = CLOSE
    header: str = ""  # written right after open_tag, before the thinking (Gemma 4's channel name): dropped

    def stream(self, constrained: bool = False) -> ReasoningStream:
        """A splitter of one reply as it streams."""
        return ReasoningStream(self, constrained)

    def free_thought(self) -> str:
        """``SamplingParams.free_thought`` for a structured answer after the thought: the grammar lets the thought
        run free up to ``</think>``, which must open with ``<think>`` unless the template opened it. The
        grammar's thought is written with those two markers: other markers are refused."""
        if (self.open_tag, self.close_tag) != (OPEN, CLOSE):
            raise InvalidArgument(f"a structured output (or a forced tool call) after a {self.open_tag} thought is "
                                  "not supported: start the mesh with --structured-output-in-reasoning, or use "
                                  "tool_choice \"auto\"")
        return "required" if self.open_optional else "optional"

    def split(self, text: str, constrained: bool = False) -> tuple[str | None, str | None]:
        """A whole reply as (thinking, answer), None for an empty part."""
        stream = ReasoningStream(self, constrained)
        thought, answer = stream.feed(text, final=True)
        return thought or None, answer or None

    def thought_tokens(self, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                       constrained: bool = False) -> int:
        """How many of a reply's tokens are its thought, through the token that closes it: the shortest prefix
        whose text holds ``</think>`` (found by bisection: a longer prefix holds it too); all of them when the
        thought never closed; 0 for a reply that does not think."""
        text = decode(token_ids)
        thought, _ = self.split(text, constrained)
        if self.close_tag not in text:
            return len(token_ids) if thought is not None else 0
        if thought is None and not text.lstrip().startswith(self.open_tag):
            return 0  # an answer that happens to contain the marker
        lo, hi = 1, len(token_ids)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.close_tag in decode(token_ids[:mid]) else (mid + 1, hi)
        return lo


class ReasoningStream:
    """One reply split as it arrives: ``feed`` returns the new thinking and the new answer."""

    def __init__(self, parser: ReasoningParser, constrained: bool = False) -> None:
        self.open_optional = parser.open_optional and not constrained
        self.open, self.close, self.header = parser.open_tag, parser.close_tag, parser.header
        self.state = "start"  # start -> header -> thinking -> answer, or start -> (thinking ->) answer
        self.pending = ""  # text not yet sent: a possible start of a marker

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.pending += text
        thought = answer = ""
        if self.state == "start":
            head = self.pending.lstrip()
            if head.startswith(self.open):
                self.state, self.pending = "header", head[len(self.open):]
            elif self.open.startswith(head) and not final:
                return "", ""  # blanks, or a start of <think>: not decided yet
            else:
                self.state = "thinking" if self.open_optional else "answer"
        if self.state == "header":
            if self.pending.startswith(self.header):
                self.pending = self.pending[len(self.header):]
            elif self.header.startswith(self.pending) and not final:
                return "", ""  # a start of the header: not decided yet
            self.state = "thinking"  # without its header the thought is kept as written
        if self.state == "thinking":
            at = self.pending.find(self.close)
            if at < 0:
                keep = 0 if final else partial_suffix(self.pending, self.close)
                thought, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep:]
                return thought, ""
            thought, self.pending, self.state = self.pending[:at], self.pending[at + len(self.close):], "answer"
        answer, self.pending = self.pending, ""
        return thought, answer


# What the chat API holds: a parser of either kind, and the stream it makes.
AnyReasoning = ReasoningParser | HarmonyReasoning
AnyStream = ReasoningStream | HarmonyStream

PARSERS: dict[str, AnyReasoning] = {
    p.name: p for p in (ReasoningParser("deepseek_r1", open_optional=True),
                        ReasoningParser("qwen3", open_optional=False),
                        ReasoningParser("seed_oss", open_optional=False, special_tokens=True,
                                        open_tag="<seed:think>", close_tag="</seed:think>"),
                        ReasoningParser("gemma4", open_optional=False, special_tokens=True,
                                        open_tag="<|channel>", close_tag="<channel|>", header="thought\n"),
                        HarmonyReasoning())}


def reasoning_parser(name: str | None) -> AnyReasoning | None:
    if name is None:
        return None
    if name not in PARSERS:
        raise InvalidArgument(f"--reasoning-parser must be one of {', '.join(PARSERS)}, got {name!r}")
    return PARSERS[name]
