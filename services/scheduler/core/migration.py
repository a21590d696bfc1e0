"""Live migration of running decodes between workers (Llumnix, OSDI '24), as methods of ``Scheduler``.

A request picked to leave stops being scheduled (``start_migration``) but keeps its blocks; once no plan the
worker was sent still runs it (``ready_to_leave``), the caller hands it off (``hand_off``) and the receiving
worker pulls its KV as it pulls a prefill worker's. Meanwhile it is neither a victim nor a decode: it holds
still, for about one step and the transfer. ``leaving`` is cleared when it is handed off, finishes (an
abort, a stop in a token still in flight) or the worker is drained. A waiting request holds no KV here and
leaves at once (``take_queued``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.scheduler.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from services.scheduler.core.scheduler import Scheduler


class Migration:
    def migratable(self: Scheduler) -> list[tuple[str, int]]:
        """Running decodes that could leave, with their tokens: ``(request id, tokens)``, not those leaving."""
        return [(r.request_id, r.num_tokens) for r in self.running if r.is_decoding and r.request_id not in self.leaving]

    def start_migration(self: Scheduler, request_id: str) -> None:
        """Stops scheduling ``request_id`` (a running decode): it is about to move to another worker. Plans up
        to the latest one may still run it; ``ready_to_leave`` says when none is left in flight."""
        req = self.requests[request_id]
        if req.status is not RequestStatus.RUNNING:
            raise ValueError(f"request {request_id!r} is {req.status.name}, not running: it cannot migrate")
        self.leaving[request_id] = self._step_id

    def ready_to_leave(self: Scheduler, oldest_in_flight: int | None) -> list[str]:
        """The leaving requests no plan still in flight runs (``oldest_in_flight``: the step id of the oldest
        plan whose result is not back, None when none is): their outputs are known and their KV written, so
        they can be handed off."""
        return [rid for rid, fence in self.leaving.items()
                if (oldest_in_flight is None or fence < oldest_in_flight) and not self.requests[rid].num_pending]

    def cancel_migration(self: Scheduler, request_id: str) -> None:
        """The move is off (its receiver is gone): the request is scheduled here again."""
        self.leaving.pop(request_id, None)

    def next_queued(self: Scheduler) -> Request | None:
        """The waiting request that would start next here and could start on another worker as well: no token
        of it in flight. The most important first (``priority``), then the oldest."""
        ready = [r for r in self.waiting if not r.num_pending]
        return min(ready, key=lambda r: (r.priority, r.arrival_time)) if ready else None

    def take_queued(self: Scheduler, request_id: str) -> Request:
        """Removes waiting ``request_id`` (it holds no blocks) to start on another worker; a request preempted
        here leaves its sequence for the worker to drop, as when it was preempted."""
        req = self.requests[request_id]
        if req.status is not RequestStatus.WAITING or req.num_pending:
            raise ValueError(f"request {request_id!r} is {req.status.name} with {req.num_pending} tokens in flight: "
                             "only a waiting request with none moves without its KV")
        self.waiting.remove(req)
        self._forget(req)
        return req

