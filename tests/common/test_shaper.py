"""Bandwidth shaper: token buckets alone, then real transfers (gRPC ReadKV/WriteKV against a real grpc.aio server,
NIXL between two agents) shaped to a rate. Timing bounds are loose and measured against an unshaped run of the
same transfer in the same test: a shaped transfer never beats its rate, and costs at most the rate's time plus
the unshaped time plus slack."""

from __future__ import annotations

import itertools
import time

import anyio
import grpc
import grpc.aio
import pytest
import torch

from services.common.grpc_kv import (
    GRPC_KV_OPTIONS,
    pull_blocks,
    push_blocks,
)
from services.common.kv_transport import TransferState
from services.common.shaper import (
    COMPUTE,
    EGRESS,
    INGRESS,
    MIN_BURST_BYTES,
    STORAGE,
    Shaper,
    TokenBucket,
)
from services.engine.kv_pool import KVLayout, PagedKVPool
from tests.common.kv_helpers import kv_bytes_server, random_pool

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

LAYOUT = KVLayout(num_layers=4, block_size=16, num_kv_heads=4, head_dim=32, dtype=torch.float16)  # 32 KiB/block
BPB = LAYOUT.bytes_per_block
_names = itertools.count()


def _pool(num_blocks=64, seed=0) -> PagedKVPool:
    return random_pool(LAYOUT, num_blocks, seed)


async def _timed(coro) -> tuple[object, float]:
    start = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - start


def _within(elapsed: float, ideal: float, unshaped: float = 0.0) -> bool:
    """Never faster than the rate allows (a little timer slack), at most the rate's time plus the real copy
    plus scheduling slack on a loaded 2-core box."""
    return 0.85 * ideal <= elapsed <= 1.5 * ideal + unshaped + 0.25


# ---- the buckets -------------------------------------------------------------------------------------------

async def test_off_by_default_no_bucket_and_no_delay():
    shaper = Shaper()
    assert not shaper.enabled
    assert shaper.bucket(STORAGE, "decode-1") is None and shaper.bucket(COMPUTE) is None
    _, elapsed = await _timed(shaper.acquire(STORAGE, 1 << 40, "decode-1"))  # a terabyte, at once
    assert elapsed < 0.05 and shaper.buckets() == {}
    only_storage = Shaper(storage_gbps=1.0)
    assert only_storage.enabled and only_storage.bucket(COMPUTE, "x") is None
    assert only_storage.bucket(STORAGE, "x").rate == 1e9


def test_bad_rates_and_classes_are_refused():
    with pytest.raises(ValueError, match="storage_gbps"):
        Shaper(storage_gbps=-1)
    with pytest.raises(ValueError, match="traffic class"):
        Shaper().bucket("network")
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(0)


def test_one_bucket_per_class_node_and_direction():
    shaper = Shaper(storage_gbps=1.0, compute_gbps=4.0)
    a_in = shaper.bucket(STORAGE, "a", INGRESS)
    assert shaper.bucket(STORAGE, "a", INGRESS) is a_in
    others = [shaper.bucket(STORAGE, "a", EGRESS), shaper.bucket(STORAGE, "b", INGRESS),
              shaper.bucket(COMPUTE, "a", INGRESS)]
    assert len({id(b) for b in [a_in, *others]}) == 4
    assert others[2].rate == 4e9 and a_in.burst == max(1e9 * 0.01, MIN_BURST_BYTES)


async def test_a_shaped_stream_of_chunks_runs_at_the_rate():
    rate, total, chunk = 8e6, 2_000_000, 100_000
    bucket = TokenBucket(rate, burst=chunk)
    start = time.perf_counter()
    for _ in range(total // chunk):
        await bucket.acquire(chunk)
    elapsed = time.perf_counter() - start
    assert _within(elapsed, (total - chunk) / rate), elapsed  # the first chunk came from the full bucket
    assert bucket.bytes == total and bucket.waited_s > 0


async def test_two_concurrent_transfers_share_the_rate_and_interleave():
    rate, each, chunk = 8e6, 1_000_000, 50_000
    bucket = TokenBucket(rate, burst=chunk)
    ends: list[float] = []

    async def transfer():
        for _ in range(each // chunk):
            await bucket.acquire(chunk)
        ends.append(time.perf_counter())

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(transfer)
        tg.start_soon(transfer)
    total = (2 * each - chunk) / rate
    assert _within(max(ends) - start, total), ends
    assert min(ends) - start > 0.8 * total  # both finish near the end: the rate was shared, not queued


async def test_a_cancelled_wait_gives_its_tokens_back():
    bucket = TokenBucket(1e6, burst=1000)
    with anyio.move_on_after(0.05):
        await bucket.acquire(10_000_000)  # ten seconds' worth
    assert bucket.bytes == 0
    _, elapsed = await _timed(bucket.acquire(500))
    assert elapsed < 0.05


# ---- real transfers ----------------------------------------------------------------------------------------


@pytest.fixture
async def server():
    pool = _pool(seed=2)
    async with kv_bytes_server(pool) as address:
        yield address, pool


@pytest.mark.parametrize("direction", ["pull", "push"])
async def test_a_shaped_grpc_transfer_takes_its_bytes_over_the_rate(server, direction):
    address, remote = server
    local = _pool(seed=1)
    ids = list(range(48))  # 1.5 MiB in 256 KiB chunks
    nbytes = len(ids) * BPB
    move = pull_blocks if direction == "pull" else push_blocks
    async with grpc.aio.insecure_channel(address, options=GRPC_KV_OPTIONS) as channel:
        unshaped, t0 = await _timed(move(channel, local, ids, ids, "u", 20, max_chunk_bytes=8 * BPB))
        assert unshaped.ok, unshaped.error
        rate = nbytes / 0.4  # 0.4 s at the shaped rate
        bucket = TokenBucket(rate, burst=8 * BPB)
        shaped, t1 = await _timed(move(channel, local, ids, ids, "s", 20, max_chunk_bytes=8 * BPB, bucket=bucket))
    assert shaped.ok and shaped.bytes == nbytes, shaped.error
    assert _within(t1, (nbytes - 8 * BPB) / rate, t0), (t0, t1)
    assert torch.equal(local.device_kv[ids], remote.device_kv[ids])


@pytest.fixture
def nixl_pair():
    pytest.importorskip("nixl_cu12._api")
    from services.common.kv_transport import NixlKVAgent

    a = NixlKVAgent(f"sa{next(_names)}", _pool(seed=1))
    b = NixlKVAgent(f"sb{next(_names)}", _pool(seed=2))
    a.add_peer(b.metadata(), b.kv_layout())
    yield a, b
    a.close()
    b.close()


async def test_a_shaped_nixl_read_takes_its_bytes_over_the_rate(nixl_pair):
    a, b = nixl_pair
    ids = list(range(64))  # 2 MiB in one post
    nbytes = len(ids) * BPB
    unshaped, t0 = await _timed(a.read("u", b.name, ids, ids, 10))
    assert unshaped.ok, unshaped.error
    rate = nbytes / 0.4
    bucket = TokenBucket(rate, burst=BPB)
    shaped, t1 = await _timed(a.read("s", b.name, ids, ids, 10, bucket=bucket))
    assert shaped.ok and shaped.bytes == nbytes, shaped.error
    assert _within(t1, (nbytes - BPB) / rate, t0), (t0, t1)
    assert torch.equal(a.pool.device_kv, b.pool.device_kv)


async def test_a_nixl_transfer_that_cannot_get_its_bytes_in_time_times_out_untouched(nixl_pair):
    a, b = nixl_pair
    before = b.pool.device_kv.clone()
    bucket = TokenBucket(1e6, burst=BPB)  # 64 blocks would take 2 s
    outcome, elapsed = await _timed(a.write("slow", b.name, list(range(64)), list(range(64)), 0.2, bucket=bucket))
    assert outcome.status is TransferState.TIMED_OUT and elapsed < 1.0
    assert "pending" in outcome.error and torch.equal(b.pool.device_kv, before)  # never posted
    assert bucket.bytes == 0  # the tokens went back


# ---- a worker's compute NIC (--compute-gbps) --------------------------------------------------------------

class _Context:
    def invocation_metadata(self):
        return ()


@pytest.mark.parametrize("transport", ["grpc", "nixl"])
async def test_a_worker_with_compute_gbps_shapes_its_pulls(server, transport):
    from types import SimpleNamespace

    from seawall.v1 import common_pb2, worker_pb2
    from services.common.kv_transport import NixlKVAgent, kv_layout_proto
    from services.worker.config import WorkerConfig
    from services.worker.servicer import WorkerServicer

    address, remote_pool = server
    local = _pool(seed=5)
    agent = peer = None
    peer_ep = common_pb2.KVEndpoint(agent_name="peer", kv_layout=kv_layout_proto(LAYOUT), grpc_address=address)
    if transport == "nixl":
        pytest.importorskip("nixl_cu12._api")
        agent, peer = NixlKVAgent(f"wa{next(_names)}", local), NixlKVAgent(f"wb{next(_names)}", remote_pool)
        peer_ep.agent_name = peer.name
        peer_ep.agent_metadata.CopyFrom(peer.metadata())
    ids = list(range(48))
    nbytes = len(ids) * BPB
    rate = nbytes / 0.4
    try:
        times = {}
        for gbps in (0.0, rate / 1e9):
            servicer = WorkerServicer(WorkerConfig(compute_gbps=gbps), SimpleNamespace(kv=local), agent)
            request = worker_pb2.PullKVRequest(transfer_id=f"p{gbps}", src=peer_ep, src_block_ids=ids,
                                               dst_block_ids=ids, timeout_ms=20_000,
                                               transport=common_pb2.KV_TRANSPORT_GRPC if transport == "grpc"
                                               else common_pb2.KV_TRANSPORT_NIXL)
            local.device_kv.zero_()
            response, times[gbps] = await _timed(servicer.PullKV(request, _Context()))
            assert (response.status, response.bytes) == (common_pb2.TRANSFER_STATUS_DONE, nbytes), response.error
            assert torch.equal(local.device_kv[ids], remote_pool.device_kv[ids])
        unshaped, shaped = times.values()
        burst = max(rate * 0.01, MIN_BURST_BYTES)
        assert _within(shaped, (nbytes - burst) / rate, unshaped), times
        assert servicer._compute_bucket(INGRESS).bytes == nbytes
    finally:
        for a in (agent, peer):
            if a is not None:
                a.close()
