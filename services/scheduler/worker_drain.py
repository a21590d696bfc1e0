"""A worker leaving the mesh on purpose (its SIGTERM: a rolling update, a scale-in), without losing work.

A worker that dies costs its requests a recompute elsewhere (``Mesh._fail``). One told to stop first calls
``DrainWorker``: from then on it takes no new request (placement, hand-offs, peer reads and migrations pick
only serving workers), and after each of its steps what it holds is moved out as far as the workers that stay
have room: queued requests and arrivals still waiting for blocks (no KV to copy), running decodes with their
KV (live migrations, Llumnix's way of emptying an instance before it is removed). What cannot move finishes
there. Once it holds nothing another worker or a transfer needs, the scheduler forgets it and the call
returns; the worker then stops. A drain ended by the call's deadline leaves the rest to the worker's exit,
which the mesh handles as any failure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from services.scheduler.mesh import Mesh
    from services.scheduler.worker_link import WorkerLink

log = logging.getLogger(__name__)


@dataclass
class Drain:
    """One worker's drain: what became of its requests, and when it is over."""

    moved: int = 0  # requests that went on elsewhere
    finished: int = 0  # requests that ended there meanwhile
    done: anyio.Event = field(default_factory=anyio.Event)


class WorkerDrains:
    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh

    async def drain(self, link: WorkerLink) -> Drain:
        """Drains ``link`` (a second call waits for the same drain); returns once it is over."""
        if link.drain is None:
            link.drain = Drain()
            log.info("worker %s at %s drains: %d requests there, %d arriving", link.worker_id, link.address,
                     len(link.core.requests), len(link.arrivals))
            link.wake()  # its step loop moves what it can (step) and notices when it is empty
        await link.drain.done.wait()
        return link.drain

    def step(self, link: WorkerLink) -> bool:
        """Moves out what can go now from draining ``link``; True once it is empty and retired."""
        self._move_waiting(link)
        self._move_running(link)
        if not self._empty(link):
            return False
        self.mesh.retire(link)
        return True

    def _move_waiting(self, link: WorkerLink) -> None:
        """Requests without KV there: queued ones start on another worker, arrivals wait for blocks there."""
        mesh, drain = self.mesh, link.drain
        for arrival in [a for a in link.arrivals if a.src.alive]:  # a dead source's are recomputed where they are
            dst = mesh.pick_decode_worker(arrival.request, roles=mesh.migrator.roles)
            if dst is None:
                break
            mesh.migrator.redirect(link, dst, arrival)
            drain.moved += 1
        disaggregated_decode = link.role == "decode" and mesh.config.mode == "disaggregated"
        while (req := link.core.next_queued()) is not None:
            # A decode worker's queued request recomputes its prompt on another decode worker (as after a
            # failed transfer); elsewhere it is a prompt like any other.
            dst = (mesh.pick_decode_worker(req, roles=mesh.migrator.roles) if disaggregated_decode
                   else mesh.pick_prompt_worker(req))
            if dst is None:
                break
            mesh.migrator.take_over(link, dst, req)
            drain.moved += 1

    def _move_running(self, link: WorkerLink) -> None:
        """Running decodes go with their KV to the workers with the most room, each while one has room for it
        (as the migrator's receivers must: ``MemoryLoad.room``); the smallest first, the cheapest to move."""
        mesh, migrator = self.mesh, self.mesh.migrator
        candidates = sorted(link.core.migratable(), key=lambda c: c[1])
        if not candidates:
            return
        peers = {p.worker_id: p for p in mesh.serving_links(*migrator.roles) if p is not link}
        loads = {name: migrator.load(p, busy=False) for name, p in peers.items()}
        for rid, tokens in candidates:
            fits = [load for load in loads.values() if tokens <= load.room(mesh.config.migration_headroom)]
            if not fits:
                return
            dst = max(fits, key=lambda load: load.freeness)
            migrator.leave(link.core.requests[rid], link, peers[dst.name])
            # Not in the receiver's load until handed off: counted here so the next move sees it.
            loads[dst.name] = replace(dst, demand_tokens=dst.demand_tokens + tokens, running=dst.running + 1)
            link.drain.moved += 1

    def _empty(self, link: WorkerLink) -> bool:
        """Whether ``link`` holds nothing the mesh needs: no request (a migration's mover is one until handed
        off, a copy ahead's stages pin or receive blocks as requests), no KV held for a transfer out or still
        landing, no plan in flight, no load from kvcache under way."""
        core, dual_path = link.core, self.mesh.dual_path
        loading = dual_path is not None and dual_path.admitting_tokens(link) > 0
        return not (core.requests or core.handed_off or core.landing or link.arrivals or link.in_flight or loading)
