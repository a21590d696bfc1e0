"""gpt-oss's harmony format (services/scheduler/harmony.py and the harmony tool parser), as plain data: whole
replies, streams cut anywhere giving the same split, the thought's tokens, and calls read from the answer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.harmony import messages
from services.scheduler.reasoning_parsers import PARSERS
from services.scheduler.tool_parsers import tool_parser

HARMONY, TOOLS = PARSERS["harmony"], tool_parser("harmony")
THINK = "<|channel|>analysis<|message|>User asks: 2 + 2?<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4."
CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Oslo"}')


@pytest.mark.parametrize("text, want", [
    (THINK + FINAL, ("User asks: 2 + 2?", "2 + 2 = 4.")),
    (FINAL.removeprefix("<|start|>assistant"), (None, "2 + 2 = 4.")),  # no thought (reasoning effort low)
    (THINK + "<|start|>assistant<|channel|>analysis<|message|>Simple.<|end|>" + FINAL,
     ("User asks: 2 + 2?\nSimple.", "2 + 2 = 4.")),  # thoughts joined by newlines
    ("<|channel|>analysis<|message|>still thinking when cut", ("still thinking when cut", None)),
    (THINK + "<|start|>assistant<|channel|>fin", ("User asks: 2 + 2?", None)),  # cut inside a header: markup
    ("Plain text, not harmony.", (None, "Plain text, not harmony.")),
    (" <|chan", (None, " <|chan")),  # a start of a header that never completed is text
    # Built-in tools (not served) are part of the thought; the recipient may sit in the role part of the header.
    (THINK + "<|start|>assistant<|channel|>analysis to=python<|message|>print(4)<|call|>", (
        "User asks: 2 + 2?\nprint(4)", None)),
    ("<|start|>assistant to=functions.f<|channel|>commentary<|message|>{}<|end|>",
     (None, "<|channel|>commentary to=functions.f<|message|>{}<|call|>")),
    (THINK + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" + CALL, (
        "User asks: 2 + 2?",
        'Checking.<|channel|>commentary to=functions.get_weather<|message|>{"city": "Oslo"}')),  # a preamble
])
def test_whole_replies_split_into_thought_and_answer(text, want):
    assert HARMONY.split(text) == want


def test_calls_are_read_from_the_answer_with_the_text_before_them():
    _, answer = HARMONY.split(THINK + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" + CALL)
    content, calls = TOOLS.split(answer)
    assert content == "Checking." and [c["function"] for c in calls] == [
        {"name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    assert TOOLS.start(answer) == len("Checking.") and TOOLS.start("Checking.") is None
    assert TOOLS.held("Checking.<|chan") == len("<|chan") and TOOLS.held("Checking.") == 0
    assert TOOLS.partial(answer[:-3]) == [("get_weather", '{"city": "Osl')]  # arguments as they are written
    cut = answer[:-3]  # cut short by max_tokens: not JSON yet, so the reply stays text
    assert TOOLS.split(cut) == (cut, [])
    assert TOOLS.split("Sunny.") == ("Sunny.", [])
    two = TOOLS.split(HARMONY.split(CALL + "<|end|>" + CALL.replace("get_weather", "get_time"))[1])[1]
    assert [c["function"]["name"] for c in two] == ["get_weather", "get_time"]


PIECES = ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "assistant", "analysis", "final", "commentary",
          " to=functions.f", " to=python", " <|constrain|>json", "<|call|>", "<|", "a b", "\n", "{}", " "]


@given(st.lists(st.sampled_from(PIECES), max_size=14), st.lists(st.integers(0, 120), max_size=8))
def test_a_stream_cut_anywhere_splits_as_the_whole_reply_does(parts, cuts):
    text = "".join(parts)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    stream = HARMONY.stream()
    pieces = [stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)] + [stream.feed("", final=True)]
    thought, answer = "".join(t for t, _ in pieces), "".join(a for _, a in pieces)
    assert (thought or None, answer or None) == HARMONY.split(text)


def test_markers_cut_across_pieces_are_held_back():
    stream = HARMONY.stream()
    assert stream.feed("<|chan") == ("", "")
    assert stream.feed("nel|>analysis<|mess") == ("", "")  # a header is not sent until it is whole
    assert stream.feed("age|>Hmm<|e") == ("Hmm", "")  # "<|e" could end the message
    assert stream.feed("nd|><|start|>assistant<|channel|>final<|message|>4") == ("", "4")
    assert stream.feed(".", final=True) == ("", ".")
    assert messages("<|channel|>final<|message|>4<|", final=False)[0].content == "4"


@pytest.mark.parametrize("pieces, want", [
    (["<|channel|>", "analysis", "<|message|>", "Hmm", ".", "<|end|>", "<|start|>", "assistant", "<|channel|>",
      "final", "<|message|>", "4"], 6),  # through the <|end|> of the thought
    (["<|channel|>", "analysis", "<|message|>", "Hmm"], 4),  # never ended: all thought
    (["<|channel|>", "final", "<|message|>", "4"], 0),
    (["Plain", " text"], 0),
])
def test_thought_tokens_count_the_reply_through_the_end_of_its_last_thought(pieces, want):
    ids = list(range(len(pieces)))
    assert HARMONY.thought_tokens(ids, lambda prefix: "".join(pieces[i] for i in prefix)) == want


def test_what_harmony_cannot_serve_is_refused_saying_what_to_do():
    assert HARMONY.special_tokens and not PARSERS["qwen3"].special_tokens
    assert HARMONY.free_thought() == "harmony"  # a structured answer goes in the final channel
    with pytest.raises(ValueError, match="set reasoning_parser to harmony too"):
        SchedulerServiceConfig(tool_call_parser="harmony", reasoning_parser="qwen3")
    assert SchedulerServiceConfig(tool_call_parser="harmony", reasoning_parser="harmony").tool_call_parser == "harmony"
    assert json.loads(TOOLS.split(HARMONY.split(CALL)[1])[1][0]["function"]["arguments"]) == {"city": "Oslo"}
