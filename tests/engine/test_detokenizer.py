"""Incremental detokenization on a real byte-level BPE tokenizer, and stop-string handling."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from services.common.sampling_params import SamplingParams
from services.engine import detokenizer as detok_module
from services.engine.detokenizer import IncrementalDetokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "The answer is 42, and the question is unknown.",
    "Streaming text one token at a time is what servers do.",
    "hello world, hello tokens",
]


def _train(pre_tokenizer, decoder, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    alphabet = pre_tokenizers.ByteLevel.alphabet() if isinstance(decoder, decoders.ByteLevel) else []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"], initial_alphabet=alphabet)
    tok.train_from_iterator(CORPUS * 3, trainer)
    return tok


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """Byte-level BPE with ~60 merges: characters outside ASCII are split into several byte tokens."""
    return _train(pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel(), 320)


@pytest.fixture(params=["decode_stream", "prefix_offsets"])
def decoder_kind(request, monkeypatch):
    """Run a test with tokenizers' DecodeStream and with the prefix-offset fallback."""
    if request.param == "prefix_offsets":
        monkeypatch.setattr(detok_module, "DecodeStream", None)
    return request.param


def ids_of(tok: Tokenizer, *pieces: str) -> list[list[int]]:
    """Token ids of each piece, so a test controls where token boundaries fall."""
    return [tok.encode(piece).ids for piece in pieces]


def run(tok: Tokenizer, ids: list[int], **params) -> tuple[IncrementalDetokenizer, list[str]]:
    d = IncrementalDetokenizer(tok, SamplingParams(**params))
    deltas = []
    for t in ids:
        deltas.append(d.push(t))
        if d.finished:
            break
    return d, deltas


@pytest.mark.parametrize(
    "text",
    ["plain ascii text", "héllo wörld", "日本語のテキスト", "party 🎉🚀 time 👩‍👩‍👧", "mixed é🎉a日"],
)
def test_round_trips_multibyte_text_split_across_tokens(tok, decoder_kind, text):
    ids = tok.encode(text).ids
    if not text.isascii():  # the point of the test: some token is a fragment of a character
        assert any("\ufffd" in tok.decode([t]) for t in ids)
    d, deltas = run(tok, ids)
    assert "".join(deltas) + d.flush() == text == d.text
    assert all("\ufffd" not in delta for delta in deltas)


def test_holds_back_a_partial_stop_string_and_releases_it_when_ruled_out(tok, decoder_kind):
    pieces = ids_of(tok, "x S", "TA", "R")
    d = IncrementalDetokenizer(tok, SamplingParams(stop=("STOP",)))
    deltas = ["".join(d.push(t) for t in piece) for piece in pieces]
    assert deltas == ["x ", "STA", "R"]
    assert not d.finished and d.text == "x STAR"


def test_stops_on_a_stop_string_spanning_two_tokens(tok, decoder_kind):
    pieces = ids_of(tok, "The answer", " is 4", "2ST", "OP", " extra")
    d = IncrementalDetokenizer(tok, SamplingParams(stop=("STOP",)))
    deltas = []
    for piece in pieces:
        deltas.append("".join(d.push(t) for t in piece))
        if d.finished:
            break
    assert deltas == ["The answer", " is 4", "2", ""]
    assert d.finished_by_stop_string == "STOP"
    assert d.text == "The answer is 42"
    assert d.flush() == ""
    with pytest.raises(RuntimeError, match="after the output finished on stop string 'STOP'"):
        d.push(pieces[-1][0])


def test_include_stop_str_in_output(tok, decoder_kind):
    pieces = ids_of(tok, "The answer", " is 4", "2ST", "OP", " extra")
    d = IncrementalDetokenizer(tok, SamplingParams(stop=("STOP",), include_stop_str_in_output=True))
    deltas = []
    for piece in pieces:
        deltas.append("".join(d.push(t) for t in piece))
        if d.finished:
            break
    assert "".join(deltas) == "The answer is 42STOP" == d.text
    assert d.finished_by_stop_string == "STOP"


def test_flush_releases_held_back_text(tok):
    d, deltas = run(tok, tok.encode("ab S").ids, stop=("STOP",))
    assert "".join(deltas) == "ab "
    assert d.flush() == "S" and d.text == "ab S" and not d.finished


def test_earliest_of_several_stop_strings_wins(tok):
    d, deltas = run(tok, tok.encode("hello world").ids, stop=("world", "lo w"))
    assert d.finished_by_stop_string == "lo w"
    assert "".join(deltas) == "hel" == d.text
    # Both complete within one token: the earlier occurrence wins, not the first listed.
    assert len(tok.encode("hello").ids) == 1
    d, deltas = run(tok, tok.encode("hello").ids, stop=("llo", "el"))
    assert d.finished_by_stop_string == "el" and d.text == "h"


def test_stop_string_inside_one_token(tok):
    d, deltas = run(tok, tok.encode("hello tokens").ids, stop=("ll",))
    assert "".join(deltas) == "he" and d.finished_by_stop_string == "ll"


def test_stop_strings_are_ignored_before_min_tokens(tok):
    ids = [t for piece in ids_of(tok, "S", "TOP", "a", "STOP") for t in piece]
    d, deltas = run(tok, ids, stop=("STOP",), min_tokens=3, max_tokens=10)
    assert d.finished_by_stop_string == "STOP"
    assert "".join(deltas) == "STOPa" == d.text


def test_special_tokens_are_skipped_unless_asked(tok):
    eos = tok.token_to_id("<eos>")
    ids = [*tok.encode("hello").ids, eos]
    assert "".join(IncrementalDetokenizer(tok, SamplingParams()).push(t) for t in ids) == "hello"
    keep = IncrementalDetokenizer(tok, SamplingParams(), skip_special_tokens=False)
    assert "".join(keep.push(t) for t in ids) == "hello<eos>"


def test_prompt_priming_keeps_the_first_leading_space(decoder_kind):
    tok = _train(pre_tokenizers.Metaspace(), decoders.Metaspace(), 200)
    prompt, output = tok.encode("the quick").ids, tok.encode("brown fox").ids
    assert tok.id_to_token(output[0]).startswith("\u2581")
    unprimed = IncrementalDetokenizer(tok, SamplingParams())
    assert "".join(unprimed.push(t) for t in output) == "brown fox"
    primed = IncrementalDetokenizer(tok, SamplingParams(), prompt_token_ids=prompt)
    assert "".join(primed.push(t) for t in output) == " brown fox"


# Pieces that often form stop strings and their prefixes, so near misses and splits are common.
TEXT_PIECES = st.sampled_from(["a", "b", " ", "S", "T", "OP", "STO", "é", "🎉", "日", "\n"])


@settings(max_examples=300, deadline=None)
@given(
    chars=st.lists(TEXT_PIECES, max_size=20),
    stops=st.lists(st.sampled_from(["STOP", "ST", "TOPS", "é🎉", "a b", "\n\n", "🎉"]), max_size=3),
    include=st.booleans(),
)
def test_stream_is_always_a_prefix_of_the_final_text(tok, chars, stops, include):
    """Whatever the split, the client sees the final text, never anything it would have to take back."""
    text = "".join(chars)
    expected = text
    matches = [(text.find(s), s) for s in stops if s in text]
    if matches:
        start, stop = min(matches, key=lambda m: (m[0], stops.index(m[1])))
        expected = text[: start + (len(stop) if include else 0)]
    params = SamplingParams(stop=tuple(stops), include_stop_str_in_output=include)
    for kind in ("decode_stream", "prefix_offsets"):
        d = IncrementalDetokenizer(tok, params)
        if kind == "prefix_offsets":
            d._decoder = detok_module._OffsetDecoder(tok, True, ())
        seen = ""
        for t in tok.encode(text).ids:
            seen += d.push(t)
            assert expected.startswith(seen), (kind, seen)
            if d.finished:
                break
        seen += d.flush()
        assert seen == expected == d.text, kind
        assert (d.finished_by_stop_string is not None) == bool(matches)


@pytest.mark.parametrize("stops", [(), ("STOP", "é🎉")])
def test_a_long_output_keeps_only_a_short_tail_to_search(tok, stops):
    """Text that no stop string can still reach is settled: the tail stays as short as the longest stop string
    plus a token, whatever the length of the output (the whole text used to be copied on every token)."""
    body = "The quick brown fox, é and 🎉 and STO P. " * 150
    text = body + "STOP and more"
    params = SamplingParams(stop=stops)
    d = IncrementalDetokenizer(tok, params)
    seen, longest_tail = "", 0
    for t in tok.encode(text).ids:
        seen += d.push(t)
        longest_tail = max(longest_tail, len(d._tail))
        if d.finished:
            break
    seen += d.flush()
    expected = body if stops else text
    assert seen == expected == d.text
    assert longest_tail <= max((len(s) for s in stops), default=0) + 8, longest_tail
