"""Live migration of running decodes between workers of the same kind (rebalance.py has which and why).

After each step result of a decode worker (disaggregated) or a colocated worker, the migrator weighs that
worker against its peers and may pick one of its running decodes to move. The request stops being scheduled
there (``Scheduler.start_migration``); once no plan in flight runs it, it is handed off exactly as a prefill
worker hands a prompt off: the receiver reserves blocks, pulls the KV by block id (NIXL or the gRPC
fallback), and the request decodes there from its next token on. Its stream pauses for about a step and the
transfer, against a preemption's swap out and back or recompute. A failed transfer recomputes it on the
receiver, as any hand-off's does. One move at a time per worker, out or in. A worker short of memory also
gives its next request that holds no KV yet to the peer with the most room (``_give_queued``): nothing to copy.

Copy ahead (Llumnix's multi-stage migration, ``_precopy``; ``--no-migration-precopy`` turns it off): a request with
``PRECOPY_MIN_BLOCKS`` or more full blocks the receiver does not cache first has those copied while it keeps
decoding. A full block is never written again, so the receiver keeps the copies as prefix cache, and the
stop-and-copy that follows finds them there (``reserve_arrival``'s cached blocks are not pulled): only what
the request computed since, a block or two, travels while its stream pauses. The sender pins the blocks (a
stage request holding them, as a peer-prefix read does) so that a request preempted or finished meanwhile
does not free them under the read. The copy happens while the worker is getting short, between
``PRECOPY_LEAD`` times the headroom and the headroom; a worker short of memory moves at once, pulling only
what was not copied ahead: waiting for a copy, the mover, still growing, could run the worker out. The
request a worker copied ahead last, and its receiver, stay its choice for the next copy (only the blocks
added since travel) and for the move, while that receiver has room (``prepared``): picked afresh each
step, the fewest tokens and the freest peer change, and in the simulator at 16 replicas only 6 % of the
blocks copied ahead were ever used by a move (16 % with the choice kept; docs/sim.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from services.scheduler.core.migration import copy_stage
from services.scheduler.core.request import Request
from services.scheduler.rebalance import (
    MOVE,
    PRECOPY_LEAD,
    PRECOPY_MIN_BLOCKS,
    TAKE_OVER,
    MemoryLoad,
    core_load,
    end_of_copy_ahead,
    pick_migration,
)
from services.scheduler.worker_link import Arrival, WorkerLink

if TYPE_CHECKING:
    from services.scheduler.mesh import Mesh

log = logging.getLogger(__name__)


class Migrator:
    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.moves: dict[str, tuple[WorkerLink, WorkerLink]] = {}  # request id -> (from, to), until it landed
        self.precopies: dict[str, tuple[WorkerLink, WorkerLink]] = {}  # copying ahead, the request still decoding
        # Worker id -> (request id, receiver id) of the request it copied ahead last: its next copy tops that one
        # up and its move takes it there, while they can (pick_migration's prefer).
        self.prepared: dict[str, tuple[str, str]] = {}
        self.stopped_at: dict[str, float] = {}  # when each move's request stopped being scheduled, until it landed
        self.num_migrations = 0
        self.num_queued_moves = 0
        self.num_precopied_blocks = 0

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
        if headroom <= 0 or (self.roles and link.role not in self.roles) or link.drain is not None:
            return  # a draining worker's requests move out by worker_drain.py's rules
        load = self.load(link, busy=False)
        lead = PRECOPY_LEAD if self.mesh.config.migration_precopy else 1
        if load.freeness >= headroom * lead:  # the common case, decided without weighing the peers
            return
        if load.freeness >= headroom:  # getting short: copy a decode ahead, move nothing yet
            self._start(link, load, headroom * lead, copy_only=True)
            return
        self._start(link, load)
        self._give_queued(link, load)

    def hand_off_ready(self, src: WorkerLink) -> None:
        """Hands off the requests leaving ``src`` that no plan in flight runs any more."""
        for rid in src.core.ready_to_leave(src.in_flight[0] if src.in_flight else None):
            _, dst = self.moves[rid]
            if not dst.serving:  # gone, or draining since the move started: picked afresh (or not)
                src.core.cancel_migration(rid)
                del self.moves[rid]
                self.stopped_at.pop(rid, None)
                src.wake()
                continue
            self.mesh.hand_off(src, src.core.requests[rid], dst)
            self.mesh.metrics.migrations.labels(src.worker_id, dst.worker_id).inc()
            self.num_migrations += 1

    def _start(self, src: WorkerLink, load: MemoryLoad, trigger: float | None = None, copy_only: bool = False) -> None:
        """Maybe starts moving one of ``src``'s running decodes (``load``: ``src``, under ``trigger`` tokens a
        request, by default the headroom); ``copy_only``: only copy its blocks ahead, if there are enough."""
        # A copy ahead under way does not hold back a worker short of memory: the request moves all the same
        # (wherever the copy was bound, it is only a cache there).
        if self._busy(src, copies=copy_only):
            return
        peers = {link.worker_id: link for link in self.mesh.serving_links(*self.roles) if link is not src}
        loads = [self.load(link, copies=copy_only) for link in peers.values()]
        pick = pick_migration(load, loads, src.core.migratable(), self.mesh.config.migration_headroom, trigger,
                              prefer=self.prepared.get(src.worker_id))
        if pick is None:
            return
        rid, dst_id = pick
        dst, req = peers[dst_id], src.core.requests[rid]
        # A worker short of memory moves at once: a copy ahead it would wait for might outlast its room. What was
        # copied ahead before it got short is cached on the receiver and not pulled again.
        blocks = self._precopy_blocks(req, src, dst) if copy_only else 0
        if blocks:
            log.debug("copying %d blocks of %s ahead from %s (freeness %.0f) to %s", blocks, rid, src.worker_id,
                      load.freeness, dst_id)
            self.precopies[rid] = (src, dst)
            self.prepared[src.worker_id] = pick
            self.mesh.spawn(self._precopy, req, src, dst, blocks)
        elif not copy_only:
            log.debug("migrating %s from %s (freeness %.0f) to %s", rid, src.worker_id, load.freeness, dst_id)
            self.leave(req, src, dst)

    def leave(self, req: Request, src: WorkerLink, dst: WorkerLink) -> None:
        """Stops scheduling ``req`` on ``src``: it moves to ``dst`` once no plan in flight runs it."""
        src.core.start_migration(req.request_id)
        self.moves[req.request_id] = (src, dst)
        self.stopped_at[req.request_id] = anyio.current_time()
        self.hand_off_ready(src)  # at once when no plan in flight runs it

    # --- copying ahead ---

    def _precopy_blocks(self, req: Request, src: WorkerLink, dst: WorkerLink) -> int:
        """The full blocks of ``req`` to copy ahead to ``dst`` (``Scheduler.precopy_blocks``); 0 when off."""
        if not self.mesh.config.migration_precopy:
            return 0
        return src.core.precopy_blocks(req, dst.core, PRECOPY_MIN_BLOCKS)

    async def _precopy(self, req: Request, src: WorkerLink, dst: WorkerLink, blocks: int) -> None:
        """Copies ``req``'s first ``blocks`` (full) blocks into ``dst``'s prefix cache while it decodes on
        ``src``. Then, if ``src`` is short of memory by now, moves it (only the rest is pulled); a mover
        preempted for recompute meanwhile starts over on ``dst``. Nothing moves when ``req`` left ``src``
        (finished, moved already), when either worker died, drains or is moving another request, or when
        ``src`` has room still: the copy stays cached on ``dst`` for a later move."""
        try:
            ok = await self._copy_ahead(req, src, dst, blocks)
        finally:
            del self.precopies[req.request_id]
        if not (src.serving and dst.serving):  # a draining sender's requests move by worker_drain.py's rules
            return
        what = end_of_copy_ahead(req, src.core, self.load(src, busy=False), self.load(dst, busy=False),
                                 self.mesh.config.migration_headroom, copied=ok,
                                 busy=self._busy(src, copies=False) or self._busy(dst, copies=False))
        if what == TAKE_OVER:
            self.take_over(src, dst, req)
        elif what == MOVE:
            self.leave(req, src, dst)
        else:
            log.debug("no move of %s after copying ahead (%s): %s", req.request_id,
                      "copied" if ok else "copy failed", what)

    async def _copy_ahead(self, req: Request, src: WorkerLink, dst: WorkerLink, blocks: int) -> bool:
        pin, copy = (copy_stage(req, blocks, src.core.blocks.block_size, tag) for tag in ("pin", "ahead"))
        held = src.core.reserve_arrival(pin)  # every block is cached there (the request holds them): pins them
        if held is None or pin.num_cached_blocks < blocks:
            self._unstage(src, pin, keep=False)
            return False
        ok = False
        try:
            staged = dst.core.reserve_arrival(copy)
            if staged is None:
                return False
            try:
                skip = copy.num_cached_blocks
                # Their previous owners are done with the blocks on the worker before the pull writes them.
                await dst.plans_done(dst.core.reuse_fence(staged[skip:]))
                ok = await self.mesh.peer.pull(req, dst, src, held[skip:], staged[skip:])
                self.num_precopied_blocks += (blocks - skip) if ok else 0
            finally:
                self._unstage(dst, copy, keep=ok)
        finally:
            self._unstage(src, pin, keep=True)
        return ok

    @staticmethod
    def _unstage(link: WorkerLink, stage: Request, keep: bool) -> None:
        """``Scheduler.unstage`` on a live worker (a dead one's core was emptied)."""
        if link.alive:
            link.core.unstage(stage, keep)
            link.wake()

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
        peers = {link.worker_id: link for link in self.mesh.serving_links(*self.roles) if link is not src}
        pick = pick_migration(load, [self.load(link, busy=False) for link in peers.values()],
                              [(req.request_id, req.num_tokens)], headroom)
        if pick is None:
            return
        dst = peers[pick[1]]
        if arrival is None:
            self.take_over(src, dst, req)
        else:
            self.redirect(src, dst, arrival)

    def redirect(self, src: WorkerLink, dst: WorkerLink, arrival: Arrival) -> None:
        """``arrival``, waiting on ``src`` for blocks, waits on ``dst`` instead (its KV is pulled from its
        sender there)."""
        src.arrivals.remove(arrival)
        dst.arrivals.append(arrival)
        self._count_queued_move(src, dst)

    def take_over(self, src: WorkerLink, dst: WorkerLink, req: Request) -> None:
        """``dst`` starts ``req``, waiting on ``src`` without KV there (queued, or preempted for recompute)."""
        self.mesh.where.pop(req.request_id, None)
        self.mesh.place_on(dst, src.core.take_queued(req.request_id))
        src.wake()  # a preempted request's sequence was dropped there when it was preempted
        self._count_queued_move(src, dst)

    def _count_queued_move(self, src: WorkerLink, dst: WorkerLink) -> None:
        self.mesh.metrics.queued_moves.labels(src.worker_id, dst.worker_id).inc()
        self.num_queued_moves += 1
        dst.wake()

    def load(self, link: WorkerLink, busy: bool = True, copies: bool = True) -> MemoryLoad:
        """``link`` as rebalancing sees it; ``busy``: marked so while a move out of it or into it is under way
        (a move without KV leaves nothing under way, so it need not wait for one); ``copies``: a copy ahead
        counts as one."""
        return core_load(link.worker_id, link.core, (a.request for a in link.arrivals),
                         busy and self._busy(link, copies), self.mesh.config.priority_headroom)

    def _busy(self, link: WorkerLink, copies: bool = True) -> bool:
        """Whether a move with KV out of ``link`` or into it is under way (``copies``: or a copy ahead)."""
        pairs = [*self.moves.values(), *(self.precopies.values() if copies else ())]
        return any(link is a or link is b for a, b in pairs)

    def _forget_landed(self) -> None:
        """Drops the moves that ended: landed (or recomputing) on the receiver, finished, or abandoned."""
        for rid, (src, dst) in list(self.moves.items()):
            leaving = rid in src.core.leaving
            arriving = rid in dst.core.arriving or any(a.request.request_id == rid for a in dst.arrivals)
            if not (leaving and src.alive) and not (arriving and dst.alive):
                del self.moves[rid]
                self.stopped_at.pop(rid, None)

    def landed(self, request_id: str) -> None:
        """A request's KV landed on its receiver: if it was migrating, its pause ends (the metric's sample)."""
        stopped = self.stopped_at.pop(request_id, None)
        if stopped is not None:
            paused = anyio.current_time() - stopped
            log.debug("%s landed after a pause of %.3f s", request_id, paused)
            self.mesh.metrics.migration_pause.observe(paused)
