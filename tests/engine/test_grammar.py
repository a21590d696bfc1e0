"""Structured output: specs compiled and validated against the built-in tokenizer, masks per sequence."""

from __future__ import annotations

import json

import pytest
import torch

from services.common.errors import InvalidArgument
from services.engine.checkpoint import load_checkpoint_meta
from services.engine.grammar import GrammarCompiler
from tests.renamed_tokens import rename_tokens


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir):
    return load_checkpoint_meta(tiny_model_dir)


@pytest.fixture(scope="module")
def compiler(checkpoint):
    return GrammarCompiler(checkpoint.tokenizer, checkpoint.config.vocab_size, checkpoint.eos_token_ids)


def allowed(mask: torch.Tensor, vocab: int) -> set[int]:
    t = torch.arange(vocab)
    return set(torch.nonzero((mask[0][t // 32] >> (t % 32)) & 1).flatten().tolist())


def next_mask(compiler, grammar, output):
    (mask,) = compiler.masks([grammar], [output])
    return mask


def walk(compiler, checkpoint, structured, pick, steps=60) -> list[int]:
    """Tokens chosen by ``pick(allowed set)`` under the grammar, up to and including an end-of-sequence token."""
    grammar, out = compiler.matcher(structured), []
    for _ in range(steps):
        out.append(pick(sorted(allowed(next_mask(compiler, grammar, out), compiler.vocab_size))))
        if out[-1] in checkpoint.eos_token_ids:
            break
    return out


@pytest.mark.parametrize("structured, fragment", [
    (("json", '{"type": "nonsense"}'), "Invalid type"),
    (("regex", "[a-"), "unclosed character class"),
    (("grammar", "start: missing_rule"), "missing_rule"),
    (("choice", "not json"), "structured output (choice)"),
    (("yaml", "a: 1"), "unknown structured output kind 'yaml'"),
])
def test_a_spec_that_cannot_be_compiled_is_invalid_argument_with_the_reason(compiler, structured, fragment):
    with pytest.raises(InvalidArgument) as exc:
        compiler.validate(structured)
    assert fragment in str(exc.value)


def test_the_first_tokens_follow_the_spec(compiler, checkpoint):
    decode = checkpoint.tokenizer.decode
    first = allowed(next_mask(compiler, compiler.matcher(("json", '{"type": "object"}')), []), compiler.vocab_size)
    assert first and all(decode([t]).startswith("{") for t in first)
    first = allowed(next_mask(compiler, compiler.matcher(("choice", '["yes", "no"]')), []), compiler.vocab_size)
    assert first and all("yes".startswith(decode([t])) or "no".startswith(decode([t])) for t in first)
    compiler.validate(None)  # free text: nothing to check


@pytest.mark.parametrize("seed", range(3))
def test_any_walk_through_the_masks_is_valid_json_of_the_schema_then_eos(compiler, checkpoint, seed):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green"]}},
              "required": ["ok", "color"], "additionalProperties": False}
    rng = torch.Generator().manual_seed(seed)
    out = walk(compiler, checkpoint, ("json", json.dumps(schema)),
               lambda ids: ids[int(torch.randint(len(ids), (1,), generator=rng))])
    assert out[-1] in checkpoint.eos_token_ids
    value = json.loads(checkpoint.tokenizer.decode(out[:-1]))
    assert set(value) == {"ok", "color"} and isinstance(value["ok"], bool) and value["color"] in ("red", "green")


def test_once_complete_only_end_of_sequence_is_allowed_even_past_it(compiler, checkpoint):
    out = walk(compiler, checkpoint, ("regex", "ab"), lambda ids: ids[0])
    grammar = compiler.matcher(("regex", "ab"))
    assert checkpoint.tokenizer.decode(out[:-1]) == "ab"
    assert allowed(next_mask(compiler, grammar, out[:-1]), compiler.vocab_size) <= set(checkpoint.eos_token_ids)
    # A multi-step plan runs on past the stop; the mask stays at end-of-sequence, never empty.
    assert allowed(next_mask(compiler, grammar, out + [out[-1]]), compiler.vocab_size) <= set(checkpoint.eos_token_ids)


def test_a_matcher_made_later_catches_up_on_tokens_sampled_elsewhere(compiler, checkpoint):
    """The decode worker (or a recompute) builds its matcher from the output tokens so far: same masks."""
    structured = ("grammar", 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,3}/')
    out = walk(compiler, checkpoint, structured, lambda ids: ids[len(ids) // 2])
    here = compiler.matcher(structured)
    for k in range(len(out)):
        there = compiler.matcher(structured)  # sees the first k tokens at once
        assert torch.equal(next_mask(compiler, here, out[:k]), next_mask(compiler, there, out[:k])), k


def test_matchers_of_one_spec_are_copies_of_one_compiled_grammar_and_independent(compiler, checkpoint):
    spec = ("regex", "[0-9]+")
    a, b = compiler.matcher(spec), compiler.matcher(spec)
    assert len([k for k in compiler._templates if k[:2] == spec]) == 1
    digit = checkpoint.tokenizer.encode("7").ids[0]
    assert not torch.equal(next_mask(compiler, a, [digit]), next_mask(compiler, b, []))  # a moved on, b did not


def test_masks_for_a_batch_equal_the_masks_one_by_one(compiler, checkpoint):
    specs = [("regex", "[0-9]+"), ("json", '{"type": "object"}'), ("choice", '["yes", "no"]'), ("regex", "ab")]
    outputs = [checkpoint.tokenizer.encode(t).ids for t in ("12", '{"a', "", "a")]
    batch = compiler.masks([compiler.matcher(s) for s in specs], outputs)
    for spec, output, mask in zip(specs, outputs, batch, strict=True):
        assert torch.equal(mask, next_mask(compiler, compiler.matcher(spec), output)), spec


SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                     "additionalProperties": False})


def feed(compiler, checkpoint, structured, free_thought, text):
    """The mask after ``text``'s tokens (each checked to be allowed where it was written)."""
    grammar, out = compiler.matcher(structured, free_thought), []
    for token in checkpoint.tokenizer.encode(text).ids:
        assert token in allowed(next_mask(compiler, grammar, out), compiler.vocab_size), (text, out)
        out.append(token)
    return allowed(next_mask(compiler, grammar, out), compiler.vocab_size)


def test_a_required_thought_is_free_text_up_to_its_end_then_the_spec_applies(compiler, checkpoint):
    decode, eos = checkpoint.tokenizer.decode, set(checkpoint.eos_token_ids)
    structured = ("json", SCHEMA)
    # Thinking: anything, JSON-like or not, and no end of sequence (the answer has not come yet).
    thinking = feed(compiler, checkpoint, structured, "required", '<think>{ "no": json here\n')
    assert len(thinking) > compiler.vocab_size // 2 and not thinking & eos
    # After </think>: blanks, then the schema's JSON, then only the end.
    after = feed(compiler, checkpoint, structured, "required", "<think>hmm</think>\n\n")
    assert after and all(decode([t]).strip() in ("", "{") or decode([t]).lstrip().startswith("{") for t in after)
    assert feed(compiler, checkpoint, structured, "required", 'hmm</think>\n\n{"a": 12}') <= eos
    # The template opened the thought: JSON at the start is still thinking.
    assert not feed(compiler, checkpoint, structured, "required", '{"a": 12}') <= eos


def test_an_optional_thought_may_be_left_out_and_any_kind_of_spec_follows_one(compiler, checkpoint):
    eos = set(checkpoint.eos_token_ids)
    assert feed(compiler, checkpoint, ("json", SCHEMA), "optional", '{"a": 1}') <= eos
    assert feed(compiler, checkpoint, ("json", SCHEMA), "optional", '<think>x</think>{"a": 1}') <= eos
    for structured, answer in [(("regex", "[0-9]+/x"), "12/x"), (("choice", '["yes", "no"]'), "no"),
                               (("grammar", 'start: "a" b\nb: "c"'), "ac")]:
        assert feed(compiler, checkpoint, structured, "optional", f"<think>1 {{</think>\n{answer}") <= eos
        assert feed(compiler, checkpoint, structured, "required", f"1 {{</think>\n{answer}") <= eos
    # Without the thought's opening tag the reply is the answer from its first token.
    first = feed(compiler, checkpoint, ("choice", '["yes", "no"]'), "optional", "")
    assert {checkpoint.tokenizer.decode([t]).strip()[:1] for t in first} <= {"", "<", "y", "n"}


def test_masks_along_drafts_are_the_masks_token_by_token_and_leave_the_matcher_where_it_was(compiler, checkpoint):
    """Speculative decoding: row j is the mask after the output and the first j drafts. Past a draft the
    grammar refuses nothing is kept, and past its end only the end-of-sequence tokens are allowed."""
    encode, vocab, eos = checkpoint.tokenizer.encode, compiler.vocab_size, set(checkpoint.eos_token_ids)
    spec = ("regex", "(ab|cd)+x")
    good = encode("ab").ids + encode("cd").ids
    for drafts, refused_at in ((good + encode("x").ids + [1, 1], None), (good + encode("zz").ids + good, len(good))):
        grammar, plain = compiler.matcher(spec), compiler.matcher(spec)
        output = encode("ab").ids
        (masks,) = compiler.masks([grammar], [output], [drafts])
        assert masks.shape == (1 + len(drafts), compiler.mask_words)
        for j in range(1 + len(drafts)):
            if refused_at is not None and j > refused_at:
                break  # never sampled from: the row before cannot sample the refused draft
            expected = allowed(next_mask(compiler, plain, output + drafts[:j]), vocab)
            assert allowed(masks[j:j + 1], vocab) == expected, j
        if refused_at is None:
            assert allowed(masks[-1:], vocab) == eos  # past the end
        # The sequence's matcher stayed after its output: its next mask is row 0's.
        assert torch.equal(next_mask(compiler, grammar, output), masks[:1])


def test_a_batch_mixes_matchers_with_and_without_drafts(compiler):
    specs = [("regex", "[a-c]+"), ("choice", '["yes", "no"]'), ("regex", "[0-9]{2}")]
    grammars = [compiler.matcher(s) for s in specs]
    drafted = compiler.masks(grammars, [[], [], []], [[], [3], []])
    assert [m.shape[0] for m in drafted] == [1, 2, 1]
    alone = [next_mask(compiler, compiler.matcher(s), []) for s in specs]
    assert all(torch.equal(m[:1], a) for m, a in zip(drafted, alone, strict=True))


@pytest.fixture(scope="module")
def harmony(tiny_model_dir):
    """The built-in tokenizer with four special tokens renamed to harmony's markers, and a compiler for it."""
    from tokenizers import Tokenizer

    raw = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    names = {2: "<|end|>", 3: "<|channel|>", 4: "<|message|>", 0: "<|start|>"}
    tokenizer = Tokenizer.from_str(json.dumps(rename_tokens(raw, names)))
    checkpoint = load_checkpoint_meta(tiny_model_dir)
    return tokenizer, GrammarCompiler(tokenizer, checkpoint.config.vocab_size, checkpoint.eos_token_ids)


def test_a_harmony_thought_is_any_analysis_messages_then_the_spec_in_the_final_channel(harmony):
    tokenizer, compiler = harmony
    eos = set(compiler._eos)

    def feed_harmony(text):
        grammar, out = compiler.matcher(("json", SCHEMA), "harmony"), []
        for token in tokenizer.encode(text).ids:
            if token not in allowed(next_mask(compiler, grammar, out), compiler.vocab_size):
                return None  # refused here
            out.append(token)
        return allowed(next_mask(compiler, grammar, out), compiler.vocab_size)

    thought = "<|channel|>analysis<|message|>{ not json, any text\n<|end|><|start|>assistant"
    final = '<|channel|>final<|message|>{"a": 7}'
    assert feed_harmony(final) <= eos and feed_harmony(thought + final) <= eos
    assert feed_harmony(thought + thought + final) <= eos
    # Inside a thought: free text and its end, no other marker, no end of sequence.
    inside = feed_harmony("<|channel|>analysis<|message|>hmm")
    assert 2 in inside and not inside & ({0, 3, 4} | eos) and len(inside) > compiler.vocab_size // 2
    # The final channel's header is required before the answer, and the answer is the spec's.
    assert feed_harmony('{"a": 7}') is None and feed_harmony("<|channel|>commentary") is None
    after_header = feed_harmony("<|channel|>final<|message|>")
    assert {tokenizer.decode([t]) for t in after_header} <= {"{", " {"} | {tokenizer.decode([t]) for t in eos}
