"""``fcfs``: run-to-completion first come first served (the FastServe-FCFS baseline, papers.md §2.4).

Iteration-level batching in arrival order (by priority first): every running request gets its next token
(oldest first), then new prompts join whole, in arrival order, while sequence slots and the token budget last. A running request
is never preempted for a newer one; only block pressure preempts (the newest first), and a prompt that
does not fit holds back every later one. ``chunk_size`` does not apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.scheduler.core.policies.base import (
    Policy,
    Step,
    admit_by_priority,
    prompts_in_turn,
    rank,
    run_decodes,
    run_prompts,
)

if TYPE_CHECKING:
    from services.scheduler.core.scheduler import Scheduler


class FcfsPolicy(Policy):
    name = "fcfs"

    def compose(self, s: Scheduler, step: Step) -> None:
        s.swap_in_fifo()
        admit_by_priority(s, step, step.room)
        run_decodes(s, step, sorted((r for r in s.running if r.is_decoding), key=rank))
        run_prompts(s, step, prompts_in_turn(s), whole=True)
