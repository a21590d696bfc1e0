"""``sarathi``: Sarathi-Serve's stall-free batching (papers.md §1.1-1.3), the default policy.

A step takes every running decode first (a decode never waits behind a prompt), then the running prompts'
next chunks, then new prompts, first come first served (by priority first), within the chunk budget: ``chunk_size`` prompt
tokens, or, when it is not given and ``tbt_target_s`` is, tau = the largest step the step-time model fits
in the TBT target, which the decodes count against (but are never skipped for). Under block pressure the
newest running request is preempted; a running prompt chunk never preempts itself (it waits a step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.scheduler.core.policies.base import (
    Policy,
    Step,
    admit_by_priority,
    by_priority,
    chunk_budget,
    prompts_in_turn,
    run_decodes,
    run_prompts,
)

if TYPE_CHECKING:
    from services.scheduler.core.config import SchedulerConfig
    from services.scheduler.core.scheduler import Scheduler


class SarathiPolicy(Policy):
    name = "sarathi"
    chunked = True

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.budget, self.decodes_count = chunk_budget(config)

    def on_config(self, config: SchedulerConfig) -> None:
        super().on_config(config)
        self.budget, self.decodes_count = chunk_budget(config)

    def compose(self, s: Scheduler, step: Step) -> None:
        s.swap_in_fifo()
        admit_by_priority(s, step, min(self.budget, step.room))
        decodes = run_decodes(s, step, by_priority([r for r in s.running if r.is_decoding]))
        step.prompt_tokens = max(0, self.budget - decodes) if self.decodes_count else self.budget
        run_prompts(s, step, prompts_in_turn(s), whole=False)
