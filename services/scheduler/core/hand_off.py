"""Disaggregated hand-off and worker loss, as methods of ``Scheduler`` (kept apart to keep files small).

A prompt runs on a prefill worker's scheduler; ``hand_off`` ends it there but keeps its blocks while their
KV is sent, ``release_handed_off`` frees them after. On the decode worker's scheduler ``reserve_arrival``
reserves blocks for the incoming KV, ``arrive`` makes the request schedulable once it landed, and
``cancel_arrival`` recomputes it locally when the transfer failed; ``reuse_fence`` says which plan must have
run before the transfer writes into the reserved blocks. A request finished while arriving (an
abort) keeps its blocks until its transfer ended (``release_landing``): the bytes still in flight must not
land in whoever takes the blocks next. ``drain`` empties a dead worker's core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.common.block_hash import extend_hashes
from services.scheduler.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from services.scheduler.core.scheduler import Scheduler


class HandOff:
    def hand_off(self: Scheduler, request_id: str) -> list[int]:
        """Ends a running request on this worker but keeps its blocks: their KV is about to be sent to another
        worker. The caller calls ``release_handed_off`` once the transfer ended."""
        req = self.requests[request_id]
        self.running.remove(req)
        self._forget(req)
        held = self._hold(req)
        req.status = RequestStatus.FINISHED
        return list(held)

    def _hold(self: Scheduler, req: Request) -> list[int]:
        """Moves the request's blocks to ``handed_off`` (still referenced) and tells the worker to drop it. Its
        partly filled last block is cached now (tail_blocks.py): nothing writes it again, and a next turn on
        this worker continues its tokens."""
        if self._caches_tails:
            self._cache_tail(req)
        held, req.block_ids = req.block_ids, []
        self._sent_blocks.pop(req.request_id, None)
        if req.request_id in self._on_worker:
            self._on_worker.discard(req.request_id)
            if self.config.recurrent_state:  # the worker keeps the state the transfer reads, until the release
                self._drop_on_release.add(req.request_id)
            else:
                self._to_drop.append(req.request_id)  # the worker drops the sequence; block contents stay
        self.handed_off[req.request_id] = held
        return held

    def release_handed_off(self: Scheduler, request_id: str) -> None:
        self.blocks.free(self.handed_off.pop(request_id))
        if request_id in self._drop_on_release:
            self._drop_on_release.discard(request_id)
            self._to_drop.append(request_id)

    def reserve_arrival(self: Scheduler, request: Request) -> list[int] | None:
        """Takes a request whose ``num_computed_tokens`` were computed on another worker and reserves blocks
        for them; it waits (ARRIVING) until ``arrive``. None when the pool cannot hold them now."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        need = self.blocks.blocks_needed(request.num_computed_tokens, 0)
        cached: list[int] = []
        # Blocks the sender dropped out of a sliding window hold nothing to send: the null block stands in
        # for them, and like cached ones they are not transferred (the caller skips num_cached_blocks).
        dropped = [self.blocks.null_block] * request.num_dropped_blocks
        if self.config.caches_prefixes and not dropped:
            # Leading blocks this worker already caches need not travel: the caller transfers only
            # block_ids[num_cached_blocks:].
            hashes = extend_hashes(request.block_hashes, request.token_ids, self.blocks.block_size,
                                   self.seed_of(request))
            cached = self.blocks.cached_prefix(hashes[: request.num_computed_tokens // self.blocks.block_size])
            self.blocks.take_cached(cached)
        got = self.blocks.allocate(need - len(cached) - len(dropped))
        if got is None:
            self.blocks.free(cached)
            return None
        request.block_ids, request.num_cached_blocks = dropped + cached + got, len(dropped) + len(cached)
        request.state_checkpoint = None  # a recurrent state arrives with the blocks; the sender's slots are not here
        request.state_branch = 0  # its prompt ran elsewhere
        request.status = RequestStatus.ARRIVING
        self.requests[request.request_id] = request
        self.arriving[request.request_id] = request
        self.policy.on_add(request, self.now)
        return list(request.block_ids)

    def reuse_fence(self: Scheduler, block_ids: list[int]) -> int:
        """The latest plan that may still use ``block_ids`` on the worker (0: none). The core frees blocks as
        it plans, while the plans before may still copy them out (a swap-out) or write them (a last decode);
        a transfer from outside the step stream (a load, a pull) writes into reserved blocks only once that
        plan ran."""
        return max((self.blocks.freed_at[b] for b in block_ids), default=0)

    def arrive(self: Scheduler, request_id: str) -> None:
        """The request's KV landed in its blocks: it runs from the next step on."""
        req = self.arriving.pop(request_id)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self._cache_full_blocks(req)

    def cache_arrival(self: Scheduler, request_id: str) -> None:
        """The arrived KV is kept only as prefix cache (staged for a later request); the request leaves."""
        req = self.arriving.pop(request_id)
        self._cache_full_blocks(req)
        self._release(req)
        req.status = RequestStatus.FINISHED
        self._forget(req)

    def cancel_arrival(self: Scheduler, request_id: str) -> None:
        """The transfer failed: the request recomputes its KV here, queued ahead of new prompts."""
        req = self.arriving.pop(request_id)
        self._release(req)
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    def release_landing(self: Scheduler, request: Request) -> None:
        """The transfer into ``request``, finished while it was arriving, ended: its blocks are free now.
        Nothing happens unless it was finished while arriving (the transfer's owner calls it either way)."""
        if request in self.landing:  # by identity: a Request compares as an entity
            self.landing.remove(request)
            self.blocks.free(request.block_ids)
            request.block_ids = []
            if self.config.recurrent_state:  # the worker holds the state the pull brought: the next plan drops it
                self._to_drop.append(request.request_id)

    def drain(self: Scheduler) -> list[Request]:
        """Removes every request (the worker died): each comes back reset to be recomputed elsewhere, with
        the tokens it already produced. The pools are abandoned with the worker."""
        reqs = sorted(self.requests.values(), key=lambda r: (r.arrival_time, r.request_id))
        for req in reqs:
            req.reset_for_recompute()
            req.num_pending = 0  # sampled on the dead worker, never to arrive
            self._forget(req)
        self.arriving.clear()
        self.landing.clear()
        self.handed_off.clear()
        self.leaving.clear()
        self._expected.clear()
        self.waiting.clear()
        self.running.clear()
        self.swapped.clear()
        self.checkpoints.clear()  # they were the dead worker's
        return reqs
