"""Meeting peers when a worker registers: it and every other NIXL worker load each other's metadata and open
their connections (Worker.MeetPeers) before any transfer between them needs them.

Without it a pair meets in its first transfer: loading the metadata on each of an agent's lanes and UCX
opening a connection per lane took 25-65 ms on the 2-core box, inside a hand-off (the first decode token's
wait) or a migration's pause. A meeting that fails costs nothing but the time: the first transfer meets the
peer then, as it would have anyway.
"""

from __future__ import annotations

import logging

import anyio
import grpc

from seawall.v1 import worker_pb2
from services.common.rpc import rpc
from services.scheduler.worker_link import WorkerLink

log = logging.getLogger(__name__)


async def meet_peers(link: WorkerLink, others: list[WorkerLink], timeout_s: float) -> None:
    """``link`` meets each of ``others`` and each of them meets ``link``, all at once (a transfer's reader and
    its writer are whichever side the scheduler asks, so both open connections)."""
    others = [o for o in others if o is not link and o.info.HasField("nixl")]
    if not link.info.HasField("nixl") or not others:
        return
    async with anyio.create_task_group() as tg:
        tg.start_soon(_meet, link, others, timeout_s)
        for other in others:
            tg.start_soon(_meet, other, [link], timeout_s)


async def _meet(link: WorkerLink, peers: list[WorkerLink], timeout_s: float) -> None:
    request = worker_pb2.MeetPeersRequest(peers=[p.endpoint() for p in peers], timeout_ms=int(timeout_s * 1e3))
    try:
        with anyio.fail_after(timeout_s * len(peers) + 5):
            await rpc(link.stub.MeetPeers(request))
    except (grpc.aio.AioRpcError, TimeoutError) as exc:
        why = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else "timed out"
        log.warning("%s could not meet %s ahead of their first transfer (%s); they meet in it",
                    link.worker_id, ", ".join(p.worker_id for p in peers), why)
