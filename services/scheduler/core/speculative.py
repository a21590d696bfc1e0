"""Speculative decoding (``SchedulerConfig.num_speculative_tokens``): which decodes of a step may verify
draft tokens, how many, and what a verified plan did.

The worker drafts by n-gram lookup in the sequence's own tokens (``services/engine/ngram.py``) and keeps the
drafts its sampler would have sampled anyway, plus the token sampled after the last kept one
(``services/engine/runner.py``). The core only budgets: a decode scheduled for ``1 + k`` tokens in a
speculative plan may verify up to ``k`` drafts, so it gets blocks for ``1 + k`` tokens, and ``k`` counts
against the step's token budget. How many tokens it kept is known from the result alone, so such a plan is
applied when its result arrives, never ahead of it (``Scheduler.expect`` refuses it), and a request with
tokens in flight does not speculate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

    def _kept(self: Scheduler, plan: StepPlan, req: Request, n: int, result: StepResult | None) -> int:
        """The tokens of ``req`` that ``plan`` ran and kept: ``n``, or for a decode verifying drafts, the newest
        token and the drafts kept, one per token sampled (none when the sequence failed)."""
        if n <= req.num_uncomputed:
            return n
        if result is None:
            raise ValueError(f"step {plan.step_id} verifies draft tokens: apply it with its result (on_result), "
                             "not ahead of it (expect)")
        return len(result.sampled.get(req.request_id, ()))
