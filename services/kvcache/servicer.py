"""The KVCache gRPC service: a thin shell over the store (indexes, tiers) and the mover (bytes).

Loads and stores run in rounds, because every byte is staged in the DRAM tier, which may be smaller than a
request: each round holds as many leading blocks in DRAM as fit, moves them in one transfer (transfer id
``<transfer_id>#<round>``) and releases them. A Load's NIXL notification rides on its last round, so the
target sees it only once every byte landed; a load that ends early (NOT_FOUND, a failure) posts none.

A model with linear-attention layers stores, with a turn's blocks, the recurrent state its worker saved after the
last of them: Store reads it from the source's checkpoint slot (Worker.ReadState) after the blocks, and a Load
naming a sequence writes it into the target for that sequence (Worker.WriteState) after the blocks, or alone
(state_store.py keeps them). One hash is one state, so a state stored already is not read again.

Bad requests (lengths, layouts, an unreachable endpoint, block ids outside the worker's pool) end the call with
INVALID_ARGUMENT and move nothing, or nothing more; anything else after bytes started moving ends with a
response whose status says how (FAILED, TIMED_OUT, NOT_FOUND).

Every call is observed (services/kvcache/observability.py): a span ``seawall.kvcache.<method>``, child of the
caller's trace context from the gRPC metadata, and its duration and ending in the metrics.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio
import grpc
from opentelemetry import trace

from seawall.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc
from services.common import tracing as tr
from services.common.errors import InvalidArgument, SeawallError
from services.common.grpc_server import abort_with
from services.common.grpc_state import pull_state, push_state
from services.common.kv_transport import TransferOutcome, transfer_status_proto
from services.common.tracing import Tracing
from services.kvcache import observability as ob
from services.kvcache.config import KVCacheConfig
from services.kvcache.layout import layout_from_proto
from services.kvcache.mover import Mover, Route
from services.kvcache.results import Tier, TierStats
from services.kvcache.state_store import StoredState
from services.kvcache.store import KVStore

log = logging.getLogger(__name__)


@dataclass
class _Queue:
    loads: int = 0
    bytes: int = 0  # still to move


@dataclass
class _Result:
    """What a Load or Store did so far, and how it ended."""

    status: int = common_pb2.TRANSFER_STATUS_DONE
    bytes: int = 0
    blocks: int = 0  # loaded or newly stored
    dram: int = 0
    disk: int = 0
    present: int = 0
    rounds: int = 0
    error: str = ""
    state_bytes: int = 0  # of bytes, a recurrent state's

    def fail(self, outcome: TransferOutcome) -> None:
        self.status, self.error = transfer_status_proto(outcome.status), outcome.error

    def timed_out(self, what: str, timeout_s: float) -> None:
        self.status = common_pb2.TRANSFER_STATUS_TIMED_OUT
        self.error = f"deadline of {timeout_s:g} s passed while {what}"


@dataclass
class _Call:
    """One call being observed: its span and, for the metrics, how it ended (``cancelled`` until it says)."""

    span: trace.Span
    status: str = "cancelled"
    error: str = ""


class KVCacheServicer(kvcache_pb2_grpc.KVCacheServicer):
    def __init__(self, config: KVCacheConfig, store: KVStore, mover: Mover,
                 metrics: ob.KVCacheMetrics | None = None, tracing: Tracing | None = None) -> None:
        self.config = config
        self.store = store
        self.mover = mover
        self.metrics = metrics or ob.KVCacheMetrics()
        self.tracing = tracing or Tracing(trace.NoOpTracer())
        self._queues: dict[str, _Queue] = {}  # loads queued or in flight, by target node (Route.node)
        self._stores_in_flight = 0
        self._path_loads: Counter[int] = Counter()
        self._path_bytes: Counter[int] = Counter()
        self.metrics_server = None  # the Prometheus HTTP server, when main started one

    @contextmanager
    def _observed(self, method: str, span_name: str, context) -> Iterator[_Call]:
        parent = tr.from_grpc_metadata(context.invocation_metadata())
        start = time.perf_counter()
        with self.tracing.tracer.start_as_current_span(span_name, context=parent) as span:
            call = _Call(span)
            try:
                yield call
            finally:
                self.metrics.requests.labels(method, call.status).inc()
                self.metrics.seconds.labels(method).observe(time.perf_counter() - start)
                if span.is_recording():
                    span.set_attribute(tr.KV_STATUS, call.status)
                    if call.status not in ("ok", "done", "not_found"):
                        span.set_status(trace.Status(trace.StatusCode.ERROR, call.error or call.status))

    async def _refuse(self, call: _Call, context, exc: SeawallError) -> None:
        call.status, call.error = exc.grpc_code.lower(), str(exc)
        await abort_with(context, exc)

    async def Lookup(self, request, context):
        with self._observed("lookup", tr.SPAN_KVCACHE_LOOKUP, context) as call:
            r = self.store.lookup(request.block_hashes, request.pin_ms)
            call.status = "ok"
            if call.span.is_recording():
                call.span.set_attributes({
                    tr.KV_REQUESTED_BLOCKS: len(request.block_hashes), tr.KV_BLOCKS: r.num_cached,
                    tr.KV_DRAM_BLOCKS: r.num_dram, tr.KV_DISK_BLOCKS: r.num_disk,
                    tr.KV_TIER: ob.tier_summary(r.num_dram, r.num_disk), tr.KV_PIN_MS: request.pin_ms})
        return kvcache_pb2.LookupResponse(num_cached_blocks=r.num_cached, num_dram_blocks=r.num_dram,
                                          num_disk_blocks=r.num_disk, num_state_blocks=r.num_state)

    # ---- Load ----------------------------------------------------------------------------------------------

    async def Load(self, request, context):
        start = time.perf_counter()
        timeout_s = self._timeout_s(request.timeout_ms)
        deadline = anyio.current_time() + timeout_s
        hashes, dst = list(request.block_hashes), list(request.target_block_ids)
        result = _Result()
        route = None
        with self._observed("load", tr.SPAN_KVCACHE_LOAD, context) as call:
            try:
                if len(hashes) != len(dst):
                    raise InvalidArgument(f"{len(hashes)} block_hashes but {len(dst)} target_block_ids; "
                                          "give one target block per hash")
                layout = layout_from_proto(request.target.kv_layout, "target")
                state = await self._state_to_load(request)
                if self.store.layout is None:  # nothing was ever stored: every hash misses
                    if hashes or request.state_seq_id:
                        result.status, result.error = common_pb2.TRANSFER_STATUS_NOT_FOUND, "the kvcache is empty"
                elif request.state_seq_id and state is None:
                    result.status = common_pb2.TRANSFER_STATUS_NOT_FOUND
                    result.error = f"no recurrent state is stored after block {request.state_block_hash:016x}"
                else:
                    self.store.ensure_layout(layout, "the target")
                    route = self.mover.route(request.target, request.transport, "target")
                    await self._queued_load(request, route, hashes, dst, deadline, timeout_s, result)
                    if state is not None and result.status == common_pb2.TRANSFER_STATUS_DONE:
                        await self._write_state(request, state, deadline, timeout_s, result)
            except SeawallError as exc:
                await self._refuse(call, context, exc)
            self._path_loads[request.path] += 1
            self._path_bytes[request.path] += result.bytes
            log.debug("load %s: status %d, %d of %d blocks (%d dram, %d disk)", request.transfer_id,
                      result.status, result.blocks, len(hashes), result.dram, result.disk)
            response = self._load_response(result, start)
            self._observe_load(call, request, route, response, result.rounds)
        return response

    def _observe_load(self, call: _Call, request, route: Route | None, r: kvcache_pb2.LoadResponse,
                      rounds: int) -> None:
        call.status, call.error = ob.status_name(r.status), r.error
        transport = route.transport if route is not None else "none"
        path = ob.read_path_name(request.path)
        if r.bytes:
            self.metrics.load_bytes.labels(path, transport).inc(r.bytes)
        if call.span.is_recording():
            call.span.set_attributes({
                tr.KV_TRANSFER_ID: request.transfer_id, tr.KV_ENDPOINT: route.node if route is not None else "",
                tr.KV_READ_PATH: path, tr.KV_PATH: transport, tr.KV_REQUESTED_BLOCKS: len(request.block_hashes),
                tr.KV_BLOCKS: r.num_blocks_loaded, tr.KV_DRAM_BLOCKS: r.num_dram_blocks,
                tr.KV_DISK_BLOCKS: r.num_disk_blocks, tr.KV_TIER: ob.tier_summary(r.num_dram_blocks,
                                                                                  r.num_disk_blocks),
                tr.KV_BYTES: r.bytes, tr.KV_GBPS: r.bytes / max(r.duration_ms, 1e-6) / 1e6, tr.KV_ROUNDS: rounds})

    def queues(self) -> dict[str, _Queue]:
        """Loads queued or in flight, by target node (a snapshot)."""
        return {name: _Queue(q.loads, q.bytes) for name, q in self._queues.items()}

    def queue_depth(self) -> int:
        """Loads and stores in flight."""
        return sum(q.loads for q in self._queues.values()) + self._stores_in_flight

    async def _queued_load(self, request, route: Route, hashes, dst, deadline: float, timeout_s: float,
                           result: _Result) -> None:
        name = route.node
        queue = self._queues.setdefault(name, _Queue())
        queue.loads += 1
        queue.bytes += len(hashes) * self.store.layout.bytes_per_block
        try:
            await self._load(request, route, hashes, dst, deadline, timeout_s, queue, result)
        finally:
            queue.loads -= 1
            queue.bytes -= len(hashes) * self.store.layout.bytes_per_block - result.bytes  # what never moved
            if queue.loads == 0:
                del self._queues[name]

    async def _load(self, request, route: Route, hashes, dst, deadline: float, timeout_s: float,
                    queue: _Queue, result: _Result) -> None:
        """Rounds until every cached leading block landed: ``todo`` holds the positions still to load,
        ``limit`` the first position known not to be cached."""
        notification = request.notification_key.encode()
        if not hashes:
            if notification and route.nixl_peer:
                outcome = await self.mover.write(route, request.transfer_id, [], [], timeout_s, notification)
                if not outcome.ok:
                    result.fail(outcome)
            return
        bpb = self.store.layout.bytes_per_block
        todo, limit, tiers = list(range(len(hashes))), len(hashes), {}
        try:
            for rnd in itertools.count():
                staged = None
                with anyio.move_on_after(deadline - anyio.current_time()):
                    staged = await self.store.stage(hashes, todo)
                if staged is None:
                    result.timed_out("waiting for a free DRAM block to stage into", timeout_s)
                    return
                limit = min(limit, staged.limit)
                done = set(staged.positions)
                todo = [i for i in todo if i < limit and i not in done]
                try:
                    if staged.positions:
                        result.rounds += 1
                        outcome = await self.mover.write(
                            route, f"{request.transfer_id}#{rnd}", staged.slots, [dst[i] for i in staged.positions],
                            max(0.0, deadline - anyio.current_time()), b"" if todo else notification)
                finally:
                    self.store.release(staged.slots)
                if staged.positions and not outcome.ok:
                    result.fail(outcome)
                    return
                result.bytes += len(staged.positions) * bpb
                queue.bytes -= len(staged.positions) * bpb
                tiers.update(zip(staged.positions, staged.tiers, strict=True))
                if not todo:
                    break
        finally:
            leading = next((i for i in range(len(hashes)) if i not in tiers), len(hashes))
            result.blocks = leading
            result.dram = sum(tiers[i] is Tier.DRAM for i in range(leading))
            result.disk = leading - result.dram
        if limit < len(hashes):
            result.status = common_pb2.TRANSFER_STATUS_NOT_FOUND
            result.error = (f"block {limit} of {len(hashes)} (hash {hashes[limit]:016x}) is not cached; "
                            "the blocks before it were loaded")

    async def _state_to_load(self, request) -> StoredState | None:
        if not request.state_seq_id:
            return None
        if not request.target.grpc_address:
            raise InvalidArgument("a load with state_seq_id writes the state with Worker.WriteState: give the "
                                  "target's grpc_address")
        return await self.store.states.get(request.state_block_hash)

    async def _write_state(self, request, state: StoredState, deadline: float, timeout_s: float,
                           result: _Result) -> None:
        """After a load's blocks, the recurrent state stored after them, into the target for its sequence."""
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                nbytes = await push_state(request.target.grpc_address, request.state_seq_id, state.num_tokens,
                                          state.layers, deadline - anyio.current_time())
        except TimeoutError:
            result.timed_out("writing the recurrent state", timeout_s)
            return
        except grpc.aio.AioRpcError as exc:
            result.status = common_pb2.TRANSFER_STATUS_FAILED
            result.error = f"writing the recurrent state of {request.state_seq_id}: {exc.code().name}: {exc.details()}"
            return
        result.state_bytes = nbytes
        result.bytes += nbytes

    @staticmethod
    def _load_response(result: _Result, start: float) -> kvcache_pb2.LoadResponse:
        return kvcache_pb2.LoadResponse(
            status=result.status, bytes=result.bytes, num_blocks_loaded=result.blocks,
            num_dram_blocks=result.dram, num_disk_blocks=result.disk,
            duration_ms=(time.perf_counter() - start) * 1e3, error=result.error, state_bytes=result.state_bytes)

    # ---- Store ---------------------------------------------------------------------------------------------

    async def Store(self, request, context):
        start = time.perf_counter()
        timeout_s = self._timeout_s(request.timeout_ms)
        deadline = anyio.current_time() + timeout_s
        hashes, src = list(request.block_hashes), list(request.source_block_ids)
        result = _Result()
        route = None
        with self._observed("store", tr.SPAN_KVCACHE_STORE, context) as call:
            self._stores_in_flight += 1
            try:
                if len(hashes) != len(src):
                    raise InvalidArgument(f"{len(hashes)} block_hashes but {len(src)} source_block_ids; "
                                          "give one hash per source block")
                with_state = request.HasField("state_checkpoint")
                if with_state and (not hashes or not request.state_tokens or not request.source.grpc_address):
                    raise InvalidArgument("a store with state_checkpoint needs the blocks the state follows, "
                                          "their state_tokens (> 0) and the source's grpc_address (the state is "
                                          "read with Worker.ReadState)")
                if hashes:
                    self.store.ensure_layout(layout_from_proto(request.source.kv_layout, "source"), "the source")
                    route = self.mover.route(request.source, request.transport, "source")
                    await self._store(request, route, hashes, src, deadline, timeout_s, result)
                    if with_state and result.status == common_pb2.TRANSFER_STATUS_DONE:
                        await self._read_state(request, hashes[-1], deadline, timeout_s, result)
            except SeawallError as exc:
                await self._refuse(call, context, exc)
            finally:
                self._stores_in_flight -= 1
            log.debug("store %s: status %d, %d new, %d present", request.transfer_id, result.status,
                      result.blocks, result.present)
            response = kvcache_pb2.StoreResponse(
                status=result.status, bytes=result.bytes, num_blocks_stored=result.blocks,
                num_blocks_present=result.present, duration_ms=(time.perf_counter() - start) * 1e3,
                error=result.error, state_bytes=result.state_bytes)
            self._observe_store(call, request, route, response, result.rounds)
        return response

    def _observe_store(self, call: _Call, request, route: Route | None, r: kvcache_pb2.StoreResponse,
                       rounds: int) -> None:
        call.status, call.error = ob.status_name(r.status), r.error
        transport = route.transport if route is not None else "none"
        if r.bytes:
            self.metrics.store_bytes.labels(transport).inc(r.bytes)
        if call.span.is_recording():
            call.span.set_attributes({
                tr.KV_TRANSFER_ID: request.transfer_id, tr.KV_ENDPOINT: route.node if route is not None else "",
                tr.KV_PATH: transport, tr.KV_REQUESTED_BLOCKS: len(request.block_hashes),
                tr.KV_BLOCKS: r.num_blocks_stored, tr.KV_PRESENT_BLOCKS: r.num_blocks_present,
                tr.KV_TIER: "dram" if r.num_blocks_stored else "none", tr.KV_BYTES: r.bytes,
                tr.KV_GBPS: r.bytes / max(r.duration_ms, 1e-6) / 1e6, tr.KV_ROUNDS: rounds})

    async def _store(self, request, route: Route, hashes, src, deadline: float, timeout_s: float,
                     result: _Result) -> None:
        todo: list[tuple[int, int]] = []
        seen: set[int] = set()
        for h, s in zip(hashes, src, strict=True):
            if h in seen or self.store.present(h):
                result.present += 1
            else:
                seen.add(h)
                todo.append((h, s))
        pos = 0
        for rnd in itertools.count():
            if pos == len(todo):
                return
            slots = None
            with anyio.move_on_after(deadline - anyio.current_time()):
                slots = await self.store.take_slots(len(todo) - pos)
            if slots is None:
                result.timed_out("waiting for a free DRAM block to store into", timeout_s)
                return
            batch = todo[pos:pos + len(slots)]
            result.rounds += 1
            try:
                outcome = await self.mover.read(route, f"{request.transfer_id}#{rnd}", [s for _, s in batch],
                                                slots, max(0.0, deadline - anyio.current_time()))
                if outcome.ok:
                    new = self.store.commit([h for h, _ in batch], slots)
                    result.blocks += new
                    result.present += len(batch) - new
                    result.bytes += outcome.bytes
            finally:
                self.store.release(slots)
            if not outcome.ok:
                result.fail(outcome)
                return
            pos += len(slots)

    async def _read_state(self, request, block_hash: int, deadline: float, timeout_s: float,
                          result: _Result) -> None:
        """After a store's blocks, the recurrent state saved after the last of them, from the source's
        checkpoint slot. Not read when it is stored already (one hash, one state) or states have no room."""
        states = self.store.states
        if block_hash in states or not states.enabled:
            states.touch(block_hash)
            return
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                _, layers, nbytes = await pull_state(request.source.grpc_address, "", deadline - anyio.current_time(),
                                                     request.state_checkpoint)
        except TimeoutError:
            result.timed_out("reading the recurrent state", timeout_s)
            return
        except (grpc.aio.AioRpcError, ValueError) as exc:
            detail = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            result.status = common_pb2.TRANSFER_STATUS_FAILED
            result.error = f"reading the recurrent state of checkpoint {request.state_checkpoint}: {detail}"
            return
        if await states.put(block_hash, StoredState(request.state_tokens, layers)):
            result.state_bytes = nbytes
            result.bytes += nbytes
        else:
            log.info("store %s: no room for its %d-byte recurrent state (states hold %d of %d bytes in memory, "
                     "%d of %d on disk, pinned)", request.transfer_id, nbytes, states.used_bytes,
                     states.capacity_bytes, states.disk_used, states.disk_bytes)

    # ---- Stats ---------------------------------------------------------------------------------------------

    async def Stats(self, request, context):
        s = self.store.stats()
        tiers = [_tier_proto(Tier.DRAM, s.dram)] + ([_tier_proto(Tier.DISK, s.disk)] if s.disk is not None else [])
        paths = [kvcache_pb2.PathStats(path=p, num_loads=self._path_loads[p], bytes=self._path_bytes[p])
                 for p in sorted(self._path_loads)]
        queues = [kvcache_pb2.EndpointQueue(agent_name=name, queued_loads=q.loads, queued_bytes=q.bytes)
                  for name, q in sorted(self._queues.items())]
        depth = sum(q.loads for q in self._queues.values()) + self._stores_in_flight
        return kvcache_pb2.KVCacheStatsResponse(hit_blocks=s.hit_blocks, miss_blocks=s.miss_blocks,
                                                num_lookups=s.num_lookups, tiers=tiers, paths=paths,
                                                queues=queues, queue_depth=depth, num_states=len(self.store.states),
                                                state_bytes=self.store.states.used_bytes,
                                                state_capacity_bytes=self.store.states.capacity_bytes,
                                                num_disk_states=self.store.states.num_on_disk,
                                                state_disk_bytes=self.store.states.disk_used,
                                                state_disk_capacity_bytes=self.store.states.disk_bytes,
                                                nixl_peers=self.mover.met)

    async def MeetPeers(self, request, context):
        timeout_s = request.timeout_ms / 1e3 if request.timeout_ms else 10.0
        met = []
        try:
            for peer in request.peers:
                if await self.mover.meet(peer, timeout_s):
                    met.append(peer.agent_metadata.agent_name)
        except SeawallError as exc:
            await abort_with(context, exc)
        return common_pb2.MeetPeersResponse(agent_names=met)

    def _timeout_s(self, timeout_ms: int) -> float:
        return timeout_ms / 1e3 if timeout_ms else self.config.default_timeout_s


def _tier_proto(tier: Tier, t: TierStats) -> kvcache_pb2.TierStats:
    return kvcache_pb2.TierStats(tier=int(tier), capacity_bytes=t.capacity_bytes, used_bytes=t.used_bytes,
                                 num_blocks=t.num_blocks, bytes_read=t.bytes_read, bytes_written=t.bytes_written,
                                 num_evictions=t.num_evictions)
