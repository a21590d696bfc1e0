"""Meeting peers when a worker registers: it and every other NIXL worker load each other's metadata and open
their connections (Worker.MeetPeers) before any transfer between them needs them, and the kvcache service, if
any, meets it too (KVCache.MeetPeers: it writes loads into the worker and reads stores from it).

Without it a pair meets in its first transfer: loading the metadata on each of an agent's lanes and UCX
opening a connection per lane made a hand-off's first pull 22-25 ms against 3-4 ms once met on the 2-core box
(a migration's first transfer under load: ~65 ms), inside the first decode token's wait or a move's pause. A meeting that fails costs nothing but the time: the first transfer meets the
peer then, as it would have anyway.
"""

from __future__ import annotations

import logging

import anyio
import grpc

from seawall.v1 import common_pb2
from services.common.rpc import rpc
from services.scheduler.kvcache_client import KVCacheClient
from services.scheduler.worker_link import WorkerLink

log = logging.getLogger(__name__)


async def meet_peers(link: WorkerLink, others: list[WorkerLink], timeout_s: float,
                     kvcache: KVCacheClient | None = None) -> None:
    """``link`` meets each of ``others`` and each of them meets ``link``, all at once (a transfer's reader and
    its writer are whichever side the scheduler asks, so both open connections); ``kvcache`` meets ``link``."""
    if not link.info.HasField("nixl"):
        return
    others = [o for o in others if o is not link and o.info.HasField("nixl")]
    async with anyio.create_task_group() as tg:
        if others:
            tg.start_soon(_meet, link, others, timeout_s)
        for other in others:
            tg.start_soon(_meet, other, [link], timeout_s)
        if kvcache is not None:
            tg.start_soon(kvcache.meet, link.endpoint())


async def _meet(link: WorkerLink, peers: list[WorkerLink], timeout_s: float) -> None:
    request = common_pb2.MeetPeersRequest(peers=[p.endpoint() for p in peers], timeout_ms=int(timeout_s * 1e3))
    try:
        with anyio.fail_after(timeout_s * len(peers) + 5):
            await rpc(link.stub.MeetPeers(request))
    except (grpc.aio.AioRpcError, TimeoutError) as exc:
        why = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else "timed out"
        log.warning("%s could not meet %s ahead of their first transfer (%s); they meet in it",
                    link.worker_id, ", ".join(p.worker_id for p in peers), why)
