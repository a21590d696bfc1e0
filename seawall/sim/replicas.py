"""Several replicas behind one placement, with live migration between them (Llumnix, OSDI '24).

Each replica is a ``Simulation`` (its own scheduler core, KV pool and clock); one event loop interleaves them
in time order::

    next event = the earliest of: an arrival, a move landing, the step start of a replica with work
    arrival    -> the replica with the fewest tokens (placement.pick_prefill, as the live mesh places prompts)
    step       -> that replica's core plans and runs one step (Simulation._step)
                  then, as the live migrator after each step result (services/scheduler/migrator.py):
                  getting short (freeness under twice the headroom)? copy its smallest running
                    decode's full blocks ahead to the peer with the most room, the request decoding on
                  short of memory (rebalance.core_load's freeness under the headroom)?
                    move its smallest running decode, KV and all, to the peer with the most room
                    (rebalance.pick_migration; one move at a time per replica, out or in), and
                    give its next request holding no KV (queued, preempted for recompute) to such a peer
    landing    -> the moved request runs on the receiver; the sender frees its blocks
    copy ahead -> the copied blocks are the receiver's prefix cache: a move pulls only the rest
      landed      (rebalance.end_of_copy_ahead: the sender short by now moves the request at once)

A move copies the request's KV blocks over the replicas' link (``migration_gbps`` per GPU, each TP rank its
shard) after a fixed ``migration_latency_s``; the request holds still meanwhile, so its stream's gap shows
the pause in the TBT figures. The source keeps the blocks until the copy landed and the receiver reserves
them when the move starts (or, short of room, once a step freed enough). Copying ahead (Llumnix's
multi-stage copy, ``migration_precopy``) uses the same core calls as the live migrator (``copy_stage``,
``reserve_arrival``, ``unstage``) over the same link. What is not modelled: the plan in flight a live sender
waits for (the simulated worker runs one plan at a time).

Totals add up over replicas: ``max_concurrent_seqs`` is the sum of each replica's peak, ``busy_frac`` the
mean over replicas.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
from collections import deque
from dataclasses import dataclass, field

from seawall.sim.loop import SimConfig, Simulation, SimulationStalled, build_cost_model, sim_model
from seawall.sim.metrics import RunTotals, summarize
from seawall.sim.workloads import RequestSpec
from services.common.errors import InvalidArgument
from services.scheduler.core.migration import copy_stage
from services.scheduler.core.request import Request
from services.scheduler.placement import EngineLoad, pick_prefill
from services.scheduler.rebalance import (
    MOVE,
    PRECOPY_LEAD,
    PRECOPY_MIN_BLOCKS,
    TAKE_OVER,
    MemoryLoad,
    core_load,
    end_of_copy_ahead,
    pick_migration,
    priority_reserve,
)

GBIT = 1e9 / 8  # bytes/s in one Gbit/s


@dataclass(frozen=True)
class ReplicaConfig:
    replicas: int = 2
    # Tokens of KV each running request must be able to grow by before its replica moves one out (the live
    # scheduler's --migration-headroom); 0: no migration.
    migration_headroom: int = 32
    migration_gbps: float = 200.0  # Gbit/s per GPU between replicas (an RDMA NIC)
    migration_latency_s: float = 0.002  # a move's fixed cost: the receiver's reservation, the pull's setup
    # Copy a decode's full blocks ahead (the live scheduler's default, --no-migration-precopy); the receiver keeps
    # them as prefix cache, so the simulation needs prefix caching on.
    migration_precopy: bool = False
    # Tokens each replica keeps free for each high-priority request it holds (the scheduler's --priority-headroom)
    priority_headroom: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise InvalidArgument(f"--replicas must be >= 1, got {self.replicas}")
        if self.migration_headroom < 0:
            raise InvalidArgument(f"--migration-headroom must be >= 0 (0: off), got {self.migration_headroom}")
        if self.priority_headroom < 0:
            raise InvalidArgument(f"--priority-headroom must be >= 0 (0: off), got {self.priority_headroom}")
        if self.migration_gbps <= 0 or self.migration_latency_s < 0:
            raise InvalidArgument("--migration-gbps must be > 0 and the migration latency >= 0")


@dataclass
class _Copy:
    """A copy ahead under way: ``pin`` holds the blocks on the sender, ``stage`` reserves them on the receiver."""

    request: Request
    src: int
    dst: int
    pin: Request
    stage: Request
    blocks: int  # copied: the receiver cached the others already


@dataclass
class _Move:
    request: Request
    src: int
    dst: int
    started: float
    held: list[int] = field(default_factory=list)


class ReplicaSimulation:
    """One run of a workload through ``rc.replicas`` replicas of ``cfg``. ``run()`` returns the metrics dict."""

    def __init__(self, cfg: SimConfig, rc: ReplicaConfig, workload: list[RequestSpec], cost=None) -> None:
        if rc.migration_precopy and not cfg.enable_prefix_caching:
            raise InvalidArgument("copying ahead keeps the copy in the receiver's prefix cache: turn prefix caching "
                                  "on (--prefix-caching) with --migration-precopy")
        self.cfg, self.rc = cfg, rc
        self.cost = cost or build_cost_model(cfg)
        self.reps = [Simulation(cfg, workload, self.cost) for _ in range(rc.replicas)]
        self.records = self.reps[0].records
        for rep in self.reps:
            rep.records = self.records  # a request's record follows it from replica to replica
        self.specs = self.reps[0].specs
        self.block_bytes = cfg.block_size * sim_model(cfg).kv_bytes_per_token / cfg.tp  # one GPU's shard
        self.blocked = [False] * rc.replicas  # planned nothing: waits for an event that concerns it
        self.waiting_room: list[deque[_Move]] = [deque() for _ in range(rc.replicas)]  # moves short of blocks
        self.landings: list[tuple[float, int, _Move]] = []  # heap of copies under way
        self._seq = itertools.count()
        self.moving: set[int] = set()  # replicas with a move with KV out of them or into them under way
        self.precopies: dict[str, tuple[int, int]] = {}  # request id -> (from, to) of each copy ahead under way
        self.prepared: dict[int, tuple[str, str]] = {}  # replica -> the request it copied ahead last, and where
        self.migrations = self.queued_moves = 0
        self.moved_blocks = self.precopied_blocks = 0
        self.pauses: list[float] = []  # hand-off to landing of each move

    # --- the loop ---

    def run(self) -> dict:
        started = time.perf_counter()
        specs, reps = self.specs, self.reps
        i, n = 0, len(specs)
        idle_rounds = 0
        inf = float("inf")
        while True:
            runnable = [k for k, rep in enumerate(reps) if rep.core.has_work and not self.blocked[k]]
            k = min(runnable, key=lambda k: reps[k].now) if runnable else None
            t_step = reps[k].now if k is not None else inf
            t_arrival = specs[i].arrival if i < n else inf
            t_land = self.landings[0][0] if self.landings else inf
            t = min(t_step, t_arrival, t_land)
            if t == inf:
                stuck = [k for k, rep in enumerate(reps) if rep.core.has_work]
                if not stuck:
                    break
                idle_rounds += 1
                if idle_rounds > 3:
                    raise SimulationStalled(f"replicas {stuck} hold work but plan nothing and nothing is due")
                self.blocked = [False] * len(reps)
                continue
            if self.cfg.max_sim_time is not None and t >= self.cfg.max_sim_time:
                break
            if t_arrival <= t:
                self._place(i, specs[i])
                i += 1
            elif t_land <= t:
                item = heapq.heappop(self.landings)[2]
                self._copied(item, t_land) if isinstance(item, _Copy) else self._land(item, t_land)
            elif self._step(k):
                idle_rounds = 0
        return self._metrics(time.perf_counter() - started)

    def _wake(self, k: int, t: float) -> None:
        self.blocked[k] = False
        self.reps[k].now = max(self.reps[k].now, t)

    def _place(self, idx: int, spec: RequestSpec) -> None:
        loads = [EngineLoad(str(k), tokens=self._tokens(k)) for k in range(len(self.reps))]
        k = int(pick_prefill(loads).name)
        self._wake(k, spec.arrival)
        self.reps[k]._add(idx, spec)

    def _tokens(self, k: int) -> int:
        """Tokens of the requests replica ``k`` holds or is about to, and those it keeps for the high-priority
        ones (the live mesh's token load, Mesh.engine_load)."""
        bound = [m.request for m in self.waiting_room[k]]
        held = sum(r.num_tokens for r in (*self.reps[k].core.requests.values(), *bound))
        return held + priority_reserve(self.reps[k].core, bound, self.rc.priority_headroom)

    def _step(self, k: int) -> bool:
        """Runs replica ``k``'s next step; False when it planned nothing (it waits for an event then)."""
        rep = self.reps[k]
        plan = rep.core.schedule(now=rep.now) if rep._pass_now else rep.core.schedule()
        if not rep._step(plan):
            self.blocked[k] = True
            return False
        self._seat(k, rep.now)
        self._rebalance(k, rep.now)
        return True

    # --- moves ---

    def _load(self, k: int, busy: bool = True, copies: bool = False) -> MemoryLoad:
        return core_load(str(k), self.reps[k].core, (m.request for m in self.waiting_room[k]),
                         busy and self._busy(k, copies), self.rc.priority_headroom)

    def _busy(self, k: int, copies: bool) -> bool:
        """A move with KV out of replica ``k`` or into it is under way (``copies``: or a copy ahead)."""
        return k in self.moving or (copies and any(k in pair for pair in self.precopies.values()))

    def _rebalance(self, k: int, now: float) -> None:
        """What the live migrator does after a step result of replica ``k`` (migrator.Migrator.after_step)."""
        headroom = self.rc.migration_headroom
        if headroom <= 0 or len(self.reps) < 2:
            return
        load = self._load(k, busy=False)
        lead = PRECOPY_LEAD if self.rc.migration_precopy else 1
        if load.freeness >= headroom * lead:
            return
        if load.freeness >= headroom:
            self._copy_ahead(k, load, headroom * lead, now)
            return
        core = self.reps[k].core
        if k not in self.moving:
            pick = pick_migration(load, [self._load(j) for j in range(len(self.reps)) if j != k],
                                  core.migratable(), headroom, prefer=self.prepared.get(k))
            if pick is not None:
                self._move(k, int(pick[1]), pick[0], now)
        queued = core.next_queued()
        if queued is None:
            return
        pick = pick_migration(load, [self._load(j, busy=False) for j in range(len(self.reps)) if j != k],
                              [(queued.request_id, queued.num_tokens)], headroom)
        if pick is not None:
            dst = int(pick[1])
            self.reps[dst].core.add(core.take_queued(queued.request_id))
            self.queued_moves += 1
            self._wake(dst, now)

    def _move(self, src: int, dst: int, rid: str, now: float) -> None:
        core = self.reps[src].core
        core.start_migration(rid)
        if rid not in core.ready_to_leave(None):  # nothing is in flight here: it may leave at once
            raise AssertionError(f"{rid} cannot leave replica {src}")
        req = core.requests[rid]
        move = _Move(req, src, dst, now, core.hand_off(rid))
        self.moving.update((src, dst))
        self.migrations += 1
        self.waiting_room[dst].append(move)
        self._seat(dst, now)

    def _seat(self, k: int, now: float) -> None:
        """Reserves blocks on replica ``k`` for the moves waiting for them, in order, and starts their copies."""
        room = self.waiting_room[k]
        while room:
            move = room[0]
            blocks = self.reps[k].core.reserve_arrival(move.request)
            if blocks is None:
                return  # retried after the next step here frees blocks
            room.popleft()
            copied = max(len(blocks) - move.request.num_cached_blocks, 0)  # blocks the receiver caches stay
            self.moved_blocks += copied
            lands = now + self.rc.migration_latency_s + copied * self.block_bytes / (self.rc.migration_gbps * GBIT)
            heapq.heappush(self.landings, (lands, next(self._seq), move))

    def _copy_ahead(self, k: int, load: MemoryLoad, trigger: float, now: float) -> None:
        """Replica ``k`` getting short copies the full blocks of the decode it would move to the peer it would
        move it to, as ``Migrator._precopy`` does; the request keeps decoding."""
        if self._busy(k, copies=True):
            return
        core = self.reps[k].core
        pick = pick_migration(load, [self._load(j, copies=True) for j in range(len(self.reps)) if j != k],
                              core.migratable(), self.rc.migration_headroom, trigger, prefer=self.prepared.get(k))
        if pick is None:
            return
        req, dst = core.requests[pick[0]], int(pick[1])
        blocks = core.precopy_blocks(req, self.reps[dst].core, PRECOPY_MIN_BLOCKS)
        if not blocks:
            return
        bs = self.cfg.block_size
        pin, stage = copy_stage(req, blocks, bs, "pin"), copy_stage(req, blocks, bs, "ahead")
        if core.reserve_arrival(pin) is None or pin.num_cached_blocks < blocks:
            core.unstage(pin, keep=False)
            return
        if self.reps[dst].core.reserve_arrival(stage) is None:
            core.unstage(pin, keep=True)
            return
        copied = blocks - stage.num_cached_blocks
        self.precopies[req.request_id] = (k, dst)
        self.prepared[k] = pick
        lands = now + self.rc.migration_latency_s + copied * self.block_bytes / (self.rc.migration_gbps * GBIT)
        heapq.heappush(self.landings, (lands, next(self._seq), _Copy(req, k, dst, pin, stage, copied)))

    def _copied(self, copy: _Copy, t: float) -> None:
        """A copy ahead landed: the receiver keeps it as prefix cache, the sender lets go of its pin; then the
        request moves (only the rest to pull) or starts over there, as ``Migrator._precopy`` decides."""
        src, dst, req = copy.src, copy.dst, copy.request
        del self.precopies[req.request_id]
        self.reps[dst].core.unstage(copy.stage, keep=True)
        self.reps[src].core.unstage(copy.pin, keep=True)
        self.precopied_blocks += copy.blocks
        self._wake(src, t)
        self._wake(dst, t)
        sender = self.reps[src].core
        what = end_of_copy_ahead(req, sender, self._load(src, busy=False), self._load(dst, busy=False),
                                 self.rc.migration_headroom, copied=True,
                                 busy=self._busy(src, copies=False) or self._busy(dst, copies=False))
        if what == TAKE_OVER:
            self.reps[dst].core.add(sender.take_queued(req.request_id))
            self.queued_moves += 1
        elif what == MOVE:
            self._move(src, dst, req.request_id, t)

    def _land(self, move: _Move, t: float) -> None:
        self.reps[move.src].core.release_handed_off(move.request.request_id)
        self.reps[move.dst].core.arrive(move.request.request_id)
        self.moving.difference_update((move.src, move.dst))
        self.pauses.append(t - move.started)
        self._wake(move.src, t)
        self._wake(move.dst, t)

    # --- metrics ---

    def _metrics(self, wall_s: float) -> dict:
        totals = RunTotals()
        preemptions: dict[str, int] = {}
        for rep in self.reps:
            for f in dataclasses.fields(RunTotals):
                mine, theirs = getattr(totals, f.name), getattr(rep.totals, f.name)
                if f.name in ("tbt", "tbt_end"):
                    mine.extend(theirs)
                else:
                    setattr(totals, f.name, mine + theirs)
            for mode, count in rep.core.preemptions.items():
                preemptions[mode] = preemptions.get(mode, 0) + count
        m = summarize(self.records, totals, preemptions)
        m["busy_frac"] /= len(self.reps)
        first = self.reps[0]._describe()
        m.update(first, replicas=len(self.reps), migration_headroom=self.rc.migration_headroom,
                 migration_gbps=self.rc.migration_gbps, migrations=self.migrations,
                 queued_moves=self.queued_moves, migrated_blocks=self.moved_blocks,
                 migration_precopy=self.rc.migration_precopy, precopied_blocks=self.precopied_blocks,
                 priority_headroom=self.rc.priority_headroom,
                 migration_pause_mean=sum(self.pauses) / len(self.pauses) if self.pauses else None,
                 migration_pause_max=max(self.pauses, default=None),
                 rejected=sum(len(rep.rejected) for rep in self.reps), sim_wall_s=wall_s)
        if self.cfg.record_requests:
            m["requests"] = [rec.as_dict(rid) for rid, rec in self.records.items()]
        return m


def simulate_replicas(cfg: SimConfig, rc: ReplicaConfig, workload: list[RequestSpec], cost=None) -> dict:
    return ReplicaSimulation(cfg, rc, workload, cost).run()
