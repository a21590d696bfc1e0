"""A prompt's cached prefix read peer-to-peer from a decode worker's prefix cache (disaggregated).

In the disaggregated topology a conversation's next turn runs its prompt on a prefill worker, whose prefix
cache holds at most the turn before's prompt: that turn's outputs were decoded, and their KV cached (with, for a
model with linear-attention layers, the state saved after them), on a decode worker. When a decode worker caches
more of a new prompt than the chosen prefill worker (and than kvcache holds), the prefill worker pulls what it
lacks from there over the compute path (``PullKV``; a hybrid's saved state after it, read from its checkpoint
slot), computes the rest, and hands the request off to that decode worker, which then needs only the newly
computed blocks. DualPath's DE-read (dual_path.py) without the storage read: the prefix is in the decode node's
memory already. Without kvcache (or for a turn without a session, which kvcache does not store) this is how a
hybrid's next turn resumes after the turn before's outputs.

The blocks and the checkpoint are held on the decode worker while they are read (a staging entry, as a
DE-read's, and ``StateCheckpoints.lend``). Any failure falls back to computing the prompt on the prefill worker.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import grpc

from seawall.v1 import common_pb2, worker_pb2
from services.common.block_hash import extend_hashes
from services.common.rpc import rpc
from services.scheduler.core.request import Request
from services.scheduler.worker_link import WorkerLink

if TYPE_CHECKING:
    from services.scheduler.mesh import Mesh

log = logging.getLogger(__name__)

_DONE = common_pb2.TRANSFER_STATUS_DONE


class PeerPrefix:
    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.reads = {"done": 0, "failed": 0}  # prefixes read from a decode worker, by outcome
        self.tokens = 0  # prompt tokens those reads spared computing
        self._ids = itertools.count()

    def holder(self, req: Request, prefill: WorkerLink, beyond: int = 0) -> tuple[WorkerLink, int] | None:
        """The decode worker caching the most of ``req``'s prompt and its tokens, when that is more than both
        ``prefill``'s own cache and ``beyond`` tokens (what kvcache holds); else None."""
        config = self.mesh.config
        if config.mode != "disaggregated" or not config.peer_prefix or not prefill.core.config.caches_prefixes:
            return None
        best = max(((link, link.cached_prefix_tokens(req)) for link in self.mesh.serving_links("decode")),
                   key=lambda pair: pair[1], default=None)
        if best is None or best[1] <= max(beyond, prefill.cached_prefix_tokens(req)):
            return None
        return best

    async def admit(self, req: Request, prefill: WorkerLink, beyond: int = 0) -> bool:
        """Places ``req`` on ``prefill`` with the prefix a decode worker caches, when one caches more than
        ``prefill`` and ``beyond`` tokens. True once placed (the prefix read, or failing that computed there);
        False, ``req`` untouched, when no decode worker caches more or there is no room to read it into."""
        found = self.holder(req, prefill, beyond)
        return found is not None and await self._read(req, prefill, *found)

    async def _read(self, req: Request, prefill: WorkerLink, decode: WorkerLink, tokens: int) -> bool:
        core, bs = decode.core, decode.core.blocks.block_size
        hashes = extend_hashes(req.block_hashes, req.prompt_token_ids, bs, core.seed_of(req))[: tokens // bs]
        stage = Request(f"{req.request_id}#peer", req.prompt_token_ids[:tokens], req.params, req.arrival_time,
                        num_computed_tokens=tokens, block_hashes=list(hashes), lora=req.lora,
                        lora_from=req.lora_from)
        staged = core.reserve_arrival(stage)  # every block is cached there: this holds them while they are read
        if staged is None:
            return False
        # A hybrid's: the holder's covered prefix ends in a saved state, lent while it is read.
        pinned = hashes[-1] if core.config.recurrent_state else None
        state = None if pinned is None else (core.checkpoints.lend(pinned), tokens)
        try:
            ok = await self.read_into(req, prefill, decode, staged, tokens, state)
        finally:
            self._unstage(decode, stage, pinned)
        if ok is None:
            return False
        self.reads["done" if ok else "failed"] += 1
        if ok:
            self.tokens += tokens
        else:
            log.info("reading the prefix of %s from %s failed: computing it instead", req.request_id,
                     decode.worker_id)
        return True

    async def read_into(self, req: Request, prefill: WorkerLink, decode: WorkerLink, staged: list[int],
                        tokens: int, state: tuple[int, int] | None = None,
                        then: Callable[[], Awaitable[bool]] | None = None) -> bool | None:
        """Places ``req`` on ``prefill`` with its first ``tokens`` read from ``decode``'s ``staged`` blocks (and
        ``state``, as ``pull`` takes it): the prefill worker pulls the blocks it does not cache itself, and the
        hand-off goes back to ``decode``. ``then``: what else must arrive once the blocks did (a hybrid's state
        from kvcache, for a DE-read), whether it did. Whether it all arrived (else the prompt is computed
        there), or None, nothing held, when ``prefill`` has no room for the blocks now. DualPath's DE-read ends
        this way too."""
        k = tokens // prefill.core.blocks.block_size
        req.num_computed_tokens = tokens
        ids = prefill.core.reserve_arrival(req)
        if ids is None:
            req.num_computed_tokens = 0
            return None
        self.mesh.where[req.request_id] = prefill
        kp = req.num_cached_blocks  # leading blocks the prefill worker caches itself
        ok = True
        if kp < k or state is not None:  # a hybrid's state comes even when every block is here
            await prefill.plans_done(prefill.core.reuse_fence(ids[kp:k]))
            ok = await self.pull(req, prefill, decode, staged[kp:k], ids[kp:k], state)
        if ok and then is not None:
            ok = await then()
        if ok and req.request_id in self.mesh.tracked:
            self.mesh.decode_for[req.request_id] = decode  # the hand-off finds the prefix there
        self.settle(req, prefill, ok, tokens)
        return ok

    @staticmethod
    def _unstage(decode: WorkerLink, stage: Request, pinned: int | None) -> None:
        if not decode.alive or stage.request_id not in decode.core.arriving:
            return  # the worker died: its core was emptied
        if pinned is not None:
            decode.core.checkpoints.unpin(pinned)
        decode.core.cache_arrival(stage.request_id)  # they were cached already: they stay so
        decode.wake()

    async def pull(self, req: Request, dst: WorkerLink, src: WorkerLink, src_blocks: list[int],
                   dst_blocks: list[int], state: tuple[int, int] | None = None) -> bool:
        """``dst`` reads ``src_blocks`` of ``src`` into its ``dst_blocks`` (and with ``state``, (checkpoint slot,
        tokens it took in), the saved recurrent state for ``req``); whether it all arrived."""
        if src.in_flight:
            # A block counts as cached once the plan computing it is sent: that plan must have run first.
            await src.plans_done(src.in_flight[-1])
        config = self.mesh.config
        request = worker_pb2.PullKVRequest(
            transfer_id=f"{req.request_id}/p2p{next(self._ids)}", src=src.endpoint(), src_block_ids=src_blocks,
            dst_block_ids=dst_blocks, timeout_ms=int(config.transfer_timeout_s * 1e3), transport=self.mesh.transport)
        if state is not None:
            request.state_seq_id = req.request_id
            request.state_checkpoint, request.state_checkpoint_tokens = state
        try:
            reply = await rpc(dst.stub.PullKV(request, timeout=config.transfer_timeout_s + 5,
                                              metadata=self.mesh.trace_metadata(req)))
        except grpc.aio.AioRpcError:
            return False
        ok = reply.status == _DONE
        self.mesh.metrics.transfers.bytes.labels(config.kv_transport, "done" if ok else "failed").inc(reply.bytes)
        return ok

    def settle(self, req: Request, prefill: WorkerLink, ok: bool, hit_tokens: int) -> None:
        """The read of ``req``'s prefix into ``prefill`` ended: it runs from there, or computes it all."""
        rid = req.request_id
        if not prefill.alive:
            return  # the worker died: its requests were placed elsewhere
        if prefill.core.arriving.get(rid) is not req:  # aborted meanwhile: the read was the last writer
            prefill.core.release_landing(req)
            prefill.wake()
            return
        if ok:
            req.num_prefix_hit_tokens = hit_tokens
            prefill.core.arrive(rid)
        else:
            prefill.core.cancel_arrival(rid)
        prefill.wake()
