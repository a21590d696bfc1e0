"""How one request wants its tokens chosen and when it stops: pure data, shared by every service.

This module imports no torch: the scheduler core carries ``SamplingParams`` and calls ``check_stop``.
The engine's ``Sampler`` (services/engine/sampler.py) turns the params into logits processing, and the
``IncrementalDetokenizer`` (services/engine/detokenizer.py) handles stop *strings*; ``check_stop`` here
handles the token-level stops (eos, ``stop_token_ids``, ``max_tokens``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from services.common.errors import InvalidArgument

MAX_LOGPROBS = 20
MAX_SEED = 2**63
# Token ids and counts travel as uint32 in the contract (common.proto SamplingParams): larger ones are refused
# here, at intake, not found when the scheduler converts a plan holding them.
MAX_UINT32 = 2**32 - 1
# Temperature and penalties travel as float32: past its largest value they would arrive as inf, and the
# sampler's fp32 math would turn masked logits into NaN (a worker's step fails, and so would the next
# worker's the request is moved to).
MAX_FLOAT32 = 3.4028234663852886e38
# Below float32's smallest normal number a top_p or repetition_penalty could arrive as 0, which the contract
# reads as "unset" (1.0): the opposite of what was asked.
MIN_FLOAT32 = 1.1754943508222875e-38
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value is [-100, 100]
# bad_words: each is checked against the output at every token, so a request may not name without bound.
MAX_BAD_WORDS = 1024
# What SamplingParams.structured_output can constrain the output to (services/engine/grammar.py compiles them).
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar")
# Where a reasoning model's free thought ends and the structured output begins (SamplingParams.free_thought):
# "" none; "required": up to the first "</think>" (the template opened it); "optional": a "<think>...</think>"
# the reply may open with; "harmony": gpt-oss's analysis-channel messages, then the final channel's header.
FREE_THOUGHTS = ("", "required", "optional", "harmony")
ANY_JSON_OBJECT = '{"type": "object"}'
# Temperatures below this are treated as greedy: dividing logits by them overflows fp32.
GREEDY_TEMPERATURE = 1e-5


class FinishReason:
    """Why a request finished, as the OpenAI API spells it."""

    STOP = "stop"  # eos, a stop token id or a stop string
    LENGTH = "length"  # max_tokens (or the model's context) reached
    ABORT = "abort"  # cancelled by the client or the server
    ERROR = "error"  # the server could not run it (e.g. it can never fit the KV pool)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping options. Invalid values raise ``InvalidArgument`` on construction."""

    # Most tokens to generate, >= 1.
    max_tokens: int = 16
    # Softmax temperature, >= 0; 0 (anything below 1e-5) means greedy and ignores top_k/top_p/min_p.
    temperature: float = 1.0
    # Keep only the k most likely tokens (ties at the k-th logit are kept); 0 or -1 turns it off.
    top_k: int = 0
    # Keep the smallest set of most likely tokens whose probability sums to >= top_p, in (0, 1].
    top_p: float = 1.0
    # Drop tokens whose probability is below min_p times the top token's, in [0, 1].
    min_p: float = 0.0
    # Makes sampling reproducible: the k-th output token depends only on (seed, k, logits). 0 <= seed < 2**63.
    seed: int | None = None
    # Hugging Face semantics over prompt + output tokens: positive logits divided, negative multiplied. > 0.
    repetition_penalty: float = 1.0
    # OpenAI semantics over output tokens: logit -= presence_penalty if the token occurred. In [-2, 2].
    presence_penalty: float = 0.0
    # OpenAI semantics over output tokens: logit -= frequency_penalty * count. In [-2, 2].
    frequency_penalty: float = 0.0
    # Stop strings; the output text ends before the first one (see include_stop_str_in_output). Non-empty.
    stop: tuple[str, ...] = ()
    # Token ids that end the request (the token itself is part of the output token ids).
    stop_token_ids: tuple[int, ...] = ()
    # Keep generating past the model's eos token(s).
    ignore_eos: bool = False
    # eos and stop_token_ids are suppressed (and stop strings ignored) until this many tokens exist. <= max_tokens.
    min_tokens: int = 0
    # Return this many top logprobs per sampled token (plus the sampled token's own), 0..20; None = none.
    logprobs: int | None = None
    # Keep the matched stop string at the end of the output text.
    include_stop_str_in_output: bool = False
    # Score the prompt too: each prompt token after the first gets its logprob (and this many most likely
    # candidates), 0..20; None = not. Every prompt position is then computed: the prefix cache is not used.
    prompt_logprobs: int | None = None
    # OpenAI's logit_bias: (token id, bias) pairs, sorted by token, each bias in [-100, 100], added to the
    # token's logit before penalties and sampling (logprobs stay those of the raw distribution).
    # ``logit_bias_pairs`` turns the API's {token: bias} object into this shape.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # vLLM's allowed_token_ids: only these tokens can be chosen (every other logit is -inf); empty = all.
    allowed_token_ids: tuple[int, ...] = ()
    # vLLM's bad_words: words the output must not write (services/engine/bad_words.py); empty = none.
    bad_words: tuple[str, ...] = ()
    # Structured output: (kind, spec) the output must match, kind one of STRUCTURED_KINDS: "json" (a JSON
    # schema, as JSON text), "regex", "choice" (a JSON array of the allowed strings), "grammar" (Lark or GBNF).
    # The request ends when the grammar is complete. None = free text.
    structured_output: tuple[str, str] | None = None
    # A reasoning model thinks unconstrained first (one of FREE_THOUGHTS): the structured output applies to the
    # answer after the thought, as vLLM applies it with a reasoning parser. Set by the chat API's reasoning parser.
    free_thought: str = ""
    # Leave special tokens (end-of-turn markers, tool-call tags) out of the output text, as vLLM does by default.
    skip_special_tokens: bool = True
    # An embedding request: the worker returns the prompt's last hidden state (StepResult.embeddings) instead
    # of sampling its one token. Needs max_tokens 1 and nothing that shapes tokens.
    pooling: bool = False

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, lo=1, hi=MAX_UINT32)
        _check_float("temperature", self.temperature, lo=0.0, hi=MAX_FLOAT32)
        _check_int("top_k", self.top_k, hi=MAX_UINT32)
        if self.top_k < -1:
            raise InvalidArgument(f"top_k must be -1 or 0 (off) or an integer >= 1, got {self.top_k!r}")
        _check_float("top_p", self.top_p)
        if not MIN_FLOAT32 <= self.top_p <= 1.0:
            raise InvalidArgument(f"top_p must be in (0, 1] (at least 1.2e-38, a float32), got {self.top_p!r}")
        _check_float("min_p", self.min_p, lo=0.0, hi=1.0)
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0, hi=MAX_SEED - 1)
        _check_float("repetition_penalty", self.repetition_penalty, hi=MAX_FLOAT32)
        if self.repetition_penalty < MIN_FLOAT32:
            raise InvalidArgument(f"repetition_penalty must be > 0 (at least 1.2e-38, a float32), got "
                                  f"{self.repetition_penalty!r}")
        _check_float("presence_penalty", self.presence_penalty, lo=-2.0, hi=2.0)
        _check_float("frequency_penalty", self.frequency_penalty, lo=-2.0, hi=2.0)
        self._check_stops()
        _check_bool("ignore_eos", self.ignore_eos)
        _check_int("min_tokens", self.min_tokens, lo=0, hi=MAX_UINT32)
        if self.min_tokens > self.max_tokens:
            raise InvalidArgument(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens!r}"
            )
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, lo=0, hi=MAX_LOGPROBS)
        _check_bool("include_stop_str_in_output", self.include_stop_str_in_output)
        _check_bool("skip_special_tokens", self.skip_special_tokens)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, lo=0, hi=MAX_LOGPROBS)
        self._check_token_constraints()
        _check_bool("pooling", self.pooling)
        if self.pooling and (self.max_tokens != 1 or self.logprobs is not None or self.prompt_logprobs is not None
                             or self.constrains_tokens or self.min_tokens):
            raise InvalidArgument("an embedding request (pooling) takes max_tokens 1 and no logprobs, "
                                  "prompt_logprobs, min_tokens or token constraints: it samples nothing")

    def _check_token_constraints(self) -> None:
        if not isinstance(self.logit_bias, tuple):
            raise InvalidArgument(f"logit_bias must be a tuple of (token id, bias) pairs, got {self.logit_bias!r}")
        last = -1
        for pair in self.logit_bias:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise InvalidArgument(f"logit_bias must hold (token id, bias) pairs, got {pair!r}")
            _check_int("logit_bias token id", pair[0], lo=0, hi=MAX_UINT32)
            _check_float(f"logit_bias[{pair[0]}]", pair[1], lo=-MAX_LOGIT_BIAS, hi=MAX_LOGIT_BIAS)
            if pair[0] <= last:
                raise InvalidArgument(f"logit_bias token ids must be unique and sorted, got {pair[0]} after {last}")
            last = pair[0]
        if not isinstance(self.allowed_token_ids, tuple):
            raise InvalidArgument(
                f"allowed_token_ids must be a tuple of integers >= 0, got {self.allowed_token_ids!r}")
        for t in self.allowed_token_ids:
            _check_int("allowed_token_ids", t, lo=0, hi=MAX_UINT32)
        if not isinstance(self.bad_words, tuple) or len(self.bad_words) > MAX_BAD_WORDS:
            raise InvalidArgument(f"bad_words must be a list of at most {MAX_BAD_WORDS} words, got "
                                  f"{self.bad_words!r:.200}")
        for w in self.bad_words:
            if not isinstance(w, str) or not w.strip():
                raise InvalidArgument(f"bad_words must hold words (strings with more than blanks), got {w!r}")
        if self.structured_output is not None:
            _check_structured(self.structured_output)
            if self.min_tokens:
                raise InvalidArgument(f"min_tokens must be 0 with structured output (the grammar decides where the "
                                      f"output ends), got {self.min_tokens!r}")
        if self.free_thought not in FREE_THOUGHTS:
            raise InvalidArgument(f"free_thought must be one of {FREE_THOUGHTS}, got {self.free_thought!r}")
        if self.free_thought and self.structured_output is None:
            raise InvalidArgument(f"free_thought {self.free_thought!r} places a structured output after the "
                                  "thought: it needs one")

    def check_vocab(self, vocab_size: int) -> None:
        """Raises InvalidArgument when a token the params name to bias or allow is not in the vocabulary (the
        params alone do not know its size). Stop token ids outside it are harmless: never sampled."""
        bad = next((t for t, _ in self.logit_bias if t >= vocab_size), None)
        if bad is not None:
            raise InvalidArgument(f"logit_bias names token id {bad}, outside the vocabulary [0, {vocab_size})")
        bad = next((t for t in self.allowed_token_ids if t >= vocab_size), None)
        if bad is not None:
            raise InvalidArgument(f"allowed_token_ids has token id {bad}, outside the vocabulary [0, {vocab_size})")

    def _check_stops(self) -> None:
        if not isinstance(self.stop, tuple):
            raise InvalidArgument(f"stop must be a tuple of non-empty strings, got {self.stop!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidArgument(f"stop must contain only non-empty strings, got {s!r}")
        if not isinstance(self.stop_token_ids, tuple):
            raise InvalidArgument(
                f"stop_token_ids must be a tuple of integers >= 0, got {self.stop_token_ids!r}"
            )
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, lo=0, hi=MAX_UINT32)

    @property
    def is_greedy(self) -> bool:
        """True when the row takes the argmax of the (penalised) logits; top_k/top_p/min_p/seed are moot."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def constrains_tokens(self) -> bool:
        """True when logit_bias, allowed_token_ids, bad_words or a structured output changes the logits."""
        return bool(self.logit_bias or self.allowed_token_ids or self.bad_words or self.structured_output)

    @property
    def has_penalties(self) -> bool:
        """True when any of the three penalties changes the logits."""
        return (
            self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )

    def for_choice(self, j: int) -> SamplingParams:
        """The j-th of ``n`` choices of one request: with a seed, ``seed + j``, so the choices differ and each is
        reproducible (vLLM's rule); without, each draws its own."""
        if self.seed is None or j == 0:
            return self
        return replace(self, seed=(self.seed + j) % MAX_SEED)

    @classmethod
    def from_openai(cls, body: dict[str, Any]) -> SamplingParams:
        """Build params from an OpenAI ``/v1/completions`` request body (a parsed JSON object).

        ``null`` means "use the default". Fields that only matter elsewhere (``model``, ``prompt``,
        ``stream``...) are ignored; fields Seawall does not implement (``n`` > 1, ``best_of`` > 1,
        ``echo``, ``suffix``) and unknown fields raise ``InvalidArgument``.
        """
        if not isinstance(body, dict):
            raise InvalidArgument(f"request body must be a JSON object, got {type(body).__name__}")
        kwargs: dict[str, Any] = {}
        structured = structured_from_openai(body)
        if structured is not None:
            kwargs["structured_output"] = structured
        for key, value in body.items():
            if key in _IGNORED_FIELDS or key in _STRUCTURED_FIELDS:
                continue
            if key in _UNSUPPORTED_FIELDS:
                _check_unsupported(key, value)
                continue
            if key not in _OPENAI_FIELDS:
                raise InvalidArgument(
                    f"unknown field {key!r}; accepted fields: {', '.join(sorted(_ACCEPTED_FIELDS))}"
                )
            if value is None:
                continue
            kwargs[key] = _convert_openai(key, value)
        return cls(**kwargs)


def logit_bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` object (token id -> bias; JSON keys are strings, e.g. ``{"50256": -100}``) as
    ``SamplingParams.logit_bias`` pairs. Values are range-checked by ``SamplingParams``."""
    if not isinstance(bias, dict):
        raise InvalidArgument(f"logit_bias must be an object mapping token ids to biases in [-100, 100], got {bias!r}")
    pairs: dict[int, Any] = {}
    for key, value in bias.items():
        token = key
        if isinstance(key, str):
            try:
                token = int(key)
            except ValueError:
                token = None
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise InvalidArgument(f"logit_bias keys must be token ids (integers >= 0), got {key!r}")
        if token in pairs:
            raise InvalidArgument(f"logit_bias names token id {token} twice")
        if isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        pairs[token] = value
    return tuple(sorted(pairs.items()))


def structured_from_openai(body: dict[str, Any]) -> tuple[str, str] | None:
    """``SamplingParams.structured_output`` from an API body: OpenAI's ``response_format`` (``json_object``,
    ``json_schema``; ``text`` = none), vLLM's ``structured_outputs`` (``{"json" | "regex" | "choice" |
    "grammar": ...}``) or its older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``;
    at most one of them."""
    given = [key for key in _STRUCTURED_FIELDS if body.get(key) is not None]
    found: list[tuple[str, str]] = []
    for key in given:
        value = body[key]
        if key == "response_format":
            found += [s for s in [_response_format(value)] if s is not None]
        elif key == "structured_outputs":
            if not isinstance(value, dict):
                raise InvalidArgument(f"structured_outputs must be an object like {{\"json\": SCHEMA}}, got {value!r}")
            kinds = [k for k in STRUCTURED_KINDS if value.get(k) is not None]
            unknown = sorted(set(value) - set(STRUCTURED_KINDS))
            if unknown:
                raise InvalidArgument(f"structured_outputs: unknown key(s) {', '.join(unknown)}; known: "
                                      f"{', '.join(STRUCTURED_KINDS)}")
            found += [_structured_value(f"structured_outputs.{k}", k, value[k]) for k in kinds]
        else:
            kind = key.removeprefix("guided_")
            found.append(_structured_value(key, kind, value))
    if len(found) > 1:
        raise InvalidArgument(f"give one structured output, not several ({', '.join(given)})")
    return found[0] if found else None


def _response_format(value: Any) -> tuple[str, str] | None:
    if not isinstance(value, dict):
        raise InvalidArgument(f"response_format must be an object like {{\"type\": \"json_object\"}}, got {value!r}")
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return ("json", ANY_JSON_OBJECT)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or spec.get("schema") is None:
            raise InvalidArgument("response_format json_schema needs \"json_schema\": {\"name\": ..., \"schema\": {...}}")
        return _structured_value("response_format.json_schema.schema", "json", spec["schema"])
    raise InvalidArgument(f"response_format type must be text, json_object or json_schema, got {kind!r}")


def _structured_value(name: str, kind: str, value: Any) -> tuple[str, str]:
    """A spec as the API sends it (a schema object or its JSON text, a list of choices, a pattern) as text."""
    if kind == "json" and isinstance(value, (dict, bool)):
        return ("json", json.dumps(value))
    if kind == "choice" and isinstance(value, list):
        return ("choice", json.dumps(value))
    if isinstance(value, str) and kind != "choice":
        return (kind, value)
    shape = {"json": "a JSON schema (object or JSON text)", "choice": "a list of strings"}.get(kind, "a string")
    raise InvalidArgument(f"{name} must be {shape}, got {value!r}")


def _check_structured(value: Any) -> None:
    if not (isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise InvalidArgument(f"structured_output must be a (kind, spec) pair of strings, got {value!r}")
    kind, spec = value
    if kind not in STRUCTURED_KINDS:
        raise InvalidArgument(f"structured_output kind must be one of {', '.join(STRUCTURED_KINDS)}, got {kind!r}")
    if not spec:
        raise InvalidArgument(f"structured_output ({kind}) needs a non-empty spec, got {spec!r}")
    if kind in ("json", "choice"):
        try:
            parsed = json.loads(spec)
        except ValueError as exc:
            raise InvalidArgument(f"structured_output ({kind}) is not valid JSON ({exc}), got {spec!r}") from None
        if kind == "json" and not isinstance(parsed, (dict, bool)):
            raise InvalidArgument(f"structured_output (json) must be a JSON schema object, got {spec!r}")
        if kind == "choice" and not (isinstance(parsed, list) and parsed
                                     and all(isinstance(c, str) and c for c in parsed)):
            raise InvalidArgument(f"structured_output (choice) must be a non-empty list of non-empty strings, "
                                  f"got {spec!r}")


def check_stop(
    params: SamplingParams, output_token_ids: Sequence[int], eos_token_ids: Collection[int]
) -> str | None:
    """The token-level finish reason after the last token was appended to ``output_token_ids``.

    ``FinishReason.STOP`` when the last token is an eos (unless ``ignore_eos``) or one of
    ``stop_token_ids``, counted only once ``len(output_token_ids) >= min_tokens``;
    ``FinishReason.LENGTH`` when ``max_tokens`` tokens exist; otherwise ``None`` (keep going).
    Stop strings are the detokenizer's job.
    """
    n = len(output_token_ids)
    if n == 0:
        return None
    if n >= params.min_tokens:
        last = output_token_ids[-1]
        if (not params.ignore_eos and last in eos_token_ids) or last in params.stop_token_ids:
            return FinishReason.STOP
    if n >= params.max_tokens:
        return FinishReason.LENGTH
    return None


def text_left_out(params: SamplingParams, token_id: int, finish_reason: str | None,
                  eos_token_ids: Collection[int]) -> bool:
    """Whether the token that ended the output is a stop token whose text the output leaves out, as vLLM does:
    an eos (unless ``ignore_eos``) or one of ``stop_token_ids`` that stopped it, without
    ``include_stop_str_in_output``. (A special token's text is empty unless ``skip_special_tokens`` is off.)"""
    return (finish_reason == FinishReason.STOP and not params.include_stop_str_in_output
            and ((not params.ignore_eos and token_id in eos_token_ids) or token_id in params.stop_token_ids))


# --- validation helpers -------------------------------------------------------------------------------


def _check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        # The contract's uint32 cap is named only to a value past it: below the floor, the floor is what matters.
        shown = None if hi == MAX_UINT32 and value <= hi else hi
        raise InvalidArgument(f"{name} must be an integer {_range(lo, shown)}, got {value!r}")


def _check_float(name: str, value: Any, lo: float | None = None, hi: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if hi == MAX_FLOAT32:  # a limit of the contract's float32, named only to a value past it
            shown = "<= 3.4e38 (a float32)" if value > hi else _range(lo, None)
            raise InvalidArgument(f"{name} must be {shown}, got {value!r}")
        raise InvalidArgument(f"{name} must be {_range(lo, hi)}, got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be true or false, got {value!r}")


def _range(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"in [{lo}, {hi}]"
    return f">= {lo}" if lo is not None else f"<= {hi}"


# --- OpenAI body mapping ------------------------------------------------------------------------------

_OPENAI_FIELDS = frozenset({
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs", "ignore_eos",
    "min_tokens", "include_stop_str_in_output", "prompt_logprobs", "logit_bias", "allowed_token_ids",
    "bad_words", "skip_special_tokens",
})
# Handled by the API layer, not by sampling; or OpenAI's bookkeeping, which does not change the output of a
# server that keeps nothing for later (``store``, ``metadata``: accepted, as vLLM accepts them, so clients that
# always send them work).
_IGNORED_FIELDS = frozenset({"model", "prompt", "stream", "stream_options", "user", "return_token_ids",
                             "return_tokens_as_token_ids",
                             "session_id", "priority", "metadata", "store", "service_tier", "prompt_cache_key",
                             "safety_identifier", "truncate_prompt_tokens", "cache_salt", "add_special_tokens",
                             # a beam search's (services/common/beam_search.py beam_from_openai)
                             "use_beam_search", "length_penalty", "early_stopping"})
# Accepted only with the value that means "off".
_UNSUPPORTED_FIELDS = frozenset({"n", "best_of", "echo", "suffix"})
# Structured output, in OpenAI's and vLLM's spellings (structured_from_openai).
_STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                      "guided_grammar")
_ACCEPTED_FIELDS = _OPENAI_FIELDS | _IGNORED_FIELDS | _UNSUPPORTED_FIELDS | frozenset(_STRUCTURED_FIELDS)
_FLOAT_FIELDS = frozenset({
    "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
})


def from_openai_completion(body: dict[str, Any]) -> tuple[SamplingParams, int, bool]:
    """A ``/v1/completions`` body's sampling, ``n`` and ``echo``: ``n`` and ``echo`` are the API layer's (it
    fans choices out and prefixes the prompt); with ``echo`` and ``logprobs`` the prompt is scored as well."""
    n, echo = num_choices(body), bool_field(body, "echo")
    params = SamplingParams.from_openai({k: v for k, v in body.items() if k not in ("n", "echo")})
    if echo and params.logprobs is not None:
        params = replace(params, prompt_logprobs=params.logprobs)
    return params, n, echo


# generation_config.json's sampling fields a request falls back on (vLLM's --generation-config auto), under the
# API's names.
_GENERATION_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                        "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
GENERATION_CONFIG_FIELDS = tuple(_GENERATION_DEFAULTS)


def generation_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """The sampling a model's creator recommends (its ``generation_config.json``) as request fields: what an
    OpenAI request that leaves them out samples with, as vLLM serves it (``do_sample`` is not read, as vLLM
    does not). Checked as a request's would be, so a bad file stops the start rather than every request."""
    out = {api: config[key] for key, api in _GENERATION_DEFAULTS.items() if config.get(key) is not None}
    try:
        SamplingParams.from_openai(out)
    except InvalidArgument as exc:
        raise InvalidArgument(f"generation_config.json: {exc}") from None
    return out


def with_defaults(body: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``body`` with ``defaults`` for the fields it leaves out (or sends null); a beam search takes none of them
    (it ranks beams by their logprobs, which sampling options would change)."""
    if not defaults or bool_field(body, "use_beam_search"):
        return body
    return {**defaults, **{k: v for k, v in body.items() if v is not None}}


def num_choices(body: dict[str, Any]) -> int:
    """OpenAI's ``n``: completions per prompt (default 1). The API layer fans them out; ``from_openai`` takes
    a body without it."""
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgument(f"n must be an integer >= 1 (completions per prompt), got {n!r}")
    return n


def bool_field(body: dict[str, Any], name: str, default: bool = False) -> bool:
    """A true/false field of a request body (absent or null: ``default``), such as OpenAI's ``echo``; anything
    else is refused rather than read as truthy."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be true or false, got {value!r}")
    return default if value is None else value


def prompt_truncation(body: dict[str, Any], max_model_len: int) -> int | None:
    """vLLM's ``truncate_prompt_tokens``: how many of a prompt's last tokens to keep (-1: the model's context);
    None: the whole prompt. Handled by the API layer, on the tokens after tokenizing or chat rendering."""
    k = body.get("truncate_prompt_tokens")
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or not (k >= 1 or k == -1):
        raise InvalidArgument(f"truncate_prompt_tokens must be an integer >= 1 (keep the prompt's last k tokens) "
                              f"or -1 (the model's context), got {k!r}")
    return max_model_len if k == -1 else k


def _check_unsupported(key: str, value: Any) -> None:
    if key in ("n", "best_of"):
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 1):
            return
        raise InvalidArgument(f"{key} must be 1 (only one completion per request is supported), got {value!r}")
    if key == "echo":
        if value in (None, False):
            return
        raise InvalidArgument(f"echo must be false (echoing the prompt is not supported), got {value!r}")
    if value in (None, {}, ""):
        return
    raise InvalidArgument(f"{key} is not supported; omit it or send null, got {value!r}")


def _convert_openai(key: str, value: Any) -> Any:
    """JSON shapes to dataclass shapes: lists become tuples, a single stop string a 1-tuple."""
    if key in ("stop", "bad_words"):
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return tuple(value)
        raise InvalidArgument(f"{key} must be a string or a list of strings, got {value!r:.200}")
    if key in ("stop_token_ids", "allowed_token_ids"):
        if isinstance(value, list):
            return tuple(value)
        raise InvalidArgument(f"{key} must be a list of integers, got {value!r}")
    if key == "logit_bias":
        return logit_bias_pairs(value)
    if key == "logprobs" and isinstance(value, bool):
        raise InvalidArgument(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (top-n per token), got {value!r}")
    if key in _FLOAT_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
