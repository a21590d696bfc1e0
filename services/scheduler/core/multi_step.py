"""Multi-step decoding (``SchedulerConfig.num_decode_steps``, vLLM's ``num_scheduler_steps``): which steps
may ask a worker for several decode passes, how many per request, and what such a plan costs.

A decode scheduled for ``n`` tokens when it knows one runs ``n`` passes on the worker, fed its own samples
(``services/common/step.py``), and samples ``n`` tokens; the core counts them as pending like tokens of
plans sent ahead (``Scheduler.expect``), so results, stops and preemption need nothing new here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.scheduler.core.request import Request
    from services.scheduler.core.scheduler import Scheduler


class MultiStep:
    def _multi_step(self: Scheduler, scheduled: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """With ``num_decode_steps`` > 1, a step of decodes alone, with nothing queued behind it and no
        preemption in it, runs each decode up to that many passes (``step.py``): blocks for the extra tokens
        are reserved now, never past ``max_tokens`` or the context; a request whose blocks are not free
        keeps one pass."""
        k = self.config.num_decode_steps
        if (k == 1 or not scheduled or self.waiting or self.swapped or self._preempted_now
                or not all(n == 1 and r.is_decoding for r, n in scheduled)):
            return scheduled
        out = []
        for req, _ in scheduled:
            room = min(k, req.params.max_tokens - len(req.output_token_ids) - req.num_pending,
                       self.config.max_model_len - req.num_tokens)
            out.append((req, room if room > 1 and self._reserve(req, room) else 1))
        return out

    def _predict(self: Scheduler, scheduled: list[tuple[Request, int]], speculative: bool = False) -> float:
        """The step-time model's estimate of a plan: its first pass, plus a decode pass per extra token of the
        multi-step decodes (a pass runs every decode with tokens left). A speculative plan is one pass over
        all its tokens, drafts included (as many as the worker may draft)."""
        predict = self.config.step_time.predict
        if speculative:
            return predict(sum(n for _, n in scheduled), len(scheduled))
        seconds = predict(sum(min(n, r.num_uncomputed) for r, n in scheduled), len(scheduled))
        extra = sorted((n - r.num_uncomputed for r, n in scheduled if n > r.num_uncomputed), reverse=True)
        for j in range(1, extra[0] + 1 if extra else 1):
            rows = sum(e >= j for e in extra)
            seconds += predict(rows, rows)
        return seconds
