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


def _pieces(*texts):
    """A reply as token ids over a vocabulary of the given pieces (one token each), and its decoder."""
    vocab = list(dict.fromkeys(texts))
    return [vocab.index(t) for t in texts], lambda ids: "".join(vocab[i] for i in ids)


@pytest.mark.parametrize("parser, pieces, constrained, want", [
    (QWEN3, ("<think>", "plan", "</", "think>", "\n", "Answer."), False, 4),  # through the token closing it
    (QWEN3, ("<", "think>", "a", "</think>", "b"), False, 4),
    (R1, ("plan", "more", "</think>", "Answer."), False, 3),  # the template opened the thought
    (R1, ("never", " closed"), False, 2),  # all of it
    (QWEN3, ("Just", " an", " answer"), False, 0),
    (QWEN3, ("An", " answer", " naming", " </think>"), False, 0),  # the marker inside an answer
    (R1, ("{", "}"), True, 0),  # a grammar wrote it from the first token, with no thought
    (QWEN3, ("<think>", "</think>", "x"), False, 2),  # an empty thought still costs its markers
])
def test_thought_tokens_count_the_reply_through_the_token_that_closes_the_thought(parser, pieces, constrained,
                                                                                  want):
    ids, decode = _pieces(*pieces)
    assert parser.thought_tokens(ids, decode, constrained=constrained) == want


SEED = PARSERS["seed_oss"]


def test_seed_oss_thinks_inside_its_own_markers_decoded_with_special_tokens():
    assert SEED.special_tokens and SEED.split("<seed:think>plan</seed:think>Answer.") == ("plan", "Answer.")
    assert SEED.split("Answer without thinking.") == (None, "Answer without thinking.")
    assert SEED.split("<think>not its marker</think>x") == (None, "<think>not its marker</think>x")
    ids, decode = _pieces("<seed:think>", "plan", "</seed:", "think>", "Answer.")
    assert SEED.thought_tokens(ids, decode) == 4
    stream = ReasoningStream(SEED)
    assert stream.feed("<seed:th") == ("", "") and stream.feed("ink>a</seed:") == ("a", "")
    assert stream.feed("think>b", final=True) == ("", "b")
    # The grammar's thought is written with <think> markers: a structured answer after this one is refused.
    with pytest.raises(InvalidArgument, match="--structured-output-in-reasoning"):
        SEED.free_thought()
    assert SEED.split("<seed:think>x</seed:think>{}", constrained=True) == ("x", "{}")


GEMMA4 = PARSERS["gemma4"]


@pytest.mark.parametrize("text, want", [
    ("<|channel>thought\nplan\nmore<channel|>Answer.", ("plan\nmore", "Answer.")),
    ("\n<|channel>thought\nplan<channel|>\nAnswer.", ("plan", "\nAnswer.")),
    ("Answer without thinking.", (None, "Answer without thinking.")),  # the template did not enable thinking
    ("<|channel>thought\n<channel|>Answer.", (None, "Answer.")),  # an empty thought
    ("<|channel>thought\nstill thinking when cut", ("still thinking when cut", None)),
    ("<|channel>thoug", ("thoug", None)),  # cut inside the channel name: what there is, kept as written
    ("<|channel>plan<channel|>x", ("plan", "x")),  # no channel name: the thought as written
    ("<think>not its marker</think>x", (None, "<think>not its marker</think>x")),
    ("<|chan", (None, "<|chan")),
])
def test_gemma4_thinks_in_its_thought_channel_whose_name_is_neither_thinking_nor_answer(text, want):
    assert GEMMA4.special_tokens and not GEMMA4.open_optional
    assert GEMMA4.split(text) == want


def test_gemma4_holds_back_markers_and_the_channel_name_cut_across_pieces():
    stream = ReasoningStream(GEMMA4)
    assert stream.feed("<|chan") == ("", "") and stream.feed("nel>") == ("", "")
    assert stream.feed("thou") == ("", "") and stream.feed("ght") == ("", "")  # may still be the channel name
    assert stream.feed("\npl") == ("pl", "")
    assert stream.feed("an<chan") == ("an", "")  # "<chan" could close the thought
    assert stream.feed("nel|>An") == ("", "An")
    assert stream.feed("swer", final=True) == ("", "swer")


@given(st.lists(st.sampled_from(["<|channel>", "<channel|>", "<|chan", "nel>", "<chan", "nel|>", "thought", "thou",
                                 "ght", "\n", "a", " ", "<"]), max_size=12),
       st.lists(st.integers(0, 60), max_size=6))
def test_a_gemma4_stream_cut_anywhere_splits_as_the_whole_reply_does(parts, cuts):
    text = "".join(parts)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    stream = ReasoningStream(GEMMA4)
    pieces = [stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)] + [stream.feed("", final=True)]
    thought, answer = "".join(t for t, _ in pieces), "".join(a for _, a in pieces)
    assert (thought or None, answer or None) == GEMMA4.split(text)


def test_gemma4_thought_tokens_and_a_structured_answer_after_its_thought():
    ids, decode = _pieces("<|channel>", "thought", "\n", "plan", "<channel|>", "Answer.")
    assert GEMMA4.thought_tokens(ids, decode) == 5  # through the token closing it, its channel name included
    ids, decode = _pieces("<|channel>", "thought", "\n", "<channel|>", "Answer.")
    assert GEMMA4.thought_tokens(ids, decode) == 4  # an empty thought still costs its markers
    ids, decode = _pieces("Just", " an", " answer")
    assert GEMMA4.thought_tokens(ids, decode) == 0
    # The grammar's thought is written with <think> markers: a structured answer after this one is refused.
    with pytest.raises(InvalidArgument, match="after a <\\|channel> thought is not supported"):
        GEMMA4.free_thought()
    assert GEMMA4.split("<|channel>thought\nx<channel|>{}", constrained=True) == ("x", "{}")
    assert GEMMA4.split("{}", constrained=True) == (None, "{}")
