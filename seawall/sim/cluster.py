"""Cluster-scale simulation of PD-disaggregated serving that loads cached KV from storage (DualPath).

P prefill nodes and D decode nodes of ``gpus_per_node`` GPUs (an engine is ``tp`` GPUs). Each node has one
storage NIC (SNIC, to the KV store, e.g. 3FS) and a DRAM buffer; each GPU has a compute NIC (CNIC, to the
other nodes). A request's hit prefix (the KV of an earlier turn, in storage) reaches the prefill engine by
one of two paths (papers.md §4.2):

* **PE-read**: storage → PE node's SNIC → PE DRAM buffer; during prefill, buffer → PE HBM layer by layer
  (through the PE's CNIC: every byte into or out of a GPU is an RDMA write of its CNIC, §4.4); the PE sends
  hit + newly computed KV to the DE's buffer.
* **DE-read**: storage → DE node's SNIC → DE DRAM buffer; during prefill, DE buffer → PE HBM over the
  CNICs; the PE sends back only the newly computed KV, merged with the hit KV in the DE buffer.

Either way the DE then copies the request's KV from its buffer into HBM (its CNIC) and decodes it with
every other request it holds (continuous batching, no batch cap but KV). Finished requests' new blocks
(the miss and the output) are written back through the DE node's SNIC (its transmit side; reads are not
slowed by it).

Scheduling follows papers.md §4.5: a global FIFO queue; the prefill engine is the least-token engine among
those under β tokens, preferring nodes whose storage-read queue is under α (C2 before C3); the decode node
is the one with the fewest tokens, the engine inside it by the Z rule (least sequences among those under
1.05 × the mean tokens, else least tokens) among engines with free HBM; the read side (``dual``) is the one
whose node's storage-read queue is shorter. ``placement="round-robin"`` cycles engines and (under
``dual``) alternates the read side instead, blind to load. ``pe-read`` is the standard design, ``de-read``
always reads on the decode side, ``oracle`` moves KV for free (no storage, H2D or PD transfer: DualPath's
Oracle baseline).

Prefill engines batch FIFO within a compute quota (300 ms) and chunk a request that does not fit; a step
lasts the longer of its compute (the roofline cost model, ``cost_model.py``) and its layer-wise KV traffic
on the engine's CNIC. Links are FIFO queues with fixed bandwidth (a transfer that crosses two links holds
both). Decode steps come from the same cost model; a decode engine runs its batch in stretches between
joins and finishes (exact step count, step time evaluated at the stretch's mean context).

What is not modelled: model collectives on the CNICs (DP engines need none; §4.4's virtual lanes would give
KV only what they leave), PCIe and DRAM bandwidth inside a node (papers.md §4.3's bottleneck-free bounds),
the storage backend's own limits (3FS saturates the SNIC, §4.6), eviction (the store keeps everything),
HBM of prefill engines (layer-wise prefill holds one layer) and preemption. docs/sim.md lists the choices.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from seawall.sim.cost_model import RooflineCostModel, StepShape, kv_pool_blocks
from seawall.sim.hardware import get_gpu
from seawall.sim.models import check_kv_cache_dtype, get_model, with_kv_cache_dtype
from seawall.workloads.multiturn import (
    AgenticConfig,
    MooncakeReplayConfig,
    MultiTurnRequest,
    agentic_sessions,
    mooncake_conversation,
    structural_hits,
)
from services.common.errors import InvalidArgument

GBIT = 1e9 / 8  # bytes/s in one Gbit/s
READ_POLICIES = ("pe-read", "de-read", "dual", "oracle")
PLACEMENTS = ("load", "round-robin")
WORKLOADS = ("agentic", "mooncake-conv")
PE, DE = "pe", "de"


@dataclass(frozen=True)
class ClusterConfig:
    # Defaults: Qwen2.5-32B (dense, FP16 KV) as DualPath runs it, 1P2D with DP engines on Hopper nodes. H200,
    # not H100: on an 80 GB GPU its 65 GB of weights leave ~43K tokens of KV, less than one 64K session.
    model: str = "Qwen2.5-32B"
    gpu: str = "H200"
    tp: int = 1  # GPUs per engine
    gpus_per_node: int = 8
    prefill_nodes: int = 1
    decode_nodes: int = 2
    storage_gbps: float = 400.0  # one storage NIC per node
    compute_gbps: float = 400.0  # one compute NIC per GPU
    dram_gb: float = 320.0  # DRAM buffer per node (DualPath: 320 GB for Qwen, 80 GB for DeepSeek)
    read_policy: str = "dual"
    placement: str = "load"
    prefill_quota_s: float = 0.3  # compute budget of one prefill batch
    min_chunk: int = 128  # a request alone past the quota still runs this many tokens per step
    alpha_s: float = 3.0  # α: storage-read queue (seconds of the node's SNIC) under which a PE is preferred
    beta_s: float = 5.0  # β: tokens one engine prefills in this long; an engine above it gets no more work
    block_size: int = 16  # HBM KV block (the decode engines' pools are sized in these)
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"  # "fp8": one byte a KV element: half the bytes stored, read and moved, 2x the HBM tokens
    window_s: float = 10.0  # storage-NIC balance is measured in windows of this length
    record_requests: bool = False

    def validate(self) -> None:
        if self.read_policy not in READ_POLICIES:
            raise InvalidArgument(f"--read-policy must be one of {', '.join(READ_POLICIES)}, got "
                                  f"{self.read_policy!r}")
        if self.placement not in PLACEMENTS:
            raise InvalidArgument(f"--placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        check_kv_cache_dtype(self.kv_cache_dtype)
        if min(self.prefill_nodes, self.decode_nodes, self.tp, self.gpus_per_node) < 1:
            raise InvalidArgument("--prefill, --decode, --tp and --gpus-per-node must be >= 1")
        if self.gpus_per_node % self.tp:
            raise InvalidArgument(f"--tp {self.tp} does not divide --gpus-per-node {self.gpus_per_node}")
        if min(self.storage_gbps, self.compute_gbps, self.dram_gb, self.prefill_quota_s, self.window_s) <= 0:
            raise InvalidArgument("bandwidths, DRAM, the prefill quota and the window must be > 0")


class Link:
    """One direction of a NIC: a FIFO queue with a fixed bandwidth; ``log`` keeps (start, end, bytes)."""

    __slots__ = ("name", "bw", "free_at", "bytes", "busy", "log")

    def __init__(self, name: str, bw: float, log: bool = False) -> None:
        self.name, self.bw, self.free_at, self.bytes, self.busy = name, bw, 0.0, 0.0, 0.0
        self.log: list[tuple[float, float, float]] | None = [] if log else None

    def queued_bytes(self, now: float) -> float:
        return max(0.0, self.free_at - now) * self.bw


def transfer(now: float, nbytes: float, links: Sequence[Link]) -> float:
    """Reserves ``nbytes`` on every link in ``links`` at once (FIFO after what each already holds); returns
    the end. A transfer crossing two links runs at the slower one's rate and holds both."""
    if nbytes <= 0:
        return now
    start = max(now, *(lk.free_at for lk in links))
    end = start + nbytes / min(lk.bw for lk in links)
    for lk in links:
        lk.free_at = end
        lk.bytes += nbytes
        lk.busy += end - start
        if lk.log is not None:
            lk.log.append((start, end, nbytes))
    return end


class Node:
    __slots__ = ("kind", "idx", "snic", "snic_write", "dram_cap", "dram_used", "dram_peak", "engines", "tok")

    def __init__(self, kind: str, idx: int, storage_bw: float, dram: float) -> None:
        self.kind, self.idx = kind, idx
        self.snic = Link(f"{kind}{idx}.snic", storage_bw, log=True)
        self.snic_write = Link(f"{kind}{idx}.snic-tx", storage_bw)
        self.dram_cap, self.dram_used, self.dram_peak = dram, 0.0, 0.0
        self.engines: list[Engine] = []
        self.tok = 0  # Σ tok of its engines

    @property
    def name(self) -> str:
        return f"{self.kind}{self.idx}"

    def dram(self, nbytes: float) -> None:
        self.dram_used += nbytes
        self.dram_peak = max(self.dram_peak, self.dram_used)


class Engine:
    __slots__ = ("kind", "idx", "node", "cnic_tx", "cnic_rx", "tok", "seq", "queue", "busy", "busy_s",
                 "kv_cap", "kv_used", "running", "pending", "epoch", "epoch_id")

    def __init__(self, kind: str, idx: int, node: Node, cnic_bw: float, kv_cap: int = 0) -> None:
        self.kind, self.idx, self.node = kind, idx, node
        self.cnic_tx = Link(f"{kind}e{idx}.cnic-tx", cnic_bw)
        self.cnic_rx = Link(f"{kind}e{idx}.cnic-rx", cnic_bw)
        self.tok, self.seq = 0, 0  # tokens and requests assigned and not finished here (papers.md §4.5)
        self.queue: deque[Job] = deque()  # prefill: requests whose hit KV is in a buffer
        self.busy, self.busy_s = False, 0.0
        self.kv_cap, self.kv_used = kv_cap, 0  # decode: HBM KV slots (tokens)
        self.running: list[Job] = []
        self.pending: list[Job] = []
        self.epoch: tuple[float, float, int, int] | None = None  # (start, step time, steps, id)
        self.epoch_id = 0


class Job:
    __slots__ = ("req", "hit", "miss", "prompt", "output", "kv", "release", "pe", "de", "side", "prefilled",
                 "decoded", "t_placed", "t_read", "t_first", "t_join", "t_second", "t_finish")

    def __init__(self, req: MultiTurnRequest, hit: int, block_size: int) -> None:
        self.req, self.prompt, self.output = req, req.prompt_len, req.max_tokens
        self.hit = min(hit, self.prompt - 1)  # at least one prompt token runs, for its logits
        self.miss = self.prompt - self.hit
        self.kv = -(-(self.prompt + self.output) // block_size) * block_size
        self.release = req.arrival_s
        self.pe: Engine | None = None
        self.de: Engine | None = None
        self.side = PE
        self.prefilled = self.decoded = 0
        self.t_placed = self.t_read = self.t_first = self.t_join = self.t_second = self.t_finish = None


class ClusterSimulation:
    """One run; ``run()`` returns the metrics dict.

    ``hits``: cached prefix tokens per request (same order as ``requests``), e.g. ``structural_hits``.
    ``closed_loop``: a turn is released when the previous turn of its session finishes (+ think time), not
    before its ``arrival_s`` (agentic sessions); otherwise every request is released at ``arrival_s``.
    """

    def __init__(self, cfg: ClusterConfig, requests: Sequence[MultiTurnRequest], hits: Sequence[int],
                 closed_loop: bool = True) -> None:
        cfg.validate()
        if not requests:
            raise InvalidArgument("the workload is empty")
        if len(hits) != len(requests):
            raise InvalidArgument(f"{len(hits)} hit counts for {len(requests)} requests")
        self.cfg, self.closed_loop = cfg, closed_loop
        self.model, gpu = with_kv_cache_dtype(get_model(cfg.model), cfg.kv_cache_dtype), get_gpu(cfg.gpu)
        self.cost = RooflineCostModel(self.model, gpu, cfg.tp, block_size=cfg.block_size)
        self.kvb = float(self.model.kv_bytes_per_token)
        kv_cap = kv_pool_blocks(self.model, gpu, cfg.tp, cfg.block_size, cfg.gpu_memory_utilization) \
            * cfg.block_size
        per_node = cfg.gpus_per_node // cfg.tp
        self.nodes = [Node(PE, i, cfg.storage_gbps * GBIT, cfg.dram_gb * 1e9) for i in range(cfg.prefill_nodes)]
        self.nodes += [Node(DE, i, cfg.storage_gbps * GBIT, cfg.dram_gb * 1e9) for i in range(cfg.decode_nodes)]
        self.pes: list[Engine] = []
        self.des: list[Engine] = []
        for node in self.nodes:
            for _ in range(per_node):
                pool = self.pes if node.kind == PE else self.des
                eng = Engine(node.kind, len(pool), node, cfg.tp * cfg.compute_gbps * GBIT,
                             kv_cap if node.kind == DE else 0)
                pool.append(eng)
                node.engines.append(eng)
        self.de_nodes = [n for n in self.nodes if n.kind == DE]
        self.jobs = [Job(r, h, cfg.block_size) for r, h in zip(requests, hits, strict=True)]
        self.children: dict[str, list[Job]] = {}
        self.alpha = cfg.alpha_s * cfg.storage_gbps * GBIT / self.kvb  # tokens
        self.beta = self._profile_beta()
        self.now = 0.0
        self.waiting: deque[Job] = deque()
        self.rejected: list[Job] = []
        self._events: list = []
        self._seq = itertools.count()
        self._dirty = False
        self._rr = [0, 0, 0]  # round robin: next PE, next DE, next side
        self._step_cache: dict[tuple, float] = {}
        self.free_io = cfg.read_policy == "oracle"
        self.bytes = {"storage_read": 0.0, "pe_local_load": 0.0, "de_to_pe": 0.0, "pe_to_de": 0.0,
                      "h2d": 0.0, "storage_write": 0.0}

    # --- set-up ---

    def _profile_beta(self) -> float:
        """β in tokens: beta_s × the prompt tokens one engine prefills per second on this workload (a sample
        of its requests, each alone)."""
        sample = random.Random(0).sample(self.jobs, min(len(self.jobs), 256))
        secs = sum(self.cost.step_time(StepShape.of([(j.miss, j.hit)], num_sampled=1)) for j in sample)
        return self.cfg.beta_s * sum(j.prompt for j in sample) / max(secs, 1e-9)

    def _move(self, t: float, nbytes: float, links: Sequence[Link], counter: str) -> float:
        """KV bytes over ``links`` from ``t`` (counted under ``counter``); returns when they are there."""
        if self.free_io or nbytes <= 0:
            return t
        self.bytes[counter] += nbytes
        return transfer(t, nbytes, links)

    def _at(self, t: float, fn, *args) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn, args))

    # --- the loop ---

    def run(self) -> dict:
        started = time.perf_counter()
        for job in self.jobs:
            prev = job.req.prev_request_id
            if self.closed_loop and prev is not None:
                self.children.setdefault(prev, []).append(job)
            else:
                self._at(job.req.arrival_s, self._arrive, job)
        known = {j.req.request_id for j in self.jobs}
        for prev in [p for p in self.children if p not in known]:
            for job in self.children.pop(prev):  # its previous turn is not in this workload: on its own time
                self._at(job.req.arrival_s, self._arrive, job)
        while self._events:
            t, _, fn, args = heapq.heappop(self._events)
            self.now = t
            fn(*args)
            if self._dirty and self.waiting:
                self._dirty = False
                self._dispatch()
        if self.waiting or any(e.running or e.pending or e.queue for e in self.pes + self.des):
            raise RuntimeError(f"cluster simulation ended with {len(self.waiting)} requests waiting")  # a bug
        metrics = self._metrics()
        metrics["sim_wall_s"] = time.perf_counter() - started
        return metrics

    def _arrive(self, job: Job) -> None:
        job.release = self.now
        if job.kv > self.des[0].kv_cap or job.prompt * self.kvb > self.cfg.dram_gb * 1e9:
            self.rejected.append(job)  # never fits a decode engine or a buffer: refused up front
            self._release_next(job)
            return
        self.waiting.append(job)
        self._dirty = True

    def _release_next(self, job: Job) -> None:
        for nxt in self.children.pop(job.req.request_id, ()):
            self._at(max(self.now + nxt.req.think_s, nxt.req.arrival_s), self._arrive, nxt)

    # --- placement (papers.md §4.5) ---

    def _dispatch(self) -> None:
        while self.waiting and self._place(self.waiting[0]):
            self.waiting.popleft()

    def _read_q(self, node: Node) -> float:
        return node.snic.queued_bytes(self.now)

    def _pick_pe(self) -> Engine | None:
        if self.cfg.placement == "round-robin":
            return self.pes[self._rr[0] % len(self.pes)]
        best, best_key = None, None
        alpha_bytes = self.alpha * self.kvb
        for e in self.pes:
            if e.tok > self.beta:
                continue  # C1: overloaded
            key = (self._read_q(e.node) > alpha_bytes, e.tok, e.idx)  # C2 (False) before C3
            if best_key is None or key < best_key:
                best, best_key = e, key
        return best

    def _pick_de(self, job: Job) -> Engine | None:
        if self.cfg.placement == "round-robin":
            n = len(self.des)
            for i in range(n):
                e = self.des[(self._rr[1] + i) % n]
                if e.kv_cap - e.kv_used >= job.kv:
                    return e
            return None
        node = min(self.de_nodes, key=lambda nd: (nd.tok, nd.idx))
        cands = [e for e in node.engines if e.kv_cap - e.kv_used >= job.kv]
        if not cands:
            return None
        z = 1.05 * (job.prompt + job.output + node.tok) / len(node.engines)
        light = [e for e in cands if e.tok + job.prompt + job.output <= z]
        if light:
            return min(light, key=lambda e: (e.seq, e.tok, e.idx))
        return min(cands, key=lambda e: (e.tok, e.idx))

    def _sides(self, pe: Engine, de: Engine) -> tuple[str, ...]:
        policy = self.cfg.read_policy
        if policy in ("pe-read", "oracle"):
            return (PE,)
        if policy == "de-read":
            return (DE,)
        if self.cfg.placement == "round-robin":
            first = (PE, DE)[self._rr[2] % 2]
        else:
            first = PE if self._read_q(pe.node) <= self._read_q(de.node) else DE
        return (first, DE if first == PE else PE)

    def _place(self, job: Job) -> bool:
        pe = self._pick_pe()
        de = self._pick_de(job) if pe is not None else None
        if de is None:
            return False
        hit_bytes, full = job.hit * self.kvb, (0.0 if self.free_io else job.prompt * self.kvb)
        for side in self._sides(pe, de):
            need_pe = hit_bytes if side == PE and not self.free_io else 0.0
            if de.node.dram_used + full <= de.node.dram_cap and pe.node.dram_used + need_pe <= pe.node.dram_cap:
                break
        else:
            return False
        job.pe, job.de, job.side, job.t_placed = pe, de, side, self.now
        pe.tok += job.prompt
        pe.seq += 1
        de.tok += job.prompt + job.output
        de.node.tok += job.prompt + job.output
        de.seq += 1
        de.kv_used += job.kv
        de.node.dram(full)
        pe.node.dram(need_pe)
        self._rr[0] += 1
        self._rr[1] = self.des.index(de) + 1
        self._rr[2] += 1
        reader = pe.node if side == PE else de.node
        self._at(self._move(self.now, hit_bytes, (reader.snic,), "storage_read"), self._read_done, job)
        return True

    # --- prefill ---

    def _read_done(self, job: Job) -> None:
        job.t_read = self.now
        job.pe.queue.append(job)
        self._pe_start(job.pe)

    def _prefill_time(self, chunks: list[tuple[int, int]]) -> float:
        key = tuple(chunks)
        t = self._step_cache.get(key)
        if t is None:
            t = self.cost.step_time(StepShape.of(chunks))
            if len(self._step_cache) > 100_000:
                self._step_cache.clear()
            self._step_cache[key] = t
        return t

    def _compose(self, pe: Engine) -> list[tuple[Job, int]]:
        """FIFO within the compute quota; the request that overflows it runs the largest chunk that fits."""
        quota = self.cfg.prefill_quota_s
        chunks: list[tuple[int, int]] = []
        plan: list[tuple[Job, int]] = []
        for job in pe.queue:
            rem, cached = job.miss - job.prefilled, job.hit + job.prefilled
            if self._prefill_time([*chunks, (rem, cached)]) <= quota:
                chunks.append((rem, cached))
                plan.append((job, rem))
                continue
            lo, hi = 0, rem - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._prefill_time([*chunks, (mid, cached)]) <= quota:
                    lo = mid
                else:
                    hi = mid - 1
            if not plan:
                lo = max(lo, min(rem, self.cfg.min_chunk))
            if lo > 0:
                plan.append((job, lo))
                chunks.append((lo, cached))
            break
        return plan

    def _pe_start(self, pe: Engine) -> None:
        if pe.busy or not pe.queue:
            return
        plan = self._compose(pe)
        start = self.now
        end = start + self._prefill_time([(q, j.hit + j.prefilled) for j, q in plan])
        for job, q in plan:
            de = job.de
            if job.prefilled == 0 and job.hit:  # layer-wise load of the hit KV into the PE's HBM
                nbytes = job.hit * self.kvb
                if job.side == PE:
                    end = max(end, self._move(start, nbytes, (pe.cnic_rx,), "pe_local_load"))
                else:
                    end = max(end, self._move(start, nbytes, (de.cnic_tx, pe.cnic_rx), "de_to_pe"))
            out = q + (job.hit if job.prefilled == 0 and job.side == PE else 0)
            end = max(end, self._move(start, out * self.kvb, (pe.cnic_tx, de.cnic_rx), "pe_to_de"))
        pe.busy = True
        pe.busy_s += end - start
        self._at(end, self._pe_done, pe, plan)

    def _pe_done(self, pe: Engine, plan: list[tuple[Job, int]]) -> None:
        pe.busy = False
        for job, q in plan:
            job.prefilled += q
            if job.prefilled < job.miss:
                continue
            pe.queue.remove(job)
            job.t_first = self.now
            pe.tok -= job.prompt
            pe.seq -= 1
            if job.side == PE and not self.free_io:
                pe.node.dram(-job.hit * self.kvb)
            self._dirty = True
            # DE buffer -> DE HBM
            self._at(self._move(self.now, job.prompt * self.kvb, (job.de.cnic_rx,), "h2d"), self._join, job)
        self._pe_start(pe)

    # --- decode ---

    def _join(self, job: Job) -> None:
        de = job.de
        if not self.free_io:
            de.node.dram(-job.prompt * self.kvb)
        self._dirty = True
        job.t_join = self.now
        if job.output <= 1:
            self._finish(job)
            return
        de.pending.append(job)
        if de.epoch is None:
            self._de_epoch(de)
        else:
            self._de_truncate(de)

    def _de_epoch(self, de: Engine) -> None:
        """Runs the batch until its next finish (or a join cuts the stretch short, ``_de_truncate``)."""
        de.running.extend(de.pending)
        de.pending.clear()
        if not de.running:
            de.epoch = None
            return
        n = len(de.running)
        k = min(j.output - 1 - j.decoded for j in de.running)
        ctx = sum(j.prompt + 1 + j.decoded for j in de.running) + n * (k - 1) / 2
        dt = self.cost.step_time(StepShape(n, n, n, 0, 0.0, 0, n, int(ctx)))
        de.epoch_id += 1
        de.epoch = (self.now, dt, k, de.epoch_id)
        self._at(self.now + k * dt, self._de_epoch_end, de, de.epoch_id)

    def _de_truncate(self, de: Engine) -> None:
        start, dt, k, _ = de.epoch
        if self.now <= start:  # the stretch starts now: restart it with the newcomer in its first step
            de.epoch_id += 1
            self._de_epoch(de)
            return
        done = max(1, math.ceil((self.now - start) / dt - 1e-9))
        if done >= k:
            return
        de.epoch_id += 1
        de.epoch = (start, dt, done, de.epoch_id)
        self._at(start + done * dt, self._de_epoch_end, de, de.epoch_id)

    def _de_epoch_end(self, de: Engine, epoch_id: int) -> None:
        if de.epoch is None or de.epoch[3] != epoch_id:
            return  # cut short by a join: a later event ends it
        start, dt, k, _ = de.epoch
        de.busy_s += k * dt
        still = []
        for job in de.running:
            if job.decoded == 0:
                job.t_second = start + dt
            job.decoded += k
            if job.decoded >= job.output - 1:
                self._finish(job)
            else:
                still.append(job)
        de.running = still
        de.epoch = None
        self._de_epoch(de)

    def _finish(self, job: Job) -> None:
        job.t_finish = self.now
        de = job.de
        de.tok -= job.prompt + job.output
        de.node.tok -= job.prompt + job.output
        de.seq -= 1
        de.kv_used -= job.kv
        self._dirty = True
        # The new blocks go back to storage (the SNIC's transmit side; reads are not slowed).
        self._move(self.now, (job.miss + job.output) * self.kvb, (de.node.snic_write,), "storage_write")
        self._release_next(job)

    # --- metrics ---

    def _snic_balance(self, end: float) -> tuple[float | None, float | None]:
        """(Max/Avg over all nodes of the bytes each SNIC read in the run, the same per ``window_s`` window
        averaged over windows weighted by their bytes)."""
        totals = [n.snic.bytes for n in self.nodes]
        whole = max(totals) / statistics.mean(totals) if sum(totals) > 0 else None
        w = self.cfg.window_s
        nwin = max(1, math.ceil(end / w))
        per = [[0.0] * len(self.nodes) for _ in range(nwin)]
        for i, node in enumerate(self.nodes):
            for s, e, nbytes in node.snic.log:
                rate = nbytes / max(e - s, 1e-12)
                for k in range(int(s // w), min(nwin, int(e // w) + 1)):
                    overlap = min(e, (k + 1) * w) - max(s, k * w)
                    if overlap > 0:
                        per[k][i] += rate * overlap
        num = den = 0.0
        for row in per:
            tot = sum(row)
            if tot > 0:
                num += tot * max(row) / (tot / len(row))
                den += tot
        return whole, (num / den if den else None)

    def _metrics(self) -> dict:
        done = [j for j in self.jobs if j.t_finish is not None]
        start = min((j.release for j in done), default=0.0)
        end = max((j.t_finish for j in done), default=0.0)
        span = max(end - start, 1e-12)
        ttft = [j.t_first - j.release for j in done]
        ttst = [j.t_second - j.release for j in done if j.t_second is not None]
        tpot = [(j.t_finish - j.t_second) / (j.output - 2) for j in done if j.output > 2]
        e2e = [j.t_finish - j.release for j in done]
        sessions: dict[str, list[Job]] = {}
        for j in done:
            sessions.setdefault(j.req.session_id, []).append(j)
        session_jct = [max(j.t_finish for j in js) - min(j.release for j in js) for js in sessions.values()]
        whole, windowed = self._snic_balance(end)
        prompt = sum(j.prompt for j in done)
        out_tok = sum(j.output for j in done)
        m = {
            "num_requests": len(self.jobs), "num_finished": len(done), "rejected": len(self.rejected),
            "num_sessions": len(sessions),
            "jct_s": end, "makespan_s": span, "session_jct_mean": _mean(session_jct),
            "ttft_mean": _mean(ttft), "ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99),
            "ttst_mean": _mean(ttst), "tpot_mean": _mean(tpot), "tpot_p99": _pct(tpot, 99),
            "e2e_mean": _mean(e2e),
            "read_wait_mean": _mean([j.t_read - j.t_placed for j in done]),
            "queue_wait_mean": _mean([j.t_placed - j.release for j in done]),
            "throughput_req_s": len(done) / span, "throughput_tok_s": out_tok / span,
            "throughput_total_tok_s": (out_tok + prompt) / span,
            "hit_rate": sum(j.hit for j in done) / prompt if prompt else 0.0,
            "de_read_frac": sum(j.side == DE for j in done) / len(done) if done else 0.0,
            "snic_max_avg": windowed, "snic_max_avg_total": whole,
            "snic_util": {n.name: n.snic.busy / span for n in self.nodes},
            "snic_read_bytes": {n.name: n.snic.bytes for n in self.nodes},
            "dram_peak_bytes": {n.name: n.dram_peak for n in self.nodes},
            "prefill_busy_frac": statistics.mean(e.busy_s for e in self.pes) / span,
            "decode_busy_frac": statistics.mean(e.busy_s for e in self.des) / span,
            "bytes": dict(self.bytes),
            "alpha_tokens": self.alpha, "beta_tokens": self.beta,
            "decode_kv_tokens_per_engine": self.des[0].kv_cap, "kv_bytes_per_token": self.kvb,
            **{k: v for k, v in dataclasses.asdict(self.cfg).items() if k != "record_requests"},
        }
        if self.cfg.record_requests:
            m["requests"] = [_record(j) for j in self.jobs]
        return m


def _record(j: Job) -> dict:
    def rel(t):
        return None if t is None else t - j.release

    return {"id": j.req.request_id, "session": j.req.session_id, "turn": j.req.turn, "release": j.release,
            "prompt": j.prompt, "hit": j.hit, "output": j.output, "side": j.side,
            "pe": None if j.pe is None else j.pe.idx, "de": None if j.de is None else j.de.idx,
            "read_done": rel(j.t_read), "ttft": rel(j.t_first), "ttst": rel(j.t_second), "e2e": rel(j.t_finish)}


def _mean(xs) -> float | None:
    return statistics.fmean(xs) if xs else None


def _pct(xs, q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# --- workloads --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterWorkload:
    kind: str = "agentic"  # agentic | mooncake-conv
    agentic: AgenticConfig = AgenticConfig()
    mooncake: MooncakeReplayConfig = MooncakeReplayConfig(limit=1000)
    storage_block_tokens: int = 64  # agentic: granularity of stored KV (DualPath persists 64-token blocks)


def build_workload(wl: ClusterWorkload) -> tuple[list[MultiTurnRequest], list[int], bool]:
    """(requests, hit tokens per request, closed loop). Agentic sessions hit their previous turn's whole
    context (prompt and output, in ``storage_block_tokens`` blocks) and run closed-loop; the Mooncake trace
    hits the blocks earlier records stored (its own 512-token blocks, scaled) on its own timestamps."""
    if wl.kind == "agentic":
        reqs = agentic_sessions(wl.agentic)
        return reqs, structural_hits(reqs, wl.storage_block_tokens, count_outputs=True).per_request, True
    if wl.kind == "mooncake-conv":
        reqs = mooncake_conversation(wl.mooncake)
        return reqs, structural_hits(reqs, wl.mooncake.block_tokens).per_request, False
    raise InvalidArgument(f"unknown cluster workload {wl.kind!r}; known: {', '.join(WORKLOADS)}")


def simulate_cluster(cfg: ClusterConfig, wl: ClusterWorkload) -> dict:
    reqs, hits, closed = build_workload(wl)
    m = ClusterSimulation(cfg, reqs, hits, closed).run()
    m["workload"] = wl.kind
    return m
