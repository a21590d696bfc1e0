"""Waiting for a shared prefix that another request is computing (SGLang's in-batch prefix check).

The prefix cache knows a block once it is computed. Requests that share a prompt prefix and are admitted in
the same step (the n choices of one OpenAI request, a burst of agents with one system prompt) would each
compute it. Instead, a waiting request whose next uncached blocks a request scheduled in this very step is
computing stays queued for the step, and takes them from the cache once that step's plan is out. Only a
request in the step counts: one that holds the blocks but is not running now (a lower MLFQ level) could keep
the waiter waiting indefinitely.

``_computing`` maps the hash of each full block a request was admitted to compute to (that request, the
block's index in it); it is empty with prefix caching off, so nobody waits then. Entries are checked when read (the owner still runs and has not cached the block yet):
a stale one never makes anybody wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.common.block_hash import extend_hashes
from services.scheduler.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from services.scheduler.core.policies import Step
    from services.scheduler.core.scheduler import Scheduler

# Blocks shared with a request in flight before waiting a step for them pays: one block of 16 tokens does not.
MIN_SHARED_BLOCKS = 2


class SharedPrefix:
    def _note_computing(self: Scheduler, req: Request, hashes: list[int], first: int) -> None:
        """``req`` was admitted to compute its full blocks from index ``first`` on."""
        for i in range(first, len(hashes)):
            self._computing.setdefault(hashes[i], (req.request_id, i))

    def _waits_for_shared_prefix(self: Scheduler, req: Request, step: Step) -> bool:
        """Whether at least ``MIN_SHARED_BLOCKS`` blocks right after ``req``'s cached prefix are being computed
        by a request in ``step``."""
        if not self._computing or req.params.prompt_logprobs is not None:
            return False
        bs = self.blocks.block_size
        hashes = extend_hashes(req.block_hashes, req.token_ids, bs, self.seed_of(req))
        queried = min(len(hashes), (req.num_tokens - 1) // bs)  # at least one token runs, as in admission
        start = len(self.blocks.cached_prefix(hashes[:queried]))
        for k, h in enumerate(hashes[start:queried]):
            if not self._in_flight(h, req, step):
                return False
            if k + 1 >= MIN_SHARED_BLOCKS:
                return True
        return False

    def _in_flight(self: Scheduler, h: int, req: Request, step: Step) -> bool:
        entry = self._computing.get(h)
        if entry is None:
            return False
        owner = self.requests.get(entry[0])
        if owner is None or owner.status is not RequestStatus.RUNNING or owner.num_cached_blocks > entry[1]:
            del self._computing[h]  # stale: its owner left, stopped, or has cached the block
            return False
        return owner is not req and owner.request_id in step.ids

    def _forget_computing(self: Scheduler, req: Request) -> None:
        """``req`` no longer computes its blocks (finished, preempted, gone): drop its entries."""
        if not self._computing:
            return  # the usual case: nothing is in flight, and a long context has thousands of hashes
        for h in req.block_hashes:
            entry = self._computing.get(h)
            if entry is not None and entry[0] == req.request_id:
                del self._computing[h]
