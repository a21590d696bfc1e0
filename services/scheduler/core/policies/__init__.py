"""Step policies, one small object each behind ``base.Policy``, registered by name.

| name                | step                                                        | preempts (default mode)  |
|---------------------|-------------------------------------------------------------|--------------------------|
| `sarathi`           | decodes, then prompt chunks, first come first served        | newest (recompute)       |
| `vllm`              | whole new prompts when one fits, else decodes only          | newest (recompute)       |
| `fcfs`              | decodes, then whole new prompts; run to completion          | newest (recompute)       |
| `fastserve`         | skip-join MLFQ order, whole prompts, proactive swapping     | furthest ENST (swap)     |
| `fastserve+sarathi` | MLFQ picks who runs; their decodes, then prompt chunks      | furthest ENST (swap)     |

A request's ``priority`` (lower runs sooner) orders the first three before arrival, and a waiting prompt of a
higher priority takes blocks from less important running requests; FastServe's MLFQ levels ignore it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.scheduler.core.policies.base import Policy, Step
from services.scheduler.core.policies.fastserve import FastServePolicy, FastServeSarathiPolicy
from services.scheduler.core.policies.fcfs import FcfsPolicy
from services.scheduler.core.policies.sarathi import SarathiPolicy
from services.scheduler.core.policies.vllm import VllmPolicy

if TYPE_CHECKING:
    from services.scheduler.core.config import SchedulerConfig

POLICY_CLASSES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (SarathiPolicy, VllmPolicy, FcfsPolicy, FastServePolicy, FastServeSarathiPolicy)
}
POLICY_NAMES = tuple(POLICY_CLASSES)


def make_policy(config: SchedulerConfig) -> Policy:
    return POLICY_CLASSES[config.policy](config)


__all__ = ["POLICY_CLASSES", "POLICY_NAMES", "Policy", "Step", "make_policy"]
