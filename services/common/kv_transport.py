"""Moving KV blocks between processes with NIXL: one agent per pool, each transfer an explicit state machine.

The control plane (gRPC) exchanges what a peer needs — ``NixlAgentMetadata`` (agent name, the opaque blob of
``get_agent_metadata()``, the registered regions) and the ``KVLayout`` — and NIXL moves the bytes (STYLE §6)::

    agent = NixlKVAgent("decode-0", pool)             # registers pool.device_kv (DRAM on CPU, VRAM on CUDA)
    peer.add_peer(agent.metadata(), agent.kv_layout())  # on the other side, once per peer
    outcome = await peer.write("t1", "decode-0", src_block_ids=[3, 4], dst_block_ids=[10, 11], timeout_s=5)
    outcome = await peer.read("t2", "decode-0", remote_block_ids=[10], local_block_ids=[7], timeout_s=5)

A block of a ``PagedKVPool`` is one contiguous region (block-major layout), so block ``b`` of a peer lives at
``regions[0].addr + b * bytes_per_block``; adjacent block ids on both sides are coalesced into one descriptor.

Errors have two shapes. A request that cannot be right — block ids out of range, unequal lengths, a peer that
was never added, a transfer id already in flight — raises ``InvalidArgument`` before anything moves: the
caller must fix it, retrying cannot help (a worker servicer answers INVALID_ARGUMENT). Anything that happens
once the transfer started — NIXL refusing the request, an error state, the deadline, an abort — ends the
transfer with a ``TransferOutcome`` whose status says how; ``write``/``read`` never raise for those. They
return at their deadline, or up to ``_DRAIN_GRACE_S`` after it while a post still copies: a transfer that did
not end DONE reports once its NIXL requests are released, so no byte of it lands after the caller learns it
failed and hands the destination blocks to someone else (when NIXL cannot release it in time, the error says
that bytes may still land).

Threads: every call on a NIXL agent runs under that agent's lock (agents are created without NIXL's own
locking). ``postXferReq`` runs in a worker thread when the transfer is large, because UCX between processes
on one host (CMA) and inside one process copies the bytes inside the post call itself: measured 50–80 ms for
256 MiB between two processes here, which would stall the event loop. The transfer coroutines never block on
a lock (they poll it; a busy lock reads as "still in progress"); the rare control calls (``metadata``,
``add_peer``, ``notifications``, ``close``) do wait for it, at most one post's duration.

Post lanes: a host (DRAM) pool posts its transfers through ``post_lanes`` (2) extra agents of its own, with no
progress thread, and a transfer of 4 MiB or more is split into one part per lane, posted at once from as many
threads, so the CMA copy runs on two cores. The main agent (the one peers know; its progress thread serves
them) posts nothing then: its progress thread spins on the UCX worker lock for as long as a post on the same
agent copies, taking the second core from the copy. On this 2-core host that took 256 MiB between two
processes from 7.1–7.7 to 8.5–10.4 GB/s (torch ``copy_`` 14–17 GB/s). A notification goes from the main
agent once every part landed. GPU pools keep posting on the main agent: their UCX transfers are asynchronous
and complete through its progress thread.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np
import torch

from seawall.v1 import common_pb2
from services.common.errors import InvalidArgument, Unavailable

if TYPE_CHECKING:
    from services.common.shaper import TokenBucket
    from services.engine.kv_pool import KVLayout, PagedKVPool


class TransferState(enum.Enum):
    """Where one transfer is. PENDING → POSTED → one of the four terminal states; nothing leaves those."""

    PENDING = "pending"  # accepted and validated, not yet handed to NIXL
    POSTED = "posted"  # handed to NIXL (postXferReq called); bytes may be moving
    DONE = "done"  # every byte landed (and the notification, if any, was sent)
    FAILED = "failed"  # NIXL refused the request or reported an error; ``error`` says which
    TIMED_OUT = "timed_out"  # the deadline passed first; destination blocks hold undefined bytes
    ABORTED = "aborted"  # ``abort()`` was called first; destination blocks hold undefined bytes

    @property
    def terminal(self) -> bool:
        return self not in (TransferState.PENDING, TransferState.POSTED)


_NEXT_STATES = {
    TransferState.PENDING: {TransferState.POSTED, TransferState.FAILED, TransferState.TIMED_OUT,
                            TransferState.ABORTED, TransferState.DONE},  # DONE: an empty transfer
    TransferState.POSTED: {TransferState.DONE, TransferState.FAILED, TransferState.TIMED_OUT,
                           TransferState.ABORTED},
}

_PROTO_STATUS = {
    TransferState.DONE: common_pb2.TRANSFER_STATUS_DONE,
    TransferState.FAILED: common_pb2.TRANSFER_STATUS_FAILED,
    TransferState.TIMED_OUT: common_pb2.TRANSFER_STATUS_TIMED_OUT,
    TransferState.ABORTED: common_pb2.TRANSFER_STATUS_ABORTED,
}


def transfer_status_proto(state: TransferState) -> int:
    """The ``common_pb2.TransferStatus`` of a terminal state (the proto has no in-flight states)."""
    if state not in _PROTO_STATUS:
        raise ValueError(f"{state.name} is not a terminal transfer state; only ended transfers are reported")
    return _PROTO_STATUS[state]


@dataclass(frozen=True)
class TransferOutcome:
    """How one transfer ended: ``bytes`` moved (0 unless DONE), wall ``seconds`` from the call, ``error``."""

    transfer_id: str
    status: TransferState
    bytes: int
    seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is TransferState.DONE

    def response_fields(self) -> dict[str, Any]:
        """Keyword arguments for ``worker_pb2.PushKVResponse`` / ``PullKVResponse``."""
        return {"status": transfer_status_proto(self.status), "bytes": self.bytes,
                "duration_ms": self.seconds * 1e3, "error": self.error}


_DTYPES = {
    torch.float32: common_pb2.KV_DTYPE_FLOAT32,
    torch.float16: common_pb2.KV_DTYPE_FLOAT16,
    torch.bfloat16: common_pb2.KV_DTYPE_BFLOAT16,
    torch.float8_e4m3fn: common_pb2.KV_DTYPE_FP8_E4M3,
    torch.float8_e5m2: common_pb2.KV_DTYPE_FP8_E5M2,
}


def kv_dtype_proto(dtype: torch.dtype) -> int:
    """``common_pb2.KVDtype`` of a torch dtype."""
    if dtype not in _DTYPES:
        raise InvalidArgument(f"KV dtype {dtype} has no KVDtype; use one of {sorted(str(d) for d in _DTYPES)}")
    return _DTYPES[dtype]


def meeting_metadata(endpoint: common_pb2.KVEndpoint) -> common_pb2.NixlAgentMetadata:
    """The NIXL metadata of a peer to ``meet`` (MeetPeers); ``InvalidArgument`` when the endpoint has none."""
    if not (endpoint.HasField("agent_metadata") and endpoint.agent_metadata.agent_name):
        raise InvalidArgument("every peer to meet needs its agent_metadata (WorkerInfo.nixl) and kv_layout; a peer "
                              "without NIXL is reached over gRPC, with nothing to meet")
    return endpoint.agent_metadata


def kv_layout_proto(layout: KVLayout) -> common_pb2.KVLayout:
    """The ``KVLayout`` message of a block-major pool: one region per block, ``bytes_per_block`` long."""
    return common_pb2.KVLayout(
        block_size=layout.block_size, num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim, dtype=kv_dtype_proto(layout.dtype), bytes_per_block=layout.bytes_per_block,
        regions_per_block=1, region_block_bytes=layout.bytes_per_block, kv_parts=layout.num_parts,
    )


_MEM_TYPES = {"DRAM": common_pb2.MEMORY_TYPE_DRAM, "VRAM": common_pb2.MEMORY_TYPE_VRAM}
_MEM_NAMES = {v: k for k, v in _MEM_TYPES.items()}
# Layout fields two pools must agree on for their bytes to mean the same thing.
_LAYOUT_FIELDS = ("block_size", "bytes_per_block", "num_layers", "num_kv_heads", "head_dim", "dtype",
                  "regions_per_block", "region_block_bytes", "kv_parts")

# Transfers at least this large are posted from a worker thread (see the module docstring); smaller ones
# inline, where a thread hop (~0.1 ms) would cost more than the copy.
_THREAD_POST_BYTES = 1 << 20
# Transfers at least this large are split across the post lanes, one part per lane, posted at once from as
# many worker threads.
_SPLIT_BYTES = 4 << 20
# meet() reads this many bytes from each peer: enough for UCX to open a lane's connection, too few to cost.
_MEET_BYTES = 64
# How long a transfer that ended short of DONE (deadline, abort, error) waits for its NIXL requests to be
# released before it reports: a post thread copies 256 MiB in ~80 ms here, a GPU request cancels in far less.
_DRAIN_GRACE_S = 2.0
# Polling backoff. NIXL's Python API has no completion fd or callback to await (a transfer's end is only
# visible through check_xfer_state, and notifications only reach the *other* agent), so the initiator
# polls. A few plain yields first catch transfers that end within microseconds; then sleeps that double
# from 50 µs to 2 ms bound both the latency added to a transfer (≤ one sleep) and the CPU spent on polls.
# asyncio's epoll loop rounds timers up to 1 ms, so on asyncio the sleeps are effectively 1–2 ms.
_YIELD_POLLS = 8
_FIRST_SLEEP_S = 50e-6
_MAX_SLEEP_S = 2e-3


@dataclass
class _Peer:
    name: str
    metadata: bytes
    base_addr: int
    num_blocks: int
    device_id: int
    mem_type: str


@dataclass(eq=False)
class _Lane:
    """A NIXL agent that posts transfers, and the lock every call on it runs under."""

    agent: Any
    reg: Any = None  # the pool's registration with this agent
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(eq=False)
class _Post:
    """One NIXL request of a transfer (its share of the descriptors) on one lane."""

    lane: _Lane
    handle: Any
    abandoned: bool = False  # set under the lane's lock once the transfer ended: a post not yet begun never is
    released: bool = False  # the handle was released


@dataclass(eq=False)
class _Transfer:
    transfer_id: str
    nbytes: int
    state: TransferState = TransferState.PENDING
    error: str = ""
    scope: anyio.CancelScope | None = None
    posts: list[_Post] = field(default_factory=list)  # NIXL requests created so far

    def to(self, state: TransferState, error: str = "") -> None:
        assert state in _NEXT_STATES.get(self.state, ()), f"{self.transfer_id}: {self.state} -> {state}"
        self.state, self.error = state, error


class NixlKVAgent:
    """A NIXL agent over one pool's device blocks: describes itself to peers, writes and reads blocks.

    All methods are called from one event loop thread (the service's); ``write``/``read`` may run
    concurrently with each other there.
    """

    def __init__(self, name: str, pool: PagedKVPool, backends: Sequence[str] = ("UCX",),
                 coalesce: bool = True, post_lanes: int = 2) -> None:
        from nixl_cu12 import _api as nixl  # imported here: the gRPC fallback must work without NIXL

        self.name = name
        self.pool = pool
        self.coalesce = coalesce
        self._bytes_per_block = pool.layout.bytes_per_block
        if not self._bytes_per_block:
            raise InvalidArgument("an attention-free model's KV pool holds no bytes: there is nothing to register "
                                  "or move over NIXL")
        region = pool.memory_regions()[0]  # the device pool; the host (swap) pool is never transferred
        assert region.nbytes == pool.num_blocks * self._bytes_per_block, "device pool is not block-contiguous"
        self._region = region
        # Where meet()'s small reads land: registered with the pool, on the pool's device (a connection to a
        # GPU peer is opened for the memory kinds real transfers use).
        self._scratch = torch.empty(_MEET_BYTES, dtype=torch.uint8, device=pool.device_kv.device)
        # The main agent is the one peers know: its metadata, its progress thread, its notifications.
        self._main = _Lane(_new_agent(nixl, name, list(backends)))
        # Host pools post through lanes of their own (see the module docstring); a GPU pool's transfers are
        # asynchronous in UCX and need the main agent's progress thread, so it posts there.
        extra = post_lanes if region.mem_type == "DRAM" else 0
        self._extra = [_Lane(nixl.nixl_agent(f"{name}.post{i}", nixl.nixl_agent_config(
            enable_prog_thread=False, backends=list(backends)))) for i in range(extra)]
        for lane in self._all_lanes:
            lane.reg = lane.agent.register_memory([(region.addr, region.nbytes, region.device_id, ""),
                                                   (self._scratch.data_ptr(), _MEET_BYTES, region.device_id, "")],
                                                  region.mem_type)
        self._lanes = self._extra or [self._main]  # where transfers are posted
        self._next_lane = 0
        self._peers: dict[str, _Peer] = {}
        self._met: set[str] = set()  # peers every lane has a connection to (meet)
        self._transfers: dict[str, _Transfer] = {}
        self._unreleased: list[_Post] = []  # requests of ended transfers not released yet
        self._notifs: dict[str, list[bytes]] = {}
        self._closed = False

    # ---- describing this agent and meeting peers -------------------------------------------------------

    def metadata(self) -> common_pb2.NixlAgentMetadata:
        """What a peer passes to ``add_peer``: name, NIXL metadata blob, the registered device region."""
        with self._main.lock:
            blob = self._main.agent.get_agent_metadata()
        r = self._region
        return common_pb2.NixlAgentMetadata(
            agent_name=self.name, agent_metadata=blob,
            regions=[common_pb2.MemoryRegion(addr=r.addr, length=r.nbytes, device_id=r.device_id,
                                             mem_type=_MEM_TYPES[r.mem_type])],
        )

    def kv_layout(self) -> common_pb2.KVLayout:
        return kv_layout_proto(self.pool.layout)

    def add_peer(self, meta: common_pb2.NixlAgentMetadata, layout: common_pb2.KVLayout) -> None:
        """Makes a peer addressable by ``meta.agent_name``. Calling it again with the same metadata does
        nothing; new metadata under a known name (the peer restarted) replaces the old."""
        self._check_open()
        name = meta.agent_name
        if not name or not meta.agent_metadata:
            raise InvalidArgument("NixlAgentMetadata needs agent_name and agent_metadata (from get_agent_metadata)")
        mine = self.kv_layout()
        differ = [f"{f} {getattr(layout, f)} (here {getattr(mine, f)})"
                  for f in _LAYOUT_FIELDS if getattr(layout, f) != getattr(mine, f)]
        if differ:
            raise InvalidArgument(
                f"peer {name!r} has a different KV layout: {', '.join(differ)}; KV moves only between pools "
                "of the same model, block size and dtype — start both sides with the same configuration"
            )
        if len(meta.regions) != 1 or meta.regions[0].mem_type not in _MEM_NAMES:
            raise InvalidArgument(
                f"peer {name!r} must describe exactly one DRAM or VRAM region holding its blocks "
                f"(KVLayout.regions_per_block = 1), got {len(meta.regions)} region(s)"
            )
        region = meta.regions[0]
        known = self._peers.get(name)
        if known is not None and known.metadata == meta.agent_metadata:
            return
        if known is not None:
            self._forget(name)
        done: list[_Lane] = []
        for lane in self._all_lanes:
            try:
                with lane.lock:
                    loaded = lane.agent.add_remote_agent(meta.agent_metadata)
            except Exception as e:  # UCX could not reach the peer (its process is gone, say)
                self._forget(name, done)
                raise Unavailable(f"NIXL could not load peer {name!r}'s metadata: {e!r}") from None
            done.append(lane)
            loaded = loaded.decode() if isinstance(loaded, bytes) else loaded
            if loaded != name:  # found on the main agent, before the other lanes load it
                if loaded not in self._peers:
                    self._forget(loaded, done)
                raise InvalidArgument(f"agent_metadata belongs to agent {loaded!r}, not to agent_name {name!r}")
        self._peers[name] = _Peer(name, meta.agent_metadata, region.addr,
                                  region.length // layout.region_block_bytes, region.device_id,
                                  _MEM_NAMES[region.mem_type])

    def _forget(self, name: str, lanes: list[_Lane] | None = None) -> None:
        """Unloads peer ``name`` from ``lanes`` (default: all)."""
        self._peers.pop(name, None)
        self._met.discard(name)
        for lane in self._all_lanes if lanes is None else lanes:
            with lane.lock:
                lane.agent.remove_remote_agent(name)

    @property
    def met(self) -> list[str]:
        """Names of the peers whose connections ``meet`` opened (metadata unchanged since)."""
        return sorted(self._met)

    async def meet(self, meta: common_pb2.NixlAgentMetadata, layout: common_pb2.KVLayout,
                   timeout_s: float = 10.0) -> bool:
        """``add_peer``, then a read of a few bytes of the peer's pool on every lane, so that the connections
        are open before the first transfer needs them. UCX opens a lane's connection to a peer on its first
        request (5-20 ms here, each lane), which would otherwise fall into a hand-off's or a migration's
        pause. Returns False when the peer was met already (same metadata); raises ``Unavailable`` when a
        read failed or outlasted ``timeout_s`` (the first transfer meets the peer then, as without this)."""
        self.add_peer(meta, layout)
        name = meta.agent_name
        if name in self._met:
            return False
        peer = self._peers[name]
        with anyio.move_on_after(timeout_s):
            states = [await self._meet_lane(lane, peer) for lane in self._all_lanes]
            if all(state == "DONE" for state in states):
                self._met.add(name)
                return True
            raise Unavailable(f"NIXL could not read from peer {name!r} to open a connection to it: {states}")
        raise Unavailable(f"opening the NIXL connections to peer {name!r} took over {timeout_s:g} s")

    async def _meet_lane(self, lane: _Lane, peer: _Peer) -> str:
        """One read of ``_MEET_BYTES`` from the start of the peer's pool into the scratch area, on ``lane``;
        its final state (NIXL's, "ERR (...)" when NIXL refused it)."""
        r = self._region
        async with self._locked(lane):
            try:
                local = lane.agent.get_xfer_descs(
                    np.array([[self._scratch.data_ptr(), _MEET_BYTES, r.device_id]], dtype=np.uint64), r.mem_type)
                remote = lane.agent.get_xfer_descs(
                    np.array([[peer.base_addr, _MEET_BYTES, peer.device_id]], dtype=np.uint64), peer.mem_type)
                post = _Post(lane, lane.agent.initialize_xfer("READ", local, remote, peer.name, b""))
            except Exception as e:
                return f"ERR ({e!r})"
            state = self._post_locked(post)
        try:
            polls = 0
            while state == "PROC":
                await _backoff(polls)
                polls += 1
                state = self._poll(post)
        finally:  # also when the deadline cancelled the wait: released now, or later by _release_ended
            self._unreleased.append(post)
            self._release_ended()
        return state

    # ---- transfers --------------------------------------------------------------------------------------

    async def write(self, transfer_id: str, peer_name: str, src_block_ids: Sequence[int],
                    dst_block_ids: Sequence[int], timeout_s: float, notification: bytes = b"",
                    bucket: TokenBucket | None = None) -> TransferOutcome:
        """NIXL WRITE of local blocks ``src_block_ids`` into the peer's ``dst_block_ids``. ``notification``
        (if not empty) reaches the peer once every byte landed. ``bucket`` (a bandwidth shaper's, see
        ``services.common.shaper``) must grant the transfer's bytes before it is posted; the wait counts
        against the deadline."""
        return await self._transfer("WRITE", transfer_id, peer_name, src_block_ids, dst_block_ids,
                                    timeout_s, notification, bucket)

    async def read(self, transfer_id: str, peer_name: str, remote_block_ids: Sequence[int],
                   local_block_ids: Sequence[int], timeout_s: float, notification: bytes = b"",
                   bucket: TokenBucket | None = None) -> TransferOutcome:
        """NIXL READ of the peer's ``remote_block_ids`` into local ``local_block_ids``. ``notification`` (if
        not empty) reaches the peer once the read finished, so it may reuse its blocks. ``bucket``: as for
        ``write``."""
        return await self._transfer("READ", transfer_id, peer_name, local_block_ids, remote_block_ids,
                                    timeout_s, notification, bucket)

    def abort(self, transfer_id: str) -> bool:
        """Ends an in-flight transfer as ABORTED. False if no transfer of that id is in flight."""
        xfer = self._transfers.get(transfer_id)
        if xfer is None or xfer.state.terminal:
            return False
        xfer.to(TransferState.ABORTED, "aborted by request; the destination blocks hold undefined bytes")
        if xfer.scope is not None:
            xfer.scope.cancel()
        return True

    def state(self, transfer_id: str) -> TransferState | None:
        """State of an in-flight transfer; None once it ended (its outcome was returned) or if unknown."""
        xfer = self._transfers.get(transfer_id)
        return xfer.state if xfer is not None else None

    # ---- notifications (the target side of a transfer) ----------------------------------------------------

    def notifications(self) -> dict[str, list[bytes]]:
        """Every notification received and not yet taken, by sender agent name; takes them."""
        self._collect_notifs()
        taken, self._notifs = self._notifs, {}
        return taken

    async def wait_notification(self, peer_name: str, notification: bytes, timeout_s: float) -> bool:
        """Waits until ``peer_name`` sent ``notification`` (takes it); False if the deadline passed first."""
        with anyio.move_on_after(timeout_s):
            polls = 0
            while True:
                self._collect_notifs(blocking=False)
                msgs = self._notifs.get(peer_name, [])
                if notification in msgs:
                    msgs.remove(notification)
                    return True
                await _backoff(polls)
                polls += 1
        return False

    def _collect_notifs(self, blocking: bool = True) -> None:
        if not self._main.lock.acquire(blocking=blocking):  # a worker thread is posting: look again later
            return
        try:
            new = self._main.agent.get_new_notifs()
        finally:
            self._main.lock.release()
        for sender, msgs in new.items():
            self._notifs.setdefault(sender, []).extend(msgs)

    # ---- lifecycle -------------------------------------------------------------------------------------

    def close(self, drain_timeout_s: float = 10.0) -> None:
        """Aborts in-flight transfers, releases every NIXL handle, deregisters the pool, forgets peers.

        Waits (up to ``drain_timeout_s``) for posts still running in worker threads: they copy into or out
        of the pool, which must stay registered until they return."""
        if self._closed:
            return
        for tid in list(self._transfers):
            self.abort(tid)
        self._unreleased += [p for x in self._transfers.values() for p in x.posts if not p.released]
        self._release_ended(wait_s=drain_timeout_s)
        for lane in self._all_lanes:
            with lane.lock:
                for name in self._peers:
                    lane.agent.remove_remote_agent(name)
                lane.agent.deregister_memory(lane.reg)
        self._peers.clear()
        self._met.clear()
        self._closed = True

    def __enter__(self) -> NixlKVAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals -------------------------------------------------------------------------------------

    @property
    def _all_lanes(self) -> list[_Lane]:
        return [self._main, *self._extra]

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable(f"NIXL agent {self.name!r} is closed")

    async def _transfer(self, op: str, transfer_id: str, peer_name: str, local_ids: Sequence[int],
                        remote_ids: Sequence[int], timeout_s: float, notification: bytes,
                        bucket: TokenBucket | None = None) -> TransferOutcome:
        start = time.perf_counter()
        self._check_open()
        peer, local, remote = self._validate(transfer_id, peer_name, local_ids, remote_ids)
        self._release_ended()
        xfer = _Transfer(transfer_id, len(local) * self._bytes_per_block)
        self._transfers[transfer_id] = xfer
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + max(timeout_s, 0.0)) as scope:
                xfer.scope = scope
                await anyio.lowlevel.checkpoint()  # a deadline already passed, or an abort, lands here
                if bucket is not None:  # shaped: wait (PENDING) until the bytes may go
                    await bucket.acquire(xfer.nbytes)
                await self._run(xfer, op, peer, local, remote, notification)
            if not xfer.state.terminal:  # the scope was cancelled by its deadline, not by abort()
                xfer.to(TransferState.TIMED_OUT,
                        f"deadline of {timeout_s:g} s passed while {xfer.state.value}; "
                        "the destination blocks hold undefined bytes")
        finally:
            del self._transfers[transfer_id]
            self._unreleased += [p for p in xfer.posts if not p.released and p not in self._unreleased]
            self._release_ended()
        if xfer.state is not TransferState.DONE:
            await self._drain(xfer.posts)
        error = xfer.error
        if xfer.state is not TransferState.DONE and any(not p.released for p in xfer.posts):
            error += (f"; its NIXL request was still not released {_DRAIN_GRACE_S:g} s later (a post call is "
                      "still copying, or NIXL could not cancel it), so bytes may still land until it drains")
        nbytes = xfer.nbytes if xfer.state is TransferState.DONE else 0
        return TransferOutcome(transfer_id, xfer.state, nbytes, time.perf_counter() - start, error)

    async def _drain(self, posts: list[_Post]) -> None:
        """Waits, at most ``_DRAIN_GRACE_S`` and without blocking the loop, until a transfer that ended
        short of DONE has its NIXL requests released: a post thread finished copying, NIXL cancelled the rest.
        Then a failed outcome means no more bytes land, and the caller may hand the blocks to someone else."""
        deadline = anyio.current_time() + _DRAIN_GRACE_S
        polls = 0
        while any(not p.released for p in posts) and anyio.current_time() < deadline:
            await _backoff(polls)
            polls += 1
            self._release_ended()

    def _validate(self, transfer_id: str, peer_name: str, local_ids: Sequence[int],
                  remote_ids: Sequence[int]) -> tuple[_Peer, np.ndarray, np.ndarray]:
        if transfer_id in self._transfers:
            raise InvalidArgument(f"transfer {transfer_id!r} is already in flight; give each transfer its own id")
        peer = self._peers.get(peer_name)
        if peer is None:
            raise InvalidArgument(
                f"unknown NIXL peer {peer_name!r} (known: {sorted(self._peers)}); send its KVEndpoint."
                "agent_metadata and kv_layout the first time, so that add_peer can load it"
            )
        local = np.asarray(local_ids, dtype=np.int64).reshape(-1)
        remote = np.asarray(remote_ids, dtype=np.int64).reshape(-1)
        if len(local) != len(remote):
            raise InvalidArgument(f"{len(local)} local block ids but {len(remote)} remote ones; "
                                  "give one destination block per source block")
        _check_range(local, self.pool.num_blocks, "local")
        _check_range(remote, peer.num_blocks, f"peer {peer_name!r}")
        return peer, local, remote

    async def _run(self, xfer: _Transfer, op: str, peer: _Peer, local: np.ndarray, remote: np.ndarray,
                   notification: bytes) -> None:
        """PENDING → POSTED → DONE | FAILED inside the caller's cancel scope (deadline and abort)."""
        if len(local) == 0:
            await self._notify(xfer, peer, notification)
            return
        parts = len(self._lanes) if xfer.nbytes >= _SPLIT_BYTES else 1
        lanes = [self._lanes[(self._next_lane + i) % len(self._lanes)] for i in range(min(parts, len(local)))]
        self._next_lane = (self._next_lane + len(lanes)) % len(self._lanes)
        # Only the main agent's notifications reach the peer under this agent's name: other lanes send none
        # with their requests, and the main agent sends it once every part landed.
        attached = notification if lanes == [self._main] else b""
        states: list[str] = []
        for lane, local_part, remote_part in zip(lanes, np.array_split(local, len(lanes)),
                                                 np.array_split(remote, len(lanes)), strict=True):
            async with self._locked(lane):
                try:
                    local_descs, remote_descs = self._descriptors(lane, peer, local_part, remote_part)
                    handle = lane.agent.initialize_xfer(op, local_descs, remote_descs, peer.name, attached)
                except Exception as e:  # NIXL refused the request (stale peer metadata, memory not registered...)
                    xfer.to(TransferState.FAILED, f"NIXL could not create the {op}: {e!r}")
                    return
                xfer.posts.append(_Post(lane, handle))
                if xfer.nbytes < _THREAD_POST_BYTES:  # one part, small: post it now, under the lock held
                    xfer.to(TransferState.POSTED)
                    states.append(self._post_locked(xfer.posts[0]))
        if not states:
            xfer.to(TransferState.POSTED)
            states = [""] * len(xfer.posts)

            async def post(i: int) -> None:
                # Abandoned on cancel: the thread may still be copying (it holds the lane's lock meanwhile),
                # or may not have begun (then it never posts); _release_ended sorts the two out under the lock.
                states[i] = await anyio.to_thread.run_sync(self._post, xfer.posts[i], abandon_on_cancel=True)

            async with anyio.create_task_group() as tg:  # the parts copy at once, each on its own core
                for i in range(len(xfer.posts)):
                    tg.start_soon(post, i)
        for i, p in enumerate(xfer.posts):
            polls = 0
            while states[i] == "PROC" and not xfer.state.terminal:
                await _backoff(polls)
                polls += 1
                states[i] = self._poll(p)
        if xfer.state.terminal:  # aborted while a thread's result was already on its way
            return
        failed = [state for state in states if state != "DONE"]
        if failed:
            xfer.to(TransferState.FAILED, f"NIXL reported an error state ({failed[0]}) for the {op} to {peer.name!r}")
        else:
            await self._notify(xfer, peer, notification if not attached else b"")

    async def _notify(self, xfer: _Transfer, peer: _Peer, notification: bytes) -> None:
        """Ends a transfer whose bytes all landed as DONE, after sending ``notification`` (if any)."""
        if notification:
            async with self._locked(self._main):
                try:
                    self._main.agent.send_notif(peer.name, notification)
                except Exception as e:
                    xfer.to(TransferState.FAILED, f"the blocks landed but NIXL could not send the notification: {e!r}")
                    return
        xfer.to(TransferState.DONE)

    def _post(self, post: _Post) -> str:
        """Posts from a worker thread."""
        with post.lane.lock:
            return self._post_locked(post)

    def _post_locked(self, post: _Post) -> str:
        if post.abandoned:  # the transfer ended before this thread got to post it
            return "ABANDONED"
        try:
            return post.lane.agent.transfer(post.handle)
        except Exception as e:
            return f"ERR ({e!r})"

    @asynccontextmanager
    async def _locked(self, lane: _Lane) -> AsyncIterator[None]:
        """Holds a lane's lock without blocking the event loop while a worker thread's post holds it."""
        polls = 0
        while not lane.lock.acquire(blocking=False):
            await _backoff(polls)
            polls += 1
        try:
            yield
        finally:
            lane.lock.release()

    def _poll(self, post: _Post) -> str:
        if not post.lane.lock.acquire(blocking=False):  # another transfer's post holds it: look again later
            return "PROC"
        try:
            return post.lane.agent.check_xfer_state(post.handle)
        except Exception as e:
            return f"ERR ({e!r})"
        finally:
            post.lane.lock.release()

    def _descriptors(self, lane: _Lane, peer: _Peer, local: np.ndarray, remote: np.ndarray) -> tuple[Any, Any]:
        bpb = self._bytes_per_block
        if self.coalesce:
            local_start, remote_start, count = _runs(local, remote)
        else:
            local_start, remote_start, count = local, remote, np.ones_like(local)
        nbytes = count.astype(np.uint64) * np.uint64(bpb)

        def descs(base: int, starts: np.ndarray, device_id: int) -> np.ndarray:
            addrs = np.uint64(base) + starts.astype(np.uint64) * np.uint64(bpb)
            return np.stack([addrs, nbytes, np.full_like(addrs, device_id)], axis=1)

        r = self._region
        return (lane.agent.get_xfer_descs(descs(r.addr, local_start, r.device_id), r.mem_type),
                lane.agent.get_xfer_descs(descs(peer.base_addr, remote_start, peer.device_id), peer.mem_type))

    def _release_ended(self, wait_s: float = 0.0) -> None:
        """Releases the NIXL requests of ended transfers. Holding a lane's lock means no post call is running
        there: a post that began has returned, one that had not begun never will. Releasing a request still
        in progress asks NIXL to cancel it; if NIXL cannot yet, it raises and the request stays for the next
        try. ``wait_s`` = 0 never blocks (a lane's lock is busy while a worker thread posts)."""
        keep = []
        deadline = time.monotonic() + wait_s
        for post in self._unreleased:
            if not post.lane.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                keep.append(post)
                continue
            try:
                post.abandoned = True
                post.lane.agent.release_xfer_handle(post.handle)
                post.released = True
            except Exception:
                keep.append(post)
            finally:
                post.lane.lock.release()
        self._unreleased = keep


# NIXL's progress thread polls UCX with no pause between rounds (the Python wrapper hard-codes pthrDelay=0):
# an idle agent burns a whole core (measured here: 3.4-4.9 CPU-s per 5 s), starving the model on a shared
# host. With a 100 us pause it costs ~2% of a core and adds at most 100 us to a transfer. The thread cannot
# be dropped: UCX between two processes here only completes a transfer while the *target* side progresses.
PROGRESS_DELAY_US = 100
_AGENT_LOCK = threading.Lock()


def _new_agent(nixl, name: str, backends: list[str]):
    """A ``nixl_agent`` whose progress thread pauses ``PROGRESS_DELAY_US`` between rounds.

    The wrapper offers no knob for the pause, so the binding's agent constructor is wrapped for the duration
    of this one call to set it on the config the wrapper built.
    """
    real = nixl.nixlBind.nixlAgent

    def with_delay(agent_name, config):
        config.pthrDelay = PROGRESS_DELAY_US
        return real(agent_name, config)

    with _AGENT_LOCK:
        nixl.nixlBind.nixlAgent = with_delay
        try:
            return nixl.nixl_agent(name, nixl.nixl_agent_config(backends=backends))
        finally:
            nixl.nixlBind.nixlAgent = real


def _runs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maximal runs where both id lists go up by one: (first id in a, first id in b, run length)."""
    breaks = np.flatnonzero((np.diff(a) != 1) | (np.diff(b) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    return a[starts], b[starts], np.diff(np.append(starts, len(a)))


def _check_range(ids: np.ndarray, num_blocks: int, side: str) -> None:
    if len(ids) and (ids.min() < 0 or ids.max() >= num_blocks):
        bad = ids[(ids < 0) | (ids >= num_blocks)][:5].tolist()
        raise InvalidArgument(f"{side} block ids {bad} are outside the pool of {num_blocks} blocks")


async def _backoff(polls: int) -> None:
    if polls < _YIELD_POLLS:
        await anyio.sleep(0)
    else:
        # The exponent is capped: 2 ** n for a long transfer would overflow a float.
        await anyio.sleep(min(_FIRST_SLEEP_S * 2 ** min(polls - _YIELD_POLLS, 16), _MAX_SLEEP_S))
