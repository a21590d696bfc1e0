"""Which running decode moves to which worker, so that a worker short of KV memory need not preempt while a
peer has room (Llumnix, OSDI '24: load balancing by live migration).

Placement decides where a request starts with what is known then (its prompt); how long each output runs is
not known, so under a burst one worker fills up and preempts (swapping or recomputing) while another, whose
requests ended sooner, idles with free blocks. Llumnix measures each instance's *freeness*, the decode steps
its batch can still take before memory runs out, and moves requests from instances low on it to instances
high on it. Pure: plain numbers in, a choice out; ``migrator.py`` feeds it the cores' live numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.scheduler.core.request import Request
    from services.scheduler.core.scheduler import Scheduler


@dataclass(frozen=True)
class MemoryLoad:
    """One worker's KV memory as rebalancing sees it."""

    name: str
    free_tokens: int  # free (or evictable) blocks, in tokens
    demand_tokens: int  # tokens of requests there that wait for memory: queued, preempted, arriving
    running: int  # requests holding blocks; each decode takes a token of KV a step
    busy: bool = False  # a migration out of it or into it is under way

    @property
    def freeness(self) -> float:
        """Tokens of KV each running request can still grow by before the worker runs out (Llumnix's
        freeness: free memory less what waits for it, per request in the batch), about the decode steps
        left before a preemption."""
        return (self.free_tokens - self.demand_tokens) / max(self.running, 1)

    def room(self, headroom: float) -> float:
        """Tokens of one more request it can take and still keep ``headroom`` tokens for each request."""
        return self.free_tokens - self.demand_tokens - headroom * (self.running + 1)


def core_load(name: str, core: Scheduler, waiting_for_blocks: Iterable[Request] = (), busy: bool = False) -> MemoryLoad:
    """A worker's ``MemoryLoad`` from its scheduler core; ``waiting_for_blocks``: requests bound for it that
    wait for blocks outside the core (arrivals not placed yet; those in ``core.arriving`` hold theirs)."""
    waiting = [*core.waiting, *core.swapped, *waiting_for_blocks]
    return MemoryLoad(name, free_tokens=core.blocks.num_free * core.blocks.block_size,
                      demand_tokens=sum(r.num_tokens for r in waiting), running=len(core.running), busy=busy)


def pick_migration(src: MemoryLoad, peers: Sequence[MemoryLoad], candidates: Sequence[tuple[str, int]],
                   headroom: float, trigger: float | None = None) -> tuple[str, str] | None:
    """``(request id, receiving worker)`` for one move off ``src``, or None.

    ``src`` moves a request out when its freeness is under ``headroom`` tokens a request (a preemption is
    near), or under ``trigger`` when given (copying a request ahead starts earlier). The receiver is the not busy peer with the most freeness that stays at ``headroom`` or above after
    taking it, so that the move never makes a receiver the next source (no ping-pong). Of ``candidates``
    (``(request id, tokens)``: the running decodes ``src`` could let go, or its next request without KV), the
    one with the fewest tokens: the cheapest to move, and the shortest pause for its stream, as Llumnix
    prefers.
    """
    if src.busy or not candidates or src.freeness >= (headroom if trigger is None else trigger):
        return None
    rid, tokens = min(candidates, key=lambda c: c[1])
    for dst in sorted((p for p in peers if p.name != src.name and not p.busy), key=lambda p: -p.freeness):
        if tokens <= dst.room(headroom):
            return rid, dst.name
    return None

