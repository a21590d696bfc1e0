"""Structured output: the tokens a grammar allows next, per sequence, with llguidance.

``SamplingParams.structured_output`` names what the output must match: ``("json", schema text)``,
``("regex", pattern)``, ``("choice", JSON array of strings)`` or ``("grammar", Lark or GBNF)``. llguidance (the
engine vLLM, SGLang and llama.cpp use) compiles it against the checkpoint's tokenizer and, token by token, gives
the set of tokens that keep the output inside the grammar, as a bitmask (bit ``t % 32`` of word ``t // 32`` set
= token ``t`` allowed). Once the grammar is complete only the end-of-sequence tokens are allowed, so a request
ends with ``stop``.

The scheduler validates a spec at admission (a bad schema or regex is INVALID_ARGUMENT with llguidance's
message); the worker that samples keeps a matcher per sequence. A matcher's state is a function of the output
tokens alone, so it is rebuilt wherever the sequence lands: a decode worker after the prefill worker sampled
the first token, a recompute after preemption.
"""

from __future__ import annotations

import json
import logging

import llguidance
import torch
from tokenizers import Tokenizer

from services.common.errors import InvalidArgument

log = logging.getLogger(__name__)

# Specs kept compiled per compiler (a service's lifetime): clients tend to send the same few schemas.
_MAX_CACHED_GRAMMARS = 256
# JSON as json.dumps writes it. llguidance's default allows any whitespace between tokens, and a weak model then
# can spend its whole budget on whitespace (why vLLM grew --disable-any-whitespace); a schema's own
# "x-guidance" options still override this.
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def llguidance_grammar(kind: str, spec: str) -> str:
    """The llguidance grammar for one ``SamplingParams.structured_output``; raises InvalidArgument where the
    spec is not even well formed (an invalid schema or regex is caught by ``GrammarCompiler.validate``)."""
    try:
        if kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=_JSON_LAYOUT)
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec)
        if kind == "choice":
            return llguidance.grammar_from("choice", json.loads(spec))
        if kind == "grammar":
            return llguidance.grammar_from("grammar", spec)
    except ValueError as exc:
        raise InvalidArgument(f"structured output ({kind}): {exc}") from None
    raise InvalidArgument(f"unknown structured output kind {kind!r}; known: json, regex, choice, grammar")


class GrammarCompiler:
    """Compiles and validates structured-output specs for one checkpoint's tokenizer; makes matchers.

    ``vocab_size`` is the model's (the logits' width), which may exceed the tokenizer's; ``eos_token_ids`` are
    the tokens that end a sequence once the grammar is complete."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._lltok: llguidance.LLTokenizer | None = None
        self._grammars: dict[tuple[str, str], str] = {}

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        # Built on first use (~20 ms for the built-in model, about a second for a 128K vocabulary): services
        # that never see a structured request never pay it.
        if self._lltok is None:
            self._lltok = llguidance.LLTokenizer(self._tokenizer.to_str(), n_vocab=self.vocab_size,
                                                 eos_token=self._eos or None)
        return self._lltok

    def grammar(self, structured: tuple[str, str]) -> str:
        """The compiled grammar, validated against the tokenizer; raises InvalidArgument with what is wrong."""
        grammar = self._grammars.get(structured)
        if grammar is None:
            grammar = llguidance_grammar(*structured)
            error = llguidance.LLMatcher.validate_grammar(grammar, self.lltokenizer)
            if error:
                raise InvalidArgument(f"structured output ({structured[0]}) is not usable: {error.strip()}")
            if len(self._grammars) >= _MAX_CACHED_GRAMMARS:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[structured] = grammar
        return grammar

    def validate(self, structured: tuple[str, str] | None) -> None:
        if structured is not None:
            self.grammar(structured)

    def matcher(self, structured: tuple[str, str]) -> SequenceGrammar:
        return SequenceGrammar(llguidance.LLMatcher(self.lltokenizer, self.grammar(structured), log_level=0),
                               self.vocab_size)


class SequenceGrammar:
    """One sequence's matcher and how many of its output tokens it has consumed."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._consumed = 0
        # llguidance.torch has helpers for this, but importing it compiles TorchScript kernels this does not use.
        self._bitmask = torch.zeros(1, -(-vocab_size // 32), dtype=torch.int32)

    def next_mask(self, output_token_ids: list[int]) -> torch.Tensor | None:
        """The bitmask of tokens allowed after ``output_token_ids`` (int32, [1, words]): once the grammar is
        complete, only the end-of-sequence tokens (also past them: a multi-step plan runs past a stop, and the
        scheduler drops what follows). None if the matcher failed, which masking makes unreachable; the
        sequence then samples freely rather than from an empty set."""
        for token in output_token_ids[self._consumed:]:
            if self._matcher.is_stopped():
                break  # past the end-of-sequence token: the matcher would refuse these, the scheduler drops them
            self._matcher.consume_token(token)
        self._consumed = len(output_token_ids)
        if self._matcher.is_error():
            log.warning("structured output matcher failed: %s", self._matcher.get_error())
            return None
        self._matcher.unsafe_compute_mask_ptr(self._bitmask.data_ptr(), self._bitmask.numel() * 4)
        return self._bitmask
