"""Disaggregated hand-off and worker loss, as methods of ``Scheduler`` (kept apart to keep files small).

A prompt runs on a prefill worker's scheduler; ``hand_off`` ends it there but keeps its blocks while their
KV is sent, ``release_handed_off`` frees them after. On the decode worker's scheduler ``reserve_arrival``
reserves blocks for the incoming KV, ``arrive`` makes the request schedulable once it landed, and
``cancel_arrival`` recomputes it locally when the transfer failed. ``drain`` empties a dead worker's core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
        held, req.block_ids = req.block_ids, []
        self._sent_blocks.pop(request_id, None)
        if request_id in self._on_worker:
            self._on_worker.discard(request_id)
            self._to_drop.append(request_id)  # the worker drops the sequence; block contents stay
        req.status = RequestStatus.FINISHED
        self.handed_off[request_id] = held
        return list(held)

    def release_handed_off(self: Scheduler, request_id: str) -> None:
        self.blocks.free(self.handed_off.pop(request_id))

    def reserve_arrival(self: Scheduler, request: Request) -> list[int] | None:
        """Takes a request whose ``num_computed_tokens`` were computed on another worker and reserves blocks
        for them; it waits (ARRIVING) until ``arrive``. None when the pool cannot hold them now."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        got = self.blocks.allocate(self.blocks.blocks_needed(request.num_computed_tokens, 0))
        if got is None:
            return None
        request.block_ids, request.num_cached_blocks = got, 0
        request.status = RequestStatus.ARRIVING
        self.requests[request.request_id] = request
        self.arriving[request.request_id] = request
        self.policy.on_add(request, self.now)
        return list(got)

    def arrive(self: Scheduler, request_id: str) -> None:
        """The request's KV landed in its blocks: it runs from the next step on."""
        req = self.arriving.pop(request_id)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self._cache_full_blocks(req)

    def cancel_arrival(self: Scheduler, request_id: str) -> None:
        """The transfer failed: the request recomputes its KV here, queued ahead of new prompts."""
        req = self.arriving.pop(request_id)
        self._release(req)
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    def drain(self: Scheduler) -> list[Request]:
        """Removes every request (the worker died): each comes back reset to be recomputed elsewhere, with
        the tokens it already produced. The pools are abandoned with the worker."""
        reqs = sorted(self.requests.values(), key=lambda r: (r.arrival_time, r.request_id))
        for req in reqs:
            req.block_ids, req.host_block_ids = [], []
            req.num_computed_tokens = req.num_cached_blocks = 0
            req.status = RequestStatus.WAITING
            self._forget(req)
        self.arriving.clear()
        self.handed_off.clear()
        self.waiting.clear()
        self.running.clear()
        self.swapped.clear()
        return reqs
