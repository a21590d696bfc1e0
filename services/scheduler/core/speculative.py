"""Speculative decoding (``SchedulerConfig.num_speculative_tokens``): which decodes of a step may verify
draft tokens, how many, and what a verified plan did.

The worker drafts by n-gram lookup in the sequence's own tokens (``services/engine/ngram.py``) and keeps the
drafts its sampler would have sampled anyway, plus the token sampled after the last kept one
(``services/engine/runner.py``). The core only budgets: a decode scheduled for ``1 + k`` tokens in a
speculative plan may verify up to ``k`` drafts, so it gets blocks for ``1 + k`` tokens, and ``k`` counts
against the step's token budget. How many tokens it kept is known from the result alone, so such a plan is
applied when its result arrives, never ahead of it (``Scheduler.expect`` refuses it), and a request with
tokens in flight does not speculate.

Where drafts keep missing (text that does not repeat its context), speculating costs: the drafts' rows in
the pass, and in the live mesh the planning ahead it forgoes. So the core keeps an estimate of the drafts
kept per speculating decode, and below ``MIN_KEPT`` it pauses for ``PAUSE_STEPS`` steps, then probes with
one speculative step, whose result alone decides whether it speculates on. ``speculation_due`` tells the
step loop when the next plan would speculate, so that it does not plan that one ahead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Drafts kept per speculating decode (an average over recent steps, each weighing ``_GAIN_WEIGHT``) below
# which speculation pauses for ``PAUSE_STEPS``: a quarter of a token a step is about what planning ahead saves
# the live mesh (a round trip beside a few-ms step), and more than wrong drafts' rows cost in the pass
# (bench/README.md "Speculative decoding").
MIN_KEPT = 0.25
_GAIN_WEIGHT = 0.2
PAUSE_STEPS = 32

if TYPE_CHECKING:
    from services.common.step import StepPlan, StepResult
    from services.scheduler.core.policies import Step
    from services.scheduler.core.request import Request
    from services.scheduler.core.scheduler import Scheduler


class Speculative:
    def _speculate(self: Scheduler, step: Step) -> bool:
        """Gives each decode of ``step`` room for drafts, within the step's token budget, the request's
        ``max_tokens`` and the context, where its blocks are free without preempting anyone. Returns
        whether any decode got room (the plan is then speculative)."""
        k = self.config.num_speculative_tokens
        if not k:
            return False
        if self._draft_pause:
            self._draft_pause -= 1
            return False
        speculative = False
        for i, (req, n) in enumerate(step.scheduled):
            if n != 1 or req.num_pending or not req.is_decoding:
                continue
            room = int(min(1 + k, 1 + step.tokens, req.params.max_tokens - len(req.output_token_ids),
                           self.config.max_model_len - req.num_tokens))
            if room > 1 and self._reserve(req, room):
                step.scheduled[i] = (req, room)
                step.tokens -= room - 1
                speculative = True
        return speculative

    def _kept(self: Scheduler, req: Request, n: int, result: StepResult) -> int:
        """The tokens of ``req`` that a speculative plan ran and kept: ``n``, or for a decode verifying drafts,
        the newest token and the drafts kept, one per token sampled (none when the sequence failed)."""
        if n <= req.num_uncomputed:
            return n
        return len(result.sampled.get(req.request_id, ()))

    @property
    def speculation_due(self: Scheduler) -> bool:
        """Whether the next plan may speculate (speculation on and not paused): a decode planned ahead of it
        would have a token in flight, and could not."""
        return bool(self.config.num_speculative_tokens) and not self._draft_pause

    def _note_kept(self: Scheduler, plan: StepPlan, result: StepResult) -> None:
        """Updates the kept-drafts estimate with a speculative plan's result (before it is applied) and
        pauses speculation when it falls below ``MIN_KEPT``."""
        decodes = sum(1 for rid, n in plan.num_scheduled_tokens.items()
                      if (req := self.requests.get(rid)) is not None and n > req.num_uncomputed)
        if not decodes:
            return
        kept = result.num_accepted_tokens / decodes
        self._draft_gain = kept if self._draft_probing else (1 - _GAIN_WEIGHT) * self._draft_gain + _GAIN_WEIGHT * kept
        self._draft_probing = self._draft_gain < MIN_KEPT
        if self._draft_probing:
            self._draft_pause = PAUSE_STEPS
