"""Moving blocks between the kvcache's DRAM tier and a worker's pool: NIXL when both sides have it, else gRPC.

The kvcache always initiates: a Load is a NIXL WRITE (or a push into the worker's Worker.WriteKV), a Store a
NIXL READ (or a pull from Worker.ReadKV). Only the kvcache needs the worker's NIXL metadata, which a
``KVEndpoint`` carries the first time this process meets the worker.

Which plane (``route``): GRPC → gRPC; NIXL or UNSPECIFIED → NIXL when this process has an agent and knows the
peer (metadata now or before), else gRPC when the endpoint has a ``grpc_address`` (NIXL is unavailable on one
side), else INVALID_ARGUMENT.

Shaping (``--storage-gbps``, off by default): every worker is one node with a storage NIC; a Load's bytes take
tokens from the ``storage``/``in`` bucket of its target, a Store's from the ``storage``/``out`` bucket of its
source (services/common/shaper.py), before a NIXL transfer is posted or as each gRPC chunk goes.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from seawall.v1 import common_pb2
from services.common import grpc_kv
from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.kv_transport import NixlKVAgent, TransferOutcome, meeting_metadata
from services.common.shaper import EGRESS, INGRESS, STORAGE, Shaper, TokenBucket
from services.kvcache.layout import layout_from_proto
from services.kvcache.store import KVStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    """How bytes reach one endpoint: ``nixl_peer`` (a NIXL agent name) or ``grpc_address``. ``node`` names the
    endpoint (its agent name, else its address): the key of its load queue and of its shaped storage NIC."""

    nixl_peer: str = ""
    grpc_address: str = ""
    node: str = ""

    @property
    def transport(self) -> str:
        return "nixl" if self.nixl_peer else "grpc"


class Mover:
    """Transfers between ``store.pool`` (the DRAM tier) and workers. Owns the NIXL agent (created once the
    store has a layout) and one gRPC channel per worker address."""

    def __init__(self, store: KVStore, use_nixl: bool, agent_name: str = "", shaper: Shaper | None = None) -> None:
        self.store = store
        self.shaper = shaper or Shaper()
        self.agent_name = agent_name or f"kvcache-{socket.gethostname()}-{os.getpid()}"
        self._use_nixl = use_nixl
        self._agent: NixlKVAgent | None = None
        self._peers: set[str] = set()
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def agent(self) -> NixlKVAgent | None:
        """The NIXL agent over the DRAM tier; None without NIXL (disabled, failed, or no layout yet)."""
        # An attention-free model's blocks hold nothing to move (its states go over gRPC, as every model's).
        if self._agent is None and self._use_nixl and self.store.pool is not None and self.store.layout.bytes_per_block:
            try:
                self._agent = NixlKVAgent(self.agent_name, self.store.pool)
                log.info("NIXL agent %s registered the DRAM tier (%d bytes)", self.agent_name,
                         self.store.pool.num_blocks * self.store.layout.bytes_per_block)
            except Exception as exc:  # noqa: BLE001 - any NIXL/UCX start-up failure means: use the gRPC fallback
                log.warning("NIXL is unavailable (%s); KV moves over the gRPC fallback", exc)
                self._use_nixl = False
        return self._agent

    def route(self, endpoint: common_pb2.KVEndpoint, transport: int, what: str) -> Route:
        """The plane to ``endpoint`` (see the module docstring); adds its NIXL metadata as a peer if sent."""
        meta = endpoint.agent_metadata if endpoint.HasField("agent_metadata") else None
        name = meta.agent_name if meta is not None and meta.agent_name else endpoint.agent_name
        node = endpoint.agent_name or name or endpoint.grpc_address
        if transport != common_pb2.KV_TRANSPORT_GRPC and self.agent is not None:
            if meta is not None and meta.agent_name:
                self.agent.add_peer(meta, endpoint.kv_layout)  # InvalidArgument on a layout mismatch
                self._peers.add(name)
            if name in self._peers:
                return Route(nixl_peer=name, node=node)
        if endpoint.grpc_address:
            return Route(grpc_address=endpoint.grpc_address, node=node)
        if transport == common_pb2.KV_TRANSPORT_GRPC:
            raise InvalidArgument(f"{what}.grpc_address is empty but the gRPC transport was asked for")
        raise InvalidArgument(
            f"{what} can be reached neither over NIXL (no agent_metadata for {endpoint.agent_name!r} and not "
            f"met before{'' if self.agent is not None else '; NIXL is off here'}) nor over gRPC (no grpc_address)"
        )

    async def meet(self, endpoint: common_pb2.KVEndpoint, timeout_s: float) -> bool:
        """Meets a worker ahead of its first transfer (``NixlKVAgent.meet``), fixing the store's layout from its
        own if none is set yet (as its first Store would); False when met already."""
        meta = meeting_metadata(endpoint)
        self.store.ensure_layout(layout_from_proto(endpoint.kv_layout, "the peer"), f"peer {meta.agent_name!r}")
        if self.agent is None:
            raise FailedPrecondition("this kvcache has no NIXL agent (--no-nixl, or NIXL failed to start): it "
                                     "has no peers to meet; its transfers go over gRPC")
        met = await self.agent.meet(meta, endpoint.kv_layout, timeout_s)
        self._peers.add(meta.agent_name)
        return met

    @property
    def met(self) -> list[str]:
        """The workers met ahead of transfers (``meet``) whose metadata is unchanged since."""
        return self._agent.met if self._agent is not None else []

    async def write(self, route: Route, transfer_id: str, slots: Sequence[int], dst_ids: Sequence[int],
                    timeout_s: float, notification: bytes = b"") -> TransferOutcome:
        """DRAM ``slots`` into the worker's ``dst_ids``."""
        bucket = self.bucket(route, INGRESS)
        if route.nixl_peer:
            return await self.agent.write(transfer_id, route.nixl_peer, slots, dst_ids, timeout_s, notification,
                                          bucket=bucket)
        return await grpc_kv.push_blocks(self._channel(route.grpc_address), self.store.pool, slots, dst_ids,
                                         transfer_id, timeout_s, bucket=bucket)

    async def read(self, route: Route, transfer_id: str, src_ids: Sequence[int], slots: Sequence[int],
                   timeout_s: float) -> TransferOutcome:
        """The worker's ``src_ids`` into DRAM ``slots``."""
        bucket = self.bucket(route, EGRESS)
        if route.nixl_peer:
            return await self.agent.read(transfer_id, route.nixl_peer, src_ids, slots, timeout_s, bucket=bucket)
        return await grpc_kv.pull_blocks(self._channel(route.grpc_address), self.store.pool, src_ids, slots,
                                         transfer_id, timeout_s, bucket=bucket)

    def bucket(self, route: Route, direction: str) -> TokenBucket | None:
        """The storage-NIC bucket of the route's node in ``direction`` (in: loads, out: stores); None unshaped."""
        return self.shaper.bucket(STORAGE, route.node, direction)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=grpc_kv.GRPC_KV_OPTIONS)
            self._channels[address] = channel
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self._agent is not None:
            self._agent.close()
            self._agent = None
