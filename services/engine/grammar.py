"""Structured output: the tokens a grammar allows next, per sequence, with llguidance.

``SamplingParams.structured_output`` names what the output must match: ``("json", schema text)``,
``("regex", pattern)``, ``("choice", JSON array of strings)`` or ``("grammar", Lark or GBNF)``. llguidance (the
engine vLLM, SGLang and llama.cpp use) compiles it against the checkpoint's tokenizer and, token by token, gives
the set of tokens that keep the output inside the grammar, as a bitmask (bit ``t % 32`` of word ``t // 32`` set
= token ``t`` allowed). Once the grammar is complete only the end-of-sequence tokens are allowed, so a request
ends with ``stop``.

``SamplingParams.free_thought`` puts a reasoning model's thought first: free text up to ``</think>``, then the
spec (``structured_grammar``).

The scheduler validates a spec at admission (a bad schema or regex is INVALID_ARGUMENT with llguidance's
message); the worker that samples keeps a matcher per sequence. A matcher's state is a function of the output
tokens alone, so it is rebuilt wherever the sequence lands: a decode worker after the prefill worker sampled
the first token, a recompute after preemption.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import TYPE_CHECKING

import llguidance
from tokenizers import Tokenizer

from services.common.errors import InvalidArgument
from services.common.sampling_params import STRUCTURED_KINDS

if TYPE_CHECKING:
    import torch

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
    raise InvalidArgument(f"unknown structured output kind {kind!r}; known: {', '.join(STRUCTURED_KINDS)}")


# A reasoning model's thought before the constrained answer (SamplingParams.free_thought), as llguidance Lark: a
# lazy lexeme ends at the first "</think>", as the reasoning parsers split (services/scheduler/reasoning_parsers.py),
# then blanks (Qwen3 and R1 write "\n\n" there), then the answer's own grammar, referenced as a subgrammar so
# that every kind composes the same way.
_BLANKS = r"/[ \t\r\n]*/"
_THOUGHT = {
    "required": f"start: thought {_BLANKS} @answer\nthought[lazy]: " + r"/(?s:.*)<\/think>/",
    "optional": f"start: thought? {_BLANKS} @answer\nthought[lazy]: " + r"/[ \t\r\n]*<think>(?s:.*)<\/think>/",
    # Harmony's markers are special tokens, named as the tokenizer names them: a thought is an analysis message
    # (its text cannot hold a special token, so <|end|> ends it), the answer the final channel's message.
    "harmony": 'start: thought* <|channel|> "final" <|message|> @answer\n'
               'thought: <|channel|> "analysis" <|message|> text <|end|> <|start|> "assistant"\n'
               "text: /(?s:.*)/",
}


def structured_grammar(kind: str, spec: str, free_thought: str = "") -> str:
    """The llguidance grammar for a structured output, after a free thought when ``free_thought`` says so."""
    grammar = llguidance_grammar(kind, spec)
    if not free_thought:
        return grammar
    # json and regex come as llguidance's top-level JSON with one grammar; choice and grammar as Lark text.
    answer = json.loads(grammar)["grammars"][0] if kind in ("json", "regex") else {"lark_grammar": grammar}
    return json.dumps({"grammars": [{"name": "reply", "lark_grammar": _THOUGHT[free_thought]},
                                    {**answer, "name": "answer"}]})


class GrammarCompiler:
    """Compiles and validates structured-output specs for one checkpoint's tokenizer; makes matchers.

    ``vocab_size`` is the model's (the logits' width), which may exceed the tokenizer's; ``eos_token_ids`` are
    the tokens that end a sequence once the grammar is complete."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.mask_words = -(-vocab_size // 32)
        self._eos = list(eos_token_ids)
        self._lltok: llguidance.LLTokenizer | None = None
        # Spec -> a fresh matcher of its grammar: building one parses the grammar (~0.8 ms for a small regex),
        # copying it takes ~2 us.
        self._templates: dict[tuple[str, str, str], llguidance.LLMatcher] = {}
        self._executor: llguidance.LLExecutor | None = None

    @functools.cached_property
    def _end_mask(self) -> torch.Tensor:
        """The mask of a grammar that ended: the end-of-sequence tokens alone."""
        import torch  # the masks are the worker's: the scheduler compiles grammars without torch
        words = [0] * self.mask_words
        for t in self._eos:
            if 0 <= t < self.vocab_size:
                words[t // 32] |= 1 << (t % 32)
        return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        # Built on first use (~20 ms for the built-in model, about a second for a 128K vocabulary): services
        # that never see a structured request never pay it.
        if self._lltok is None:
            self._lltok = llguidance.LLTokenizer(self._tokenizer.to_str(), n_vocab=self.vocab_size,
                                                 eos_token=self._eos or None)
        return self._lltok

    def _template(self, structured: tuple[str, str], free_thought: str) -> llguidance.LLMatcher:
        """The spec's matcher in its start state, compiled and validated against the tokenizer; raises
        InvalidArgument with what is wrong."""
        key = (*structured, free_thought)
        template = self._templates.get(key)
        if template is None:
            grammar = structured_grammar(*structured, free_thought)
            error = llguidance.LLMatcher.validate_grammar(grammar, self.lltokenizer)
            if error:
                raise InvalidArgument(f"structured output ({structured[0]}) is not usable: {error.strip()}")
            template = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0)
            if len(self._templates) >= _MAX_CACHED_GRAMMARS:
                self._templates.pop(next(iter(self._templates)))
            self._templates[key] = template
        return template

    def validate(self, structured: tuple[str, str] | None, free_thought: str = "") -> None:
        if structured is not None:
            self._template(structured, free_thought)

    def matcher(self, structured: tuple[str, str], free_thought: str = "") -> SequenceGrammar:
        return SequenceGrammar(self._template(structured, free_thought).deep_copy())

    def masks(self, grammars: list[SequenceGrammar], outputs: list[list[int]],
              drafts: list[list[int]] | None = None) -> list[torch.Tensor | None]:
        """Each grammar's mask of the tokens allowed after its output tokens, as llguidance's bitmask, computed
        in one call: an int32 ``[1, words]`` tensor, or with ``drafts`` (speculative decoding) ``[1 + len(draft),
        words]``, row j the mask after the output and the first j drafts (the matcher is left where the output
        leaves it). Once a grammar is complete only the end-of-sequence tokens are allowed (also past them: a
        multi-step plan runs past a stop, and the scheduler drops what follows). None for a matcher that
        failed."""
        import torch

        drafts = drafts or [[] for _ in grammars]
        starts = [0]
        for draft in drafts:
            starts.append(starts[-1] + 1 + len(draft))
        # llguidance.torch has helpers for this, but importing it compiles TorchScript kernels this does not use.
        out = torch.zeros(starts[-1], self.mask_words, dtype=torch.int32)
        for k in (k for k, draft in enumerate(drafts) if draft):
            # llguidance writes a draft's row only while the drafts before it are allowed and the grammar has not
            # ended. Past its end only end-of-sequence tokens are allowed, as for a matcher that stopped; a row
            # after a draft the grammar refuses is never kept (the row before cannot sample that draft).
            out[starts[k] + 1:starts[k + 1]] = self._end_mask
        live = [(g.sync(o), starts[k], list(d))
                for k, (g, o, d) in enumerate(zip(grammars, outputs, drafts, strict=True))]
        live = [entry for entry in live if entry[0] is not None]
        if live:
            if self._executor is None:
                # One thread: the worker's cores run the forward pass; batching saves the per-call overhead.
                self._executor = llguidance.LLExecutor(num_threads=1)
            # The draft call refuses a matcher without drafts: those go in the plain call.
            if drafted := [entry for entry in live if entry[2]]:
                self._executor.unsafe_compute_mask_ptr_with_draft_token(drafted, out.data_ptr(),
                                                                        self.mask_words * 4, starts[-1])
            if plain := [(m, row) for m, row, d in live if not d]:
                self._executor.unsafe_compute_mask_ptr(plain, out.data_ptr(), self.mask_words * 4, starts[-1])
        done = {row for _, row, _ in live}
        return [out[starts[k]:starts[k + 1]] if starts[k] in done else None for k in range(len(grammars))]


class SequenceGrammar:
    """One sequence's matcher and how many of its output tokens it has consumed."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher
        self._consumed = 0
        self._failed = False

    def sync(self, output_token_ids: list[int]) -> llguidance.LLMatcher | None:
        """Consumes the output tokens not seen yet; the matcher, or None if it failed (which masking makes
        unreachable: the sequence then samples freely rather than from an empty set)."""
        for token in output_token_ids[self._consumed:]:
            if self._matcher.is_stopped():
                break  # past the end-of-sequence token: the matcher would refuse these, the scheduler drops them
            self._matcher.consume_token(token)
        self._consumed = len(output_token_ids)
        if self._matcher.is_error():
            if not self._failed:  # once, not at every later token
                log.warning("structured output matcher failed: %s", self._matcher.get_error())
                self._failed = True
            return None
        return self._matcher
