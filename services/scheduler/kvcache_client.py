"""The scheduler's client of the kvcache service: lookups, loads into a worker's blocks, stores from one.

kvcache is an optimisation, never a dependency: every call returns a miss or a failed outcome instead of
raising, and after a failure the client stays quiet (no calls, everything a miss) for ``backoff_s`` before
trying again, so a kvcache that is down costs requests one recompute, not a timeout each.
"""

from __future__ import annotations

import logging

import anyio
import grpc

from seawall.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc
from services.common.grpc_server import CHANNEL_OPTIONS
from services.common.rpc import rpc

log = logging.getLogger(__name__)

PATHS = {"pe-read": kvcache_pb2.KV_READ_PATH_PE_READ, "de-read": kvcache_pb2.KV_READ_PATH_DE_READ}
_RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                      ("grpc.max_reconnect_backoff_ms", 1000)]


class KVCacheClient:
    def __init__(self, address: str, timeout_s: float = 30.0, backoff_s: float = 2.0,
                 transport: int = common_pb2.KV_TRANSPORT_NIXL) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.transport = transport
        # gRPC's reconnect back-off grows to minutes while kvcache is down; capped, a restarted kvcache is
        # used again within a second or two instead.
        self._channel = grpc.aio.insecure_channel(address, options=[*CHANNEL_OPTIONS, *_RECONNECT_OPTIONS])
        self._stub = kvcache_pb2_grpc.KVCacheStub(self._channel)
        self._down_until = 0.0
        self.num_failures = 0

    @property
    def available(self) -> bool:
        return anyio.current_time() >= self._down_until

    def _failed(self, what: str, exc: grpc.aio.AioRpcError) -> None:
        self.num_failures += 1
        self._down_until = anyio.current_time() + self.backoff_s
        log.warning("kvcache %s at %s failed (%s); treating it as a miss for %.0f s", what, self.address,
                    exc.code().name, self.backoff_s)

    async def meet(self, worker: common_pb2.KVEndpoint) -> bool:
        """Has kvcache meet ``worker`` ahead of its first load or store (KVCache.MeetPeers); False, logged, when it
        could not: the first transfer meets it then. Not a failure of kvcache (no back-off)."""
        request = common_pb2.MeetPeersRequest(peers=[worker], timeout_ms=int(self.timeout_s * 1e3))
        try:
            await rpc(self._stub.MeetPeers(request, timeout=self.timeout_s + 5))
        except grpc.aio.AioRpcError as exc:
            log.warning("kvcache at %s could not meet %s ahead of their first transfer (%s: %s); they meet in it",
                        self.address, worker.agent_name, exc.code().name, exc.details())
            return False
        return True

    async def lookup(self, hashes: list[int], pin_ms: int = 10_000, metadata=()) -> tuple[int, int]:
        """Blocks of the longest cached prefix of ``hashes``, and of the longest one a stored recurrent state
        follows (what a hybrid resumes from); (0, 0) when kvcache is unavailable."""
        if not hashes or not self.available:
            return 0, 0
        try:
            reply = await rpc(self._stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=hashes, pin_ms=pin_ms),
                                                timeout=self.timeout_s, metadata=metadata))
        except grpc.aio.AioRpcError as exc:
            self._failed("lookup", exc)
            return 0, 0
        return reply.num_cached_blocks, reply.num_state_blocks

    async def load(self, transfer_id: str, hashes: list[int], target: common_pb2.KVEndpoint,
                   target_block_ids: list[int], path: str, metadata=(),
                   state: tuple[str, int] | None = None) -> kvcache_pb2.LoadResponse:
        """Writes the blocks of ``hashes`` into the target's blocks (and with ``state``, (sequence, block hash),
        the recurrent state stored after that block, for that sequence); the response says how far it got."""
        request = kvcache_pb2.LoadRequest(transfer_id=transfer_id, block_hashes=hashes, target=target,
                                          target_block_ids=target_block_ids, timeout_ms=int(self.timeout_s * 1e3),
                                          transport=self.transport, path=PATHS[path])
        if state is not None:
            request.state_seq_id, request.state_block_hash = state
        try:
            return await rpc(self._stub.Load(request, timeout=self.timeout_s + 5, metadata=metadata))
        except grpc.aio.AioRpcError as exc:
            self._failed("load", exc)
            return kvcache_pb2.LoadResponse(status=common_pb2.TRANSFER_STATUS_FAILED, error=exc.details() or "")

    async def store(self, transfer_id: str, source: common_pb2.KVEndpoint, block_ids: list[int],
                    hashes: list[int], metadata=(), state: tuple[int, int] | None = None) -> kvcache_pb2.StoreResponse:
        """Copies the source's blocks into kvcache under ``hashes`` (and with ``state``, (checkpoint slot, tokens),
        the recurrent state the source saved after the last of them)."""
        request = kvcache_pb2.StoreRequest(transfer_id=transfer_id, source=source, source_block_ids=block_ids,
                                           block_hashes=hashes, timeout_ms=int(self.timeout_s * 1e3),
                                           transport=self.transport)
        if state is not None:
            request.state_checkpoint, request.state_tokens = state
        try:
            return await rpc(self._stub.Store(request, timeout=self.timeout_s + 5, metadata=metadata))
        except grpc.aio.AioRpcError as exc:
            self._failed("store", exc)
            return kvcache_pb2.StoreResponse(status=common_pb2.TRANSFER_STATUS_FAILED, error=exc.details() or "")

    async def close(self) -> None:
        await self._channel.close()
