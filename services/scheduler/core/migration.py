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
        """Running decodes that could leave, with their tokens: ``(request id, tokens)``, not those leaving. Not
        a high-priority one (priority < 0) while another could: a move pauses its stream, and Llumnix moves
        normal requests off the instances of high-priority ones, not those."""
        movable = [r for r in self.running if r.is_decoding and r.request_id not in self.leaving]
        normal = [r for r in movable if r.priority >= 0]
        return [(r.request_id, r.num_tokens) for r in normal or movable]

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

    # --- copying ahead (Llumnix's multi-stage copy; migrator.py and seawall/sim/replicas.py drive it) ---

    def precopy_blocks(self: Scheduler, req: Request, receiver: Scheduler, min_blocks: int) -> int:
        """The full blocks of ``req`` (running here) to copy ahead to ``receiver``: its cached ones, or 0 when
        fewer than ``min_blocks`` of them are missing there, or when a prefix cache cannot stand for them (a
        hybrid's state must come with its blocks; a sliding window's dropped blocks hold no KV)."""
        if req.num_dropped_blocks or any(not c.config.caches_prefixes or c.config.recurrent_state
                                         for c in (self, receiver)):
            return 0
        full = req.num_cached_blocks
        there = len(receiver.blocks.cached_prefix(req.block_hashes[:full]))
        return full if full - there >= min_blocks else 0

    def unstage(self: Scheduler, stage: Request, keep: bool) -> None:
        """Lets go of a stage request's blocks (see ``copy_stage``): kept as prefix cache (``keep``, they hold
        its KV), or freed. Nothing when it is not arriving here any more (the worker was drained)."""
        if stage.request_id not in self.arriving:
            return
        if keep:
            self.cache_arrival(stage.request_id)
        else:
            self.finish(stage.request_id)
            self.release_landing(stage)  # nothing writes into its blocks any more

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



def copy_stage(req: Request, blocks: int, block_size: int, tag: str) -> Request:
    """A stage request for ``req``'s first ``blocks`` full blocks, ``reserve_arrival``-ed on a worker: on the
    sender it pins them (every one is cached there), on the receiver it reserves blocks for their copy, kept
    as prefix cache once it landed (``unstage``)."""
    n = blocks * block_size
    return Request(f"{req.request_id}#{tag}", req.token_ids[:n], req.params, req.arrival_time, lora=req.lora,
                   lora_from=req.lora_from, cache_salt=req.cache_salt, num_computed_tokens=n,
                   block_hashes=req.block_hashes[:blocks])
