"""Beam search as Hugging Face ``generate(num_beams=...)`` runs it, as pure logic over each beam's top tokens.

Whoever drives it runs one step per beam still open (``BeamSearch.running``) with the beam's tokens after the
prompt and ``top_needed`` logprobs of the raw distribution, and hands back each beam's most likely tokens
(``advance``); the search picks the next beams and the finished hypotheses, until ``done``. The live scheduler
drives it with one-token requests whose shared prefixes the prefix cache serves (vLLM's approach), the offline
engine alike.

The rules are transformers' (``GenerationMixin._beam_search``), so the result equals its output token for token:

* candidates are every (open beam, token) by the beam's summed logprob plus the token's, best first;
* the best ``width`` candidates that do not end (an end token, or the last allowed token) are the next beams;
* a candidate that ends is a hypothesis only if it ranks within the best ``width``; its score is its summed
  logprob over ``generated length ** length_penalty`` (the end token counted), and the best ``width``
  hypotheses are kept;
* the search ends at ``max_tokens``, or once ``width`` hypotheses are kept and ``early_stopping`` is True, or
  (False, the default) no open beam could score above the worst kept one at its current length, or ("never")
  at ``max_tokens``' length when ``length_penalty`` > 0.

Scores are summed and divided in float32, as transformers keeps them, so near ties order alike.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from services.common.errors import InvalidArgument
from services.common.sampling_params import (
    MAX_LOGPROBS,
    FinishReason,
    SamplingParams,
    bool_field,
    text_left_out,
)


@dataclass(frozen=True)
class BeamParams:
    width: int
    max_tokens: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True, False or "never" (transformers' meanings)
    end_token_ids: tuple[int, ...] = ()  # end a beam (the model's eos unless ignored, and stop token ids)

    def __post_init__(self) -> None:
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise InvalidArgument(f"the beam width (n) must be an integer >= 1, got {self.width!r}")
        if isinstance(self.length_penalty, bool) or not isinstance(self.length_penalty, (int, float)) or not (
                math.isfinite(self.length_penalty)):
            raise InvalidArgument(f"length_penalty must be a number (scores are divided by length ** "
                                  f"length_penalty), got {self.length_penalty!r}")
        if not (self.early_stopping is True or self.early_stopping is False or self.early_stopping == "never"):
            raise InvalidArgument(f"early_stopping must be true, false or \"never\", got {self.early_stopping!r}")
        if self.top_needed > MAX_LOGPROBS:
            raise InvalidArgument(f"a beam width (n) of {self.width} with {len(self.end_token_ids)} end tokens needs "
                                  f"each step's {self.top_needed} most likely tokens; at most {MAX_LOGPROBS} are "
                                  f"returned: use n <= {MAX_LOGPROBS - len(self.end_token_ids)}")

    @property
    def top_needed(self) -> int:
        """Top tokens each beam's step must return: the best ``width`` candidates that do not end are among
        each beam's best ``width`` tokens plus its end tokens."""
        return self.width + len(self.end_token_ids)


@dataclass
class Beam:
    token_ids: list[int] = field(default_factory=list)  # after the prompt
    logprob: float = 0.0  # summed, float32


@dataclass(frozen=True)
class Hypothesis:
    token_ids: list[int]  # after the prompt; an end token it stopped at included
    logprob: float  # summed
    score: float  # logprob / length ** length_penalty
    finish_reason: str  # "stop" (an end token) or "length"


class BeamSearch:
    def __init__(self, params: BeamParams) -> None:
        self.params = params
        self.running = [Beam()]  # the prompt alone opens the search, as transformers' first beam does
        self.finished: list[Hypothesis] = []  # best first, at most width
        self.done = False

    def advance(self, tops: Sequence[Sequence[tuple[int, float]]]) -> None:
        """``tops[i]``: (token id, logprob) of ``running[i]``'s most likely next tokens, best first (at least
        ``params.top_needed`` of them, or the whole vocabulary)."""
        if self.done:
            raise ValueError("the beam search is over")
        if len(tops) != len(self.running):
            raise ValueError(f"{len(tops)} beams' tokens for {len(self.running)} open beams")
        p = self.params
        length = len(self.running[0].token_ids) + 1  # generated tokens, this step's included
        last = length >= p.max_tokens
        candidates = sorted(
            ((_f32(beam.logprob + _f32(lp)), i, rank, token)
             for i, (beam, top) in enumerate(zip(self.running, tops, strict=True))
             for rank, (token, lp) in enumerate(top)),
            key=lambda c: (-c[0], c[1], c[2]))
        running: list[Beam] = []
        for rank, (logprob, i, _, token) in enumerate(candidates):
            if rank >= p.width and len(running) == p.width:
                break
            tokens = [*self.running[i].token_ids, token]
            ends = token in p.end_token_ids
            if ends or last:
                if rank < p.width:
                    self._keep(Hypothesis(tokens, logprob, _f32(logprob / _f32(_power(length, p.length_penalty))),
                                          FinishReason.STOP if ends else FinishReason.LENGTH))
            elif len(running) < p.width:
                running.append(Beam(tokens, logprob))
        self.running = running
        self.done = not running or not self._may_improve(length)

    def _keep(self, hypothesis: Hypothesis) -> None:
        kept = self.finished + [hypothesis]
        kept.sort(key=lambda h: -h.score)  # stable: an earlier one wins a tie
        self.finished = kept[: self.params.width]

    def _may_improve(self, length: int) -> bool:
        p = self.params
        if len(self.finished) < p.width:
            return True
        if p.early_stopping is True:
            return False
        # transformers' heuristic: the best open beam's score now ("never" with a positive penalty: at the
        # longest it may grow to) against the worst kept hypothesis.
        best_length = p.max_tokens if p.early_stopping == "never" and p.length_penalty > 0 else length
        best = _f32(self.running[0].logprob / _f32(_power(best_length, p.length_penalty)))
        return best > self.finished[-1].score

    def result(self) -> list[Hypothesis]:
        """The kept hypotheses, best first (``width`` of them once the search is done)."""
        return list(self.finished)


def _f32(x: float) -> float:
    """``x`` rounded to float32, as transformers' score tensors hold it (beyond its range: infinite)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _power(length: int, exponent: float) -> float:
    try:
        return float(length) ** exponent
    except OverflowError:
        return math.inf


def beam_step_params(beam: BeamParams) -> SamplingParams:
    """One beam's step: its next token's ``top_needed`` logprobs of the raw distribution (which token it samples
    does not matter)."""
    return SamplingParams(max_tokens=1, temperature=0.0, logprobs=beam.top_needed)


# What of a request's SamplingParams a beam search reads; it scores the raw distribution, so any other option
# that shapes tokens is refused rather than ignored. (temperature and seed leave it unchanged: it samples
# nothing, as transformers' beam search without do_sample.)
_BEAM_READS = frozenset({"max_tokens", "ignore_eos", "stop_token_ids", "include_stop_str_in_output",
                         "skip_special_tokens", "temperature", "seed"})


def beam_params(params: SamplingParams, width: int, length_penalty: float, early_stopping: bool | str,
                eos_token_ids: Sequence[int], room: int) -> BeamParams:
    """A request's beam search: ``width`` beams, up to ``params.max_tokens`` tokens (at most ``room``, what the
    model's context leaves after the prompt), ended by the model's eos (unless ``ignore_eos``) and
    ``stop_token_ids``. Raises InvalidArgument for sampling options a beam search cannot honour."""
    for f in fields(SamplingParams):
        if f.name not in _BEAM_READS and getattr(params, f.name) != f.default:
            raise InvalidArgument(f"{f.name} cannot be used with beam search (it ranks beams by the model's own "
                                  f"probabilities): omit it or drop use_beam_search")
    ends = (() if params.ignore_eos else tuple(eos_token_ids)) + params.stop_token_ids
    return BeamParams(width, min(params.max_tokens, room), length_penalty, early_stopping, tuple(dict.fromkeys(ends)))


def beam_from_openai(body: dict[str, Any], params: SamplingParams, n: int, eos_token_ids: Sequence[int],
                     room: int) -> BeamParams | None:
    """vLLM's ``use_beam_search`` (``n`` beams, ``length_penalty``, default 1) and transformers'
    ``early_stopping`` (true, false or "never"; default false) from a completions or chat body; None when the
    body does not ask for a beam search."""
    if not bool_field(body, "use_beam_search"):
        return None
    if bool_field(body, "echo"):
        raise InvalidArgument("echo cannot be used with use_beam_search: omit it")
    if body.get("session_id"):
        raise InvalidArgument("session_id cannot be used with use_beam_search (a beam search stores no turn): "
                              "omit it")
    lp = body.get("length_penalty")
    early = body.get("early_stopping")
    return beam_params(params, n, 1.0 if lp is None else lp, False if early is None else early, eos_token_ids,
                       room)


def hypothesis_text(decode, hypothesis: Hypothesis, params: SamplingParams, eos_token_ids: Sequence[int]) -> str:
    """A hypothesis's text, as a request's output would read: an end token's text left out (vLLM's rule);
    ``decode(ids, skip_special_tokens)`` is the tokenizer's."""
    ids = hypothesis.token_ids
    if ids and text_left_out(params, ids[-1], hypothesis.finish_reason, eos_token_ids):
        ids = ids[:-1]
    return decode(ids, skip_special_tokens=params.skip_special_tokens)
