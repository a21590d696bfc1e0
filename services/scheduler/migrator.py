"""Live migration of running decodes between workers of the same kind (rebalance.py has which and why).

After each step result of a decode worker (disaggregated) or a colocated worker, the migrator weighs that
worker against its peers and may pick one of its running decodes to move. The request stops being scheduled
there (``Scheduler.start_migration``); once no plan in flight runs it, it is handed off exactly as a prefill
worker hands a prompt off: the receiver reserves blocks, pulls the KV by block id (NIXL or the gRPC
fallback), and the request decodes there from its next token on. Its stream pauses for about a step and the
transfer, against a preemption's swap out and back or recompute. A failed transfer recomputes it on the
receiver, as any hand-off's does. One move at a time per worker, out or in. A worker short of memory also
gives its next request that holds no KV yet to the peer with the most room (``_give_queued``): nothing to copy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from services.scheduler.rebalance import MemoryLoad, core_load, pick_migration
from services.scheduler.worker_link import WorkerLink

if TYPE_CHECKING:
    from services.scheduler.mesh import Mesh

log = logging.getLogger(__name__)


class Migrator:
    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.moves: dict[str, tuple[WorkerLink, WorkerLink]] = {}  # request id -> (from, to), until it landed
        self.num_migrations = 0
        self.num_queued_moves = 0

    @property
    def roles(self) -> tuple[str, ...]:
        """The workers that decode, between which requests move: every one when colocated (whatever role it
        registered with), else the decode workers."""
        return () if self.mesh.config.mode == "colocated" else ("decode", "hybrid")

    def after_step(self, link: WorkerLink) -> None:
        """``link``'s step result was applied: hand off what may leave now, then maybe start a move off it."""
        if self.moves:
            self._forget_landed()
            self.hand_off_ready(link)
        headroom = self.mesh.config.migration_headroom
        if headroom <= 0 or (self.roles and link.role not in self.roles):
            return
        load = self._load(link, busy=False)
        if load.freeness >= headroom:  # the common case, decided without weighing the peers
            return
        self._start(link, load)
        self._give_queued(link, load)

    def hand_off_ready(self, src: WorkerLink) -> None:
        """Hands off the requests leaving ``src`` that no plan in flight runs any more."""
        for rid in src.core.ready_to_leave(src.in_flight[0] if src.in_flight else None):
            _, dst = self.moves[rid]
            if not dst.alive:
                src.core.cancel_migration(rid)
                del self.moves[rid]
                src.wake()
                continue
            self.mesh.hand_off(src, src.core.requests[rid], dst)
            self.mesh.metrics.migrations.labels(src.worker_id, dst.worker_id).inc()
            self.num_migrations += 1

    def _start(self, src: WorkerLink, load: MemoryLoad) -> None:
        """Maybe starts moving one of ``src``'s running decodes (``load``: ``src``, short of memory)."""
        if self._busy(src):
            return
        headroom = self.mesh.config.migration_headroom
        peers = {link.worker_id: link for link in self.mesh.live_links(*self.roles) if link is not src}
        loads = [self._load(link) for link in peers.values()]
        pick = pick_migration(load, loads, src.core.migratable(), headroom)
        if pick is None:
            return
        rid, dst_id = pick
        src.core.start_migration(rid)
        self.moves[rid] = (src, peers[dst_id])
        log.debug("migrating %s from %s (freeness %.0f) to %s", rid, src.worker_id, load.freeness, dst_id)
        self.hand_off_ready(src)  # at once when no plan in flight runs it

    def _give_queued(self, src: WorkerLink, load: MemoryLoad) -> None:
        """``src``, short of memory, gives its next request that holds no KV there yet to the peer with the
        most room: a queued prompt or a request preempted for recompute (it starts there instead), or an
        arrival still waiting for blocks (the peer pulls its KV from the prefill worker instead). Nothing is
        copied, so no move is under way after it. One per step result; an idle peer is a receiver too."""
        arrival = next((a for a in src.arrivals if a.src.alive and a.request.request_id not in self.moves), None)
        req = arrival.request if arrival is not None else src.core.next_queued()
        if req is None:
            return
        headroom = self.mesh.config.migration_headroom
        peers = {link.worker_id: link for link in self.mesh.live_links(*self.roles) if link is not src}
        pick = pick_migration(load, [self._load(link, busy=False) for link in peers.values()],
                              [(req.request_id, req.num_tokens)], headroom)
        if pick is None:
            return
        dst = peers[pick[1]]
        if arrival is not None:
            src.arrivals.remove(arrival)
            dst.arrivals.append(arrival)
        else:
            self.mesh.where.pop(req.request_id, None)
            self.mesh.place_on(dst, src.core.take_queued(req.request_id))
            src.wake()  # a preempted request's sequence was dropped there when it was preempted
        self.mesh.metrics.queued_moves.labels(src.worker_id, dst.worker_id).inc()
        self.num_queued_moves += 1
        dst.wake()

    def _load(self, link: WorkerLink, busy: bool = True) -> MemoryLoad:
        """``link`` as rebalancing sees it; ``busy``: marked so while a move out of it or into it is under way
        (a move without KV leaves nothing under way, so it need not wait for one)."""
        return core_load(link.worker_id, link.core, (a.request for a in link.arrivals), busy and self._busy(link))

    def _busy(self, link: WorkerLink) -> bool:
        """Whether a move with KV out of ``link`` or into it is under way."""
        return any(link is a or link is b for a, b in self.moves.values())

    def _forget_landed(self) -> None:
        """Drops the moves that ended: landed (or recomputing) on the receiver, finished, or abandoned."""
        for rid, (src, dst) in list(self.moves.items()):
            leaving = rid in src.core.leaving
            arriving = rid in dst.core.arriving or any(a.request.request_id == rid for a in dst.arrivals)
            if not (leaving and src.alive) and not (arriving and dst.alive):
                del self.moves[rid]
