"""``vllm``: the classic prefill-first baseline (vLLM's original scheduler, papers.md §1.2, §3.2).

A step of whole new prompts whenever one fits (running decodes stall meanwhile), otherwise a decode-only
step. Under block pressure the newest request is preempted. Swapped requests resume, first in first out,
before any new prompt is admitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.scheduler.core.policies.base import (
    Policy,
    Step,
    by_priority,
    prompts_in_turn,
    run_decodes,
    run_prompts,
)

if TYPE_CHECKING:
    from services.scheduler.core.scheduler import Scheduler


class VllmPolicy(Policy):
    name = "vllm"

    def compose(self, s: Scheduler, step: Step) -> None:
        s.swap_in_fifo()
        run_prompts(s, step, prompts_in_turn(s), whole=True)
        if not step.scheduled:
            run_decodes(s, step, by_priority([r for r in s.running if r.is_decoding]))
