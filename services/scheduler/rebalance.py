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

from services.scheduler.core.request import RequestStatus

if TYPE_CHECKING:
    from services.scheduler.core.request import Request
    from services.scheduler.core.scheduler import Scheduler


# Full blocks worth copying ahead: a smaller copy costs the stream about as little as one more round trip.
PRECOPY_MIN_BLOCKS = 4
# Copying ahead starts when a worker's freeness falls under this many times the headroom. Started at the
# headroom itself, the copy (0.2 s when a pair first met on a loaded box) outlasted the sender's slack and
# the mover, its preemption victim too, was preempted in 1-3 of 12 request sets (bench/README.md).
PRECOPY_LEAD = 2


@dataclass(frozen=True)
class MemoryLoad:
    """One worker's KV memory as rebalancing sees it."""

    name: str
    free_tokens: int  # free (or evictable) blocks, in tokens
    demand_tokens: int  # tokens of requests there that wait for memory: queued, preempted, arriving
    running: int  # requests holding blocks; each decode takes a token of KV a step
    busy: bool = False  # a migration out of it or into it is under way
    reserved_tokens: int = 0  # kept free for its high-priority requests (Llumnix's headroom for them)

    @property
    def freeness(self) -> float:
        """Tokens of KV each running request can still grow by before the worker runs out (Llumnix's
        freeness: free memory less what waits for it and what is kept for high-priority requests, per
        request in the batch), about the decode steps left before a preemption."""
        return (self.free_tokens - self.demand_tokens - self.reserved_tokens) / max(self.running, 1)

    def room(self, headroom: float) -> float:
        """Tokens of one more request it can take and still keep ``headroom`` tokens for each request."""
        return self.free_tokens - self.demand_tokens - self.reserved_tokens - headroom * (self.running + 1)


def core_load(name: str, core: Scheduler, waiting_for_blocks: Iterable[Request] = (), busy: bool = False,
              priority_headroom: int = 0) -> MemoryLoad:
    """A worker's ``MemoryLoad`` from its scheduler core; ``waiting_for_blocks``: requests bound for it that
    wait for blocks outside the core (arrivals not placed yet; those in ``core.arriving`` hold theirs);
    ``priority_headroom``: tokens kept free for each high-priority request there or bound for it."""
    bound = list(waiting_for_blocks)
    waiting = [*core.waiting, *core.swapped, *bound]
    return MemoryLoad(name, free_tokens=core.blocks.num_free * core.blocks.block_size,
                      demand_tokens=sum(r.num_tokens for r in waiting), running=len(core.running), busy=busy,
                      reserved_tokens=priority_reserve(core, bound, priority_headroom))


def priority_reserve(core: Scheduler, bound: Iterable[Request], priority_headroom: int) -> int:
    """Tokens kept free for the high-priority requests (priority < 0) in ``core`` or bound for it (``bound``):
    ``priority_headroom`` each; 0 without looking at them when the headroom is 0 (the default: this runs
    after every step result)."""
    if not priority_headroom:
        return 0
    return priority_headroom * sum(r.priority < 0 for r in (*core.requests.values(), *bound))


def pick_migration(src: MemoryLoad, peers: Sequence[MemoryLoad], candidates: Sequence[tuple[str, int]],
                   headroom: float, trigger: float | None = None,
                   prefer: tuple[str, str] | None = None) -> tuple[str, str] | None:
    """``(request id, receiving worker)`` for one move off ``src``, or None.

    ``src`` moves a request out when its freeness is under ``headroom`` tokens a request (a preemption is
    near), or under ``trigger`` when given (copying a request ahead starts earlier). The receiver is the not
    busy peer with the most freeness that stays at ``headroom`` or above after
    taking it, so that the move never makes a receiver the next source (no ping-pong). Of ``candidates``
    (``(request id, tokens)``: the running decodes ``src`` could let go, or its next request without KV), the
    one with the fewest tokens: the cheapest to move, and the shortest pause for its stream, as Llumnix
    prefers. ``prefer`` (``(request id, receiver)``: a request copied ahead there) comes first while it is a
    candidate and that receiver, not busy, has room for it: a copy ahead is only worth its bytes if the move
    follows it, and the fewest tokens and the most freeness change from step to step.
    """
    if src.busy or not candidates or src.freeness >= (headroom if trigger is None else trigger):
        return None
    if prefer is not None:
        tokens = dict(candidates).get(prefer[0])
        dst = next((p for p in peers if p.name == prefer[1] and p.name != src.name and not p.busy), None)
        if tokens is not None and dst is not None and tokens <= dst.room(headroom):
            return prefer
    rid, tokens = min(candidates, key=lambda c: c[1])
    for dst in sorted((p for p in peers if p.name != src.name and not p.busy), key=lambda p: -p.freeness):
        if tokens <= dst.room(headroom):
            return rid, dst.name
    return None



TAKE_OVER, MOVE = "take over", "move"


def end_of_copy_ahead(req: Request, sender: Scheduler, src: MemoryLoad, dst: MemoryLoad, headroom: float,
                      copied: bool, busy: bool) -> str:
    """What becomes of ``req`` once a copy ahead of its blocks from ``sender`` (``src``) to ``dst`` ended
    (``copied``: it landed; ``busy``: either worker is moving another request now): ``TAKE_OVER`` (preempted
    for recompute meanwhile, it starts over on ``dst``, where the copy is its prefix hit), ``MOVE`` (``src``
    is short of memory by now: it moves, with only the rest to pull), or why nothing moves (the copy stays
    cached on ``dst`` for a later move)."""
    rid = req.request_id
    if sender.requests.get(rid) is not req:
        return "it left"
    if (copied and req.status is RequestStatus.WAITING and not req.num_pending
            and dst.room(headroom) >= req.num_tokens):
        return TAKE_OVER
    if req not in sender.running or not req.is_decoding or rid in sender.leaving or busy:
        return "it left, or a move is under way"
    if src.freeness >= headroom:
        return "room here still"
    if dst.room(headroom) < req.num_tokens:
        return "no room there"
    return MOVE
