"""Reasoning parsers, as plain data: whole replies, and streams cut anywhere giving the same split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.errors import InvalidArgument
from services.scheduler.reasoning_parsers import PARSERS, ReasoningStream, reasoning_parser

R1, QWEN3 = PARSERS["deepseek_r1"], PARSERS["qwen3"]


@pytest.mark.parametrize("parser, text, want", [
    (QWEN3, "<think>\nplan</think>\n\nAnswer.", ("\nplan", "\n\nAnswer.")),
    (QWEN3, "  <think>plan</think>Answer.", ("plan", "Answer.")),
    (QWEN3, "Answer without thinking.", (None, "Answer without thinking.")),
    (QWEN3, "<think>still thinking when cut", ("still thinking when cut", None)),
    (QWEN3, "<think></think>Answer.", (None, "Answer.")),  # enable_thinking false writes an empty thought
    (R1, "plan</think>Answer.", ("plan", "Answer.")),  # the template opened the thought
    (R1, "<think>plan</think>Answer.", ("plan", "Answer.")),
    (R1, "never closed", ("never closed", None)),
    (R1, "", (None, None)),
    (QWEN3, "<thi", (None, "<thi")),  # a start of the marker that never completed is answer
])
def test_whole_replies_split_into_thinking_and_answer(parser, text, want):
    assert parser.split(text) == want


def test_a_constrained_reply_is_thinking_only_if_it_opens_a_thought():
    assert R1.split('{"a": 1}', constrained=True) == (None, '{"a": 1}')
    assert R1.split("<think>x</think>{}", constrained=True) == ("x", "{}")


def test_markers_cut_across_pieces_are_held_back_until_decided():
    stream = ReasoningStream(QWEN3)
    assert stream.feed(" <th") == ("", "")
    assert stream.feed("ink>pla") == ("pla", "")
    assert stream.feed("n</th") == ("n", "")  # "</th" could close the thought
    assert stream.feed("at is") == ("</that is", "")  # it did not
    assert stream.feed("</think>A") == ("", "A")
    assert stream.feed("nswer", final=True) == ("", "nswer")


@given(st.sampled_from(["deepseek_r1", "qwen3"]),
       st.lists(st.sampled_from(["<think>", "</think>", "<th", "ink>", "</", "think>", "a", " ", "\n", "xy<"]),
                max_size=12),
       st.lists(st.integers(0, 40), max_size=6))
def test_a_stream_cut_anywhere_splits_as_the_whole_reply_does(name, parts, cuts):
    parser, text = PARSERS[name], "".join(parts)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    stream = ReasoningStream(parser)
    pieces = [stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)] + [stream.feed("", final=True)]
    thought, answer = "".join(t for t, _ in pieces), "".join(a for _, a in pieces)
    assert (thought or None, answer or None) == parser.split(text)


def test_unknown_parser_names_are_refused_with_the_choices():
    assert reasoning_parser(None) is None and reasoning_parser("qwen3") is QWEN3
    with pytest.raises(InvalidArgument, match="deepseek_r1, qwen3"):
        reasoning_parser("o1")
