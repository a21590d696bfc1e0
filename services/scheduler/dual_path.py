"""DualPath: a request's cached prefix comes from kvcache through the prefill or the decode worker.

At admission the prompt's full-block hashes are looked up in kvcache. When kvcache holds more of the
prefix than the chosen prefill worker's own prefix cache, the prefix is loaded instead of computed:

* **PE-read** (the standard design): kvcache writes the blocks into the prefill worker's pool (that node's
  storage NIC); the prefill worker computes the rest of the prompt; the usual hand-off sends the KV to the
  decode worker.
* **DE-read**: kvcache writes the blocks into the decode worker's pool (the decode node's storage NIC); the
  prefill worker pulls them from there over the compute path, computes the rest; at hand-off the decode worker
  already caches the prefix (``cache_arrival``), so only the newly computed blocks travel back.

The prefill worker and (for a DE-read) the decode worker are placed by token load (``placement.py``);
``dual`` then picks, per request, the side whose node's storage reads queued fewer tokens (DualPath's rule,
papers.md §4.5), and a DE-read request is handed off to the decode worker that read its prefix. Sessions'
finished requests store their full blocks back to kvcache, so the next turn hits; a hybrid's (a model with
linear-attention layers) as far as its worker saved a recurrent state, which is stored with them and loaded
into the prefill worker, where the prompt runs (a DE-read's blocks go through the decode node, its state alone
through the prefill node's). When a decode worker's own prefix cache holds more of the prompt than kvcache does
(a turn without a session), the prefill worker reads it from there instead (peer_prefix.py). Any failure along
the way (kvcache down, a transfer failing, the request aborted) falls back to computing.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict

import anyio

from seawall.v1 import common_pb2
from services.common.block_hash import extend_hashes
from services.scheduler.config import READ_POLICIES
from services.scheduler.core.request import Request
from services.scheduler.kvcache_client import KVCacheClient
from services.scheduler.placement import ReadMeter, StepMeter, pick_read_side, recompute_sooner
from services.scheduler.worker_link import WorkerLink

log = logging.getLogger(__name__)

# A session's next turn waits this long at most for the previous turn's blocks to reach kvcache.
STORE_WAIT_S = 5.0
_DONE = common_pb2.TRANSFER_STATUS_DONE


class DualPath:
    def __init__(self, mesh, client: KVCacheClient, policy: str = "dual") -> None:
        if policy not in READ_POLICIES:
            raise ValueError(f"kv read policy must be one of {', '.join(READ_POLICIES)}, got {policy!r}")
        self.mesh = mesh
        self.client = client
        self.policy, _, recompute = policy.partition("+")
        self.load_or_recompute = recompute == "recompute"
        self.steps: dict[str, StepMeter] = defaultdict(StepMeter)  # each worker's step time vs its tokens
        self.recomputes = 0  # cached prefixes computed instead of loaded (load_or_recompute)
        self.reads: dict[str, ReadMeter] = defaultdict(ReadMeter)  # kvcache loads into each worker (node)
        self.admitting: dict[str, tuple[str, int]] = {}  # request id -> (its prefill worker, its tokens)
        self.loads = {"pe-read": 0, "de-read": 0}
        self._storing: dict[str, anyio.Event] = {}  # session id -> its last turn's store, while in flight
        self._ids = itertools.count()

    # --- admission ---

    async def admit(self, req: Request) -> None:
        """Places ``req``, loading its cached prefix first when kvcache has more of it than the worker."""
        mesh = self.mesh
        tracked = mesh.tracked.get(req.request_id)
        pending = self._storing.get(tracked.session_id) if tracked is not None and tracked.session_id else None
        if pending is not None:
            # The previous turn of this session is still being stored: its blocks are this turn's prefix.
            with anyio.move_on_after(STORE_WAIT_S):
                await pending.wait()
        prefill = mesh.pick_prompt_worker(req)
        if prefill is None:
            mesh.place(req)
            return
        self.admitting[req.request_id] = (prefill.worker_id, req.num_tokens)
        try:
            await self._admit_to(req, prefill)
        finally:
            del self.admitting[req.request_id]

    async def _admit_to(self, req: Request, prefill: WorkerLink) -> None:
        mesh = self.mesh
        bs = prefill.core.blocks.block_size
        hashes = extend_hashes(req.block_hashes, req.prompt_token_ids, bs, prefill.core.seed_of(req))
        hashes = hashes[: (len(req.prompt_token_ids) - 1) // bs]  # one prompt token must run
        local = prefill.cached_prefix_tokens(req) // bs
        hit, state_hit = (await self.client.lookup(hashes, metadata=mesh.trace_metadata(req))
                          if len(hashes) > local else (0, 0))
        # A hybrid's blocks resume nothing without its state after them: only as far as one is stored.
        recurrent = prefill.core.config.recurrent_state
        if recurrent:
            hit = state_hit
        if not self._live(req) or not prefill.alive:
            if self._live(req):
                mesh.place(req)
            return
        # A decode worker caching more than kvcache holds: its memory is nearer than storage.
        if await mesh.peer.admit(req, prefill, beyond=hit * bs):
            return
        if hit <= local:
            mesh.place_on(prefill, req)
            return
        decode = self._pick_decode(req)
        side = self._side(prefill, decode)
        if self.load_or_recompute and self._recompute_sooner(prefill, decode if side == "de-read" else prefill,
                                                             hit * bs):
            self.recomputes += 1
            mesh.place_on(prefill, req)
            return
        done = False
        if side == "de-read":
            done = await self._de_read(req, hashes[:hit], prefill, decode, with_state=recurrent)
        else:
            done = await self._pe_read(req, hashes[:hit], prefill, with_state=recurrent)
        if not done and self._live(req) and req.request_id not in mesh.where:
            req.reset_for_recompute()
            mesh.place(req)

    def admitting_tokens(self, link: WorkerLink) -> int:
        """Tokens of the requests being admitted to ``link`` that its core does not hold yet (a lookup, or a
        DE-read's load, in flight): without them, requests admitted together would all pick one worker."""
        return sum(n for rid, (wid, n) in self.admitting.items()
                   if wid == link.worker_id and rid not in link.core.requests)

    def _recompute_sooner(self, prefill: WorkerLink, reader: WorkerLink, hit_tokens: int) -> bool:
        now, meter, steps = anyio.current_time(), self.reads[reader.worker_id], self.steps[prefill.worker_id]
        chunk = self.mesh.config.core.chunk_size or hit_tokens
        backlog = sum(r.num_uncomputed for r in prefill.core.requests.values())
        return recompute_sooner(hit_tokens, meter.queue_s(now), meter.rate(now), steps.seconds(backlog, chunk),
                                steps.seconds(hit_tokens, chunk))

    def _side(self, prefill: WorkerLink, decode: WorkerLink | None) -> str:
        if decode is None or self.policy == "pe-read":
            return "pe-read"
        if self.policy == "de-read":
            return "de-read"
        return pick_read_side(self.reads[prefill.worker_id].queued, self.reads[decode.worker_id].queued)

    def _pick_decode(self, req: Request) -> WorkerLink | None:
        if self.mesh.config.mode != "disaggregated":
            return None
        return self.mesh.pick_decode_worker(req, roles=("decode",))

    def _live(self, req: Request) -> bool:
        return req.request_id in self.mesh.tracked

    async def _load(self, req: Request, link: WorkerLink, hashes: list[int], block_ids: list[int],
                    path: str, state_after: int | None = None) -> bool:
        """Loads ``hashes`` into ``block_ids`` of ``link`` (and with ``state_after``, a block hash, the state
        stored after that block, for ``req``); whether it all arrived."""
        tokens = len(hashes) * link.core.blocks.block_size
        meter = self.reads[link.worker_id]
        meter.start(tokens, anyio.current_time())
        reply = None
        state = None if state_after is None else (req.request_id, state_after)
        try:
            reply = await self.client.load(f"{req.request_id}/load{next(self._ids)}", hashes, link.endpoint(),
                                           block_ids, path, metadata=self.mesh.trace_metadata(req), state=state)
        finally:
            meter.finish(tokens, anyio.current_time(), ok=reply is not None and reply.status == _DONE)
        self.loads[path] += 1
        if reply.status != _DONE:
            log.info("kvcache load of %s via %s failed (%s): computing instead", req.request_id, path, reply.error)
        return reply.status == _DONE

    async def _load_state(self, req: Request, link: WorkerLink, after: int) -> bool:
        """The state kvcache stored after block hash ``after``, written into ``link`` for ``req`` (a load of no
        blocks: not counted as a read of its own); whether it arrived."""
        reply = await self.client.load(f"{req.request_id}/state{next(self._ids)}", [], link.endpoint(), [],
                                       "pe-read", metadata=self.mesh.trace_metadata(req),
                                       state=(req.request_id, after))
        if reply.status != _DONE:
            log.info("kvcache load of the state of %s failed (%s): computing instead", req.request_id, reply.error)
        return reply.status == _DONE

    async def _pe_read(self, req: Request, hashes: list[int], prefill: WorkerLink, with_state: bool = False) -> bool:
        """``with_state``: a hybrid's, whose state stored after the last of ``hashes`` comes too, even when
        ``prefill`` caches every block."""
        bs = prefill.core.blocks.block_size
        req.num_computed_tokens = len(hashes) * bs
        ids = prefill.core.reserve_arrival(req)
        if ids is None:
            return False
        self.mesh.where[req.request_id] = prefill
        k = req.num_cached_blocks
        ok = True
        if k < len(hashes) or with_state:
            # Their previous owners are done with the blocks on the worker before the load writes them.
            await prefill.plans_done(prefill.core.reuse_fence(ids[k:len(hashes)]))
            ok = await self._load(req, prefill, hashes[k:], ids[k:len(hashes)], "pe-read",
                                  hashes[-1] if with_state else None)
        self.mesh.peer.settle(req, prefill, ok, len(hashes) * bs)
        return True

    async def _de_read(self, req: Request, hashes: list[int], prefill: WorkerLink, decode: WorkerLink,
                       with_state: bool = False) -> bool:
        """``with_state``: a hybrid's, whose state stored after the last of ``hashes`` goes to ``prefill``, where
        the prompt runs (the blocks through the decode node, the state alone through the prefill node's)."""
        bs = decode.core.blocks.block_size
        n = len(hashes) * bs
        stage = Request(f"{req.request_id}#kv", req.prompt_token_ids[:n], req.params, req.arrival_time,
                        num_computed_tokens=n, block_hashes=list(hashes), lora=req.lora, lora_from=req.lora_from)
        staged = decode.core.reserve_arrival(stage)
        if staged is None:
            return await self._pe_read(req, hashes, prefill, with_state)
        loaded = False
        try:
            kd = stage.num_cached_blocks
            if kd < len(hashes):
                await decode.plans_done(decode.core.reuse_fence(staged[kd:]))
                if not await self._load(req, decode, hashes[kd:], staged[kd:], "de-read"):
                    return False
            loaded = True
            if not self._live(req) or not prefill.alive or not decode.alive:
                return False
            then = (lambda: self._load_state(req, prefill, hashes[-1])) if with_state else None
            return await self.mesh.peer.read_into(req, prefill, decode, staged, n, then=then) is not None
        finally:
            # The decode worker keeps a loaded prefix as cache: at hand-off only the computed rest travels back.
            if decode.alive and stage.request_id in decode.core.arriving:
                if loaded:
                    decode.core.cache_arrival(stage.request_id)
                else:
                    decode.core.finish(stage.request_id)
                    decode.core.release_landing(stage)  # its load ended: nothing writes into its blocks
                # An idle decode worker sleeps until woken: a hand-off waiting for these blocks must run now.
                decode.wake()

    # --- storing finished requests ---

    async def store(self, link: WorkerLink, req: Request, session_id: str, metadata=()) -> None:
        """Stores the finished request's full blocks (held by its core), then frees them. ``metadata``
        carries the request's trace context (the request itself has left the mesh by now)."""
        rid = req.request_id
        done = self._storing[session_id] = anyio.Event()
        pinned = None
        try:
            held = link.core.handed_off.get(rid, [])
            bs = link.core.blocks.block_size
            # A decode of its last token may still be running (planned ahead): its block is left out. Only
            # blocks of kept tokens count: a stop string may have cut outputs whose KV a multi-step computed.
            hashes = extend_hashes(req.block_hashes, req.token_ids, bs, link.core.seed_of(req))
            full = min((req.num_computed_tokens - req.num_pending) // bs, len(held), len(hashes))
            if req.num_dropped_blocks:  # a sliding window's: no whole prefix to store
                full = 0
            state = None
            if link.core.config.recurrent_state:
                # A hybrid's blocks go with the state its worker saved after the last of them, or not at all.
                full = link.core.checkpoints.covered(hashes[:full])
                if full:
                    pinned = hashes[full - 1]
                    state = (link.core.checkpoints.lend(pinned), full * bs)
                    if link.in_flight:  # the plan saving it may not have run yet
                        await link.plans_done(link.in_flight[-1])
            hashes = hashes[:full]
            if full and link.alive:
                await self.client.store(f"{rid}/store{next(self._ids)}", link.endpoint(), held[:full], hashes,
                                        metadata=metadata, state=state)
        finally:
            if link.alive and pinned is not None:
                link.core.checkpoints.unpin(pinned)
            if link.alive and rid in link.core.handed_off:
                link.core.release_handed_off(rid)
                link.wake()
            done.set()
            if self._storing.get(session_id) is done:
                del self._storing[session_id]
