"""NIXL KV transport: real agents over real pools move blocks by id, in one process and across two."""

from __future__ import annotations

import itertools
import multiprocessing
import time

import anyio
import numpy as np
import pytest
import torch

pytest.importorskip("nixl_cu12._api")

from seawall.v1 import common_pb2  # noqa: E402
from services.common.errors import InvalidArgument, Unavailable  # noqa: E402
from services.common.kv_transport import (  # noqa: E402
    NixlKVAgent,
    TransferState,
    _runs,
    kv_layout_proto,
    transfer_status_proto,
)
from services.engine.kv_pool import KVLayout, PagedKVPool  # noqa: E402

SMALL = KVLayout(num_layers=2, block_size=16, num_kv_heads=2, head_dim=16, dtype=torch.float32)  # 8 KiB/block
LARGE = KVLayout(num_layers=4, block_size=16, num_kv_heads=8, head_dim=64, dtype=torch.float16)  # 128 KiB/block
_names = itertools.count()


def _pool(layout=SMALL, num_blocks=64, seed=0) -> PagedKVPool:
    pool = PagedKVPool(layout, num_blocks, 0, torch.device("cpu"))
    pool.device_kv.copy_(torch.randn(pool.device_kv.shape, generator=torch.Generator().manual_seed(seed)))
    return pool


@pytest.fixture
def pair():
    """Two connected agents (``a`` knows ``b``) over pools with different contents."""
    a_pool, b_pool = _pool(seed=1), _pool(seed=2)
    a = NixlKVAgent(f"a{next(_names)}", a_pool)
    b = NixlKVAgent(f"b{next(_names)}", b_pool)
    a.add_peer(b.metadata(), b.kv_layout())
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def large_pair():
    """Like ``pair`` over 32 MiB pools: large enough that a whole-pool post takes milliseconds."""
    a = NixlKVAgent(f"la{next(_names)}", _pool(LARGE, 256, seed=1))
    b = NixlKVAgent(f"lb{next(_names)}", _pool(LARGE, 256, seed=2))
    a.add_peer(b.metadata(), b.kv_layout())
    yield a, b
    a.close()
    b.close()


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_write_and_read_move_blocks_by_id_and_notify(pair):
    a, b = pair
    before = b.pool.device_kv.clone()
    src, dst = [3, 4, 5, 9, 0], [10, 11, 12, 2, 63]  # a run of three (one descriptor) and two singles
    out = await a.write("w1", b.name, src, dst, timeout_s=10, notification=b"w1 landed")
    assert out.status is TransferState.DONE and out.ok and out.error == ""
    assert out.bytes == len(src) * SMALL.bytes_per_block and out.transfer_id == "w1"
    assert torch.equal(b.pool.device_kv[dst], a.pool.device_kv[src])
    untouched = [i for i in range(64) if i not in dst]
    assert torch.equal(b.pool.device_kv[untouched], before[untouched])
    assert await b.wait_notification(a.name, b"w1 landed", timeout_s=5)
    assert not await b.wait_notification(a.name, b"w1 landed", timeout_s=0.01)  # taken once

    out = await a.read("r1", b.name, remote_block_ids=[40, 41, 7], local_block_ids=[20, 21, 50], timeout_s=10,
                       notification=b"r1 read")
    assert out.ok and out.bytes == 3 * SMALL.bytes_per_block
    assert torch.equal(a.pool.device_kv[[20, 21, 50]], b.pool.device_kv[[40, 41, 7]])
    assert await b.wait_notification(a.name, b"r1 read", timeout_s=5)
    assert a.state("r1") is None  # ended transfers are forgotten


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_an_empty_transfer_is_done_and_still_notifies(pair):
    a, b = pair
    out = await a.write("e", b.name, [], [], timeout_s=5, notification=b"nothing to move")
    assert out.ok and out.bytes == 0
    assert await b.wait_notification(a.name, b"nothing to move", timeout_s=5)


def test_adjacent_ids_coalesce_only_where_both_sides_run():
    src, dst, n = _runs(np.array([3, 4, 5, 9, 10, 0]), np.array([10, 11, 12, 2, 4, 63]))
    assert src.tolist() == [3, 9, 10, 0] and dst.tolist() == [10, 2, 4, 63] and n.tolist() == [3, 1, 1, 1]


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_uncoalesced_descriptors_move_the_same_bytes(pair):
    a, b = pair
    a.coalesce = False
    out = await a.write("u", b.name, list(range(8)), list(range(30, 38)), timeout_s=10)
    assert out.ok and torch.equal(b.pool.device_kv[30:38], a.pool.device_kv[0:8])


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_passed_deadline_ends_timed_out_without_posting(pair):
    a, b = pair
    before = b.pool.device_kv.clone()
    start = time.monotonic()
    out = await a.write("late", b.name, [1, 2], [1, 2], timeout_s=0)
    assert out.status is TransferState.TIMED_OUT and out.bytes == 0
    assert "pending" in out.error and time.monotonic() - start < 1
    assert torch.equal(b.pool.device_kv, before)
    assert (await a.write("late", b.name, [1], [1], timeout_s=10)).ok  # the id is free again


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_deadline_during_a_large_post_ends_timed_out_and_later_transfers_work(large_pair):
    a, b = large_pair
    ids = list(range(256))
    start = time.monotonic()
    out = await a.write("slow", b.name, ids, ids, timeout_s=1e-4)
    assert out.status is TransferState.TIMED_OUT, out
    # The post copied on in its thread: the outcome came once it was done (no byte lands after it), not later.
    assert time.monotonic() - start < 0.5 and "may still land" not in out.error
    after = b.pool.device_kv.clone()
    await anyio.sleep(0.2)
    assert torch.equal(b.pool.device_kv, after)
    out = await a.write("after", b.name, ids, ids, timeout_s=30)
    assert out.ok and torch.equal(b.pool.device_kv, a.pool.device_kv)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_abort_ends_an_in_flight_transfer_as_aborted(pair, large_pair):
    a, b = pair
    outcomes = {}

    async def run(agent, peer, tid, n):
        outcomes[tid] = await agent.write(tid, peer.name, list(range(n)), list(range(n)), timeout_s=30)

    async with anyio.create_task_group() as tg:  # aborted before it was posted
        tg.start_soon(run, a, b, "p", 4)
        await anyio.sleep(0)
        assert a.state("p") is TransferState.PENDING
        assert a.abort("p")
    assert outcomes["p"].status is TransferState.ABORTED and outcomes["p"].bytes == 0

    la, lb = large_pair
    async with anyio.create_task_group() as tg:  # aborted while its post copies in a worker thread
        tg.start_soon(run, la, lb, "q", 256)
        while la.state("q") is not TransferState.POSTED:
            await anyio.sleep(0)
        assert la.abort("q")
        assert not la.abort("q")  # already ended
    assert outcomes["q"].status is TransferState.ABORTED, outcomes["q"]
    assert not a.abort("never-started") and not a.abort("p")


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_no_byte_lands_after_a_failed_outcome():
    # A 256 MiB write copies for tens of ms in its post threads; aborted meanwhile, its outcome waits for them:
    # the caller hands the destination blocks to another request as soon as it learns the transfer failed.
    a = NixlKVAgent(f"ha{next(_names)}", _pool(LARGE, 2048, seed=1))
    b = NixlKVAgent(f"hb{next(_names)}", _pool(LARGE, 2048, seed=2))
    a.add_peer(b.metadata(), b.kv_layout())
    try:
        ids = list(range(2048))
        for tid in ("x", "y"):
            async with anyio.create_task_group() as tg:
                out = {}

                async def run(tid=tid, out=out):
                    out["o"] = await a.write(tid, b.name, ids, ids, timeout_s=30)

                tg.start_soon(run)
                while a.state(tid) is not TransferState.POSTED:
                    await anyio.sleep(0)
                await anyio.sleep(0.005)  # the threads are copying
                assert a.abort(tid)
            assert out["o"].status is TransferState.ABORTED and "may still land" not in out["o"].error
            landed = b.pool.device_kv.clone()
            await anyio.sleep(0.3)
            assert torch.equal(b.pool.device_kv, landed), "bytes landed after the outcome"
            b.pool.device_kv.copy_(torch.randn(b.pool.device_kv.shape))  # fresh contents for the second try
    finally:
        a.close()
        b.close()


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_requests_that_cannot_be_right_raise_invalid_argument(pair):
    a, b = pair
    with pytest.raises(InvalidArgument, match=r"local block ids \[64\]"):
        await a.write("x", b.name, [64], [0], timeout_s=5)
    with pytest.raises(InvalidArgument, match=r"peer .* block ids \[-1\]"):
        await a.read("x", b.name, [-1], [0], timeout_s=5)
    with pytest.raises(InvalidArgument, match="2 local block ids but 1 remote"):
        await a.write("x", b.name, [1, 2], [3], timeout_s=5)
    with pytest.raises(InvalidArgument, match="unknown NIXL peer 'nobody'.*agent_metadata"):
        await a.write("x", "nobody", [1], [1], timeout_s=5)
    with pytest.raises(InvalidArgument, match="unknown NIXL peer"):  # b never added a
        await b.write("x", a.name, [1], [1], timeout_s=5)

    async with anyio.create_task_group() as tg:
        tg.start_soon(a.write, "dup", b.name, [1], [1], 5)
        await anyio.sleep(0)
        with pytest.raises(InvalidArgument, match="already in flight"):
            await a.write("dup", b.name, [2], [2], timeout_s=5)


def test_add_peer_is_idempotent_and_rejects_another_layout():
    a = NixlKVAgent(f"a{next(_names)}", _pool())
    b = NixlKVAgent(f"b{next(_names)}", _pool())
    other = NixlKVAgent(f"o{next(_names)}", _pool(KVLayout(2, 32, 2, 16, torch.float32)))
    try:
        for _ in range(2):
            a.add_peer(b.metadata(), b.kv_layout())
        with pytest.raises(InvalidArgument, match=r"different KV layout: block_size 32 \(here 16\), bytes_per_block"):
            a.add_peer(other.metadata(), other.kv_layout())
        half = KVLayout(2, 16, 2, 16, torch.float16)
        with pytest.raises(InvalidArgument, match=r"dtype .*same model, block size and dtype"):
            a.add_peer(b.metadata(), kv_layout_proto(half))
        latent = KVLayout(2, 16, 2, 32, torch.float32, num_parts=1)  # as many bytes a block, one tensor a layer
        with pytest.raises(InvalidArgument, match=r"different KV layout: head_dim 32 \(here 16\), kv_parts 1"):
            a.add_peer(b.metadata(), kv_layout_proto(latent))
        wrong = b.metadata()
        wrong.agent_name = "impostor"
        with pytest.raises(InvalidArgument, match="belongs to agent"):
            a.add_peer(wrong, b.kv_layout())
    finally:
        for agent in (a, b, other):
            agent.close()


def test_metadata_and_layout_describe_the_device_pool():
    pool = _pool(LARGE, 8)
    with NixlKVAgent(f"m{next(_names)}", pool) as agent:
        meta, layout = agent.metadata(), agent.kv_layout()
    assert meta.agent_name == agent.name and meta.agent_metadata
    (region,) = meta.regions
    assert (region.addr, region.length) == (pool.device_kv.data_ptr(), 8 * LARGE.bytes_per_block)
    assert region.mem_type == common_pb2.MEMORY_TYPE_DRAM and region.device_id == 0
    assert layout == common_pb2.KVLayout(
        block_size=16, num_layers=4, num_kv_heads=8, head_dim=64, dtype=common_pb2.KV_DTYPE_FLOAT16,
        bytes_per_block=LARGE.bytes_per_block, regions_per_block=1, region_block_bytes=LARGE.bytes_per_block,
        kv_parts=2)


def test_terminal_states_map_to_the_proto_enum():
    assert transfer_status_proto(TransferState.DONE) == common_pb2.TRANSFER_STATUS_DONE
    assert transfer_status_proto(TransferState.FAILED) == common_pb2.TRANSFER_STATUS_FAILED
    assert transfer_status_proto(TransferState.TIMED_OUT) == common_pb2.TRANSFER_STATUS_TIMED_OUT
    assert transfer_status_proto(TransferState.ABORTED) == common_pb2.TRANSFER_STATUS_ABORTED
    with pytest.raises(ValueError, match="not a terminal"):
        transfer_status_proto(TransferState.POSTED)


def _peer_process(conn) -> None:
    """The other process: a pool with known contents behind an agent; answers with block bytes."""
    agent = NixlKVAgent("peer-process", _pool(seed=7))
    conn.send((agent.metadata().SerializeToString(), agent.kv_layout().SerializeToString()))
    while (msg := conn.recv()) != "stop":
        if msg == "notifications":
            conn.send(agent.notifications())
        else:
            conn.send(agent.pool.device_kv[msg].numpy().tobytes())
    agent.close()


async def _start_peer_process():
    """``_peer_process`` started: (process, its end of the pipe, its agent's metadata, its KV layout)."""
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_peer_process, args=(child_conn,), daemon=True)
    proc.start()
    meta_bytes, layout_bytes = await anyio.to_thread.run_sync(conn.recv)
    return (proc, conn, common_pb2.NixlAgentMetadata.FromString(meta_bytes),
            common_pb2.KVLayout.FromString(layout_bytes))


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_blocks_move_between_two_processes():
    proc, conn, meta, layout = await _start_peer_process()
    try:
        with NixlKVAgent(f"parent{next(_names)}", _pool(seed=3)) as agent:
            agent.add_peer(meta, layout)
            peer_before = _pool(seed=7).device_kv  # the same seed: what the peer holds

            out = await agent.write("x-w", "peer-process", [5, 6, 7, 1], [0, 1, 2, 60], timeout_s=20,
                                    notification=b"done")
            assert out.ok, out
            conn.send([0, 1, 2, 60])
            landed = await anyio.to_thread.run_sync(conn.recv)
            assert landed == agent.pool.device_kv[[5, 6, 7, 1]].numpy().tobytes()

            out = await agent.read("x-r", "peer-process", [30, 31, 10], [40, 41, 42], timeout_s=20)
            assert out.ok, out
            assert torch.equal(agent.pool.device_kv[[40, 41, 42]], peer_before[[30, 31, 10]])
            conn.send("notifications")
            assert (await anyio.to_thread.run_sync(conn.recv)) == {agent.name: [b"done"]}
        conn.send("stop")
        await anyio.to_thread.run_sync(proc.join, 10)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_large_transfer_split_across_post_lanes_lands_whole_and_notifies_once(large_pair):
    a, b = large_pair
    src, dst = list(range(40, 140)) + [7, 3], list(range(100, 200)) + [0, 255]  # 102 blocks, 12.75 MiB
    out = await a.write("split-w", b.name, src, dst, timeout_s=20, notification=b"split landed")
    assert out.ok and out.bytes == len(src) * LARGE.bytes_per_block, out
    assert torch.equal(b.pool.device_kv[dst], a.pool.device_kv[src])
    assert await b.wait_notification(a.name, b"split landed", timeout_s=5)  # from a's own name, once
    assert not await b.wait_notification(a.name, b"split landed", timeout_s=0.05)
    assert not any(b.notifications().values())  # and nothing from the post lanes

    out = await a.read("split-r", b.name, list(range(200, 256)), list(range(56)), timeout_s=20,
                       notification=b"split read")
    assert out.ok, out
    assert torch.equal(a.pool.device_kv[:56], b.pool.device_kv[200:256])
    assert await b.wait_notification(a.name, b"split read", timeout_s=5)


def test_one_lane_still_moves_large_transfers():
    a = NixlKVAgent(f"one{next(_names)}", _pool(LARGE, 64, seed=1), post_lanes=0)  # posts on the main agent
    b = NixlKVAgent(f"oneb{next(_names)}", _pool(LARGE, 64, seed=2))
    try:
        a.add_peer(b.metadata(), b.kv_layout())
        out = anyio.run(lambda: a.write("w", b.name, list(range(64)), list(range(64)), timeout_s=20,
                                        notification=b"n"))
        assert out.ok, out
        assert torch.equal(b.pool.device_kv, a.pool.device_kv)
        assert anyio.run(b.wait_notification, a.name, b"n", 5)  # attached to the request, as before lanes
    finally:
        a.close()
        b.close()


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_meet_reads_from_every_lane_once_per_metadata_and_writes_no_block():
    a = NixlKVAgent(f"a{next(_names)}", _pool(seed=1))
    b = NixlKVAgent(f"b{next(_names)}", _pool(seed=2))
    before = a.pool.device_kv.clone(), b.pool.device_kv.clone()
    try:
        assert await a.meet(b.metadata(), b.kv_layout()) and a.met == [b.name]
        # The reads landed in the scratch area, not in either pool.
        assert a._scratch.tolist() == b.pool.device_kv.view(-1).view(torch.uint8)[: a._scratch.numel()].tolist()
        assert torch.equal(a.pool.device_kv, before[0]) and torch.equal(b.pool.device_kv, before[1])
        assert not await a.meet(b.metadata(), b.kv_layout())  # met already: nothing to do
        assert b.met == []  # a meeting is one way: b has not met a
        out = await a.read("r", b.name, [5], [6], timeout_s=10)
        assert out.ok and torch.equal(a.pool.device_kv[6], b.pool.device_kv[5])

        b.close()  # b restarts: another pool, new metadata under the same name, to be met again
        b = NixlKVAgent(b.name, _pool(seed=3))
        assert await a.meet(b.metadata(), b.kv_layout()) and a.met == [b.name]
        out = await a.read("r2", b.name, [5], [7], timeout_s=10)
        assert out.ok and torch.equal(a.pool.device_kv[7], b.pool.device_kv[5])
    finally:
        a.close()
        b.close()


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_meeting_a_peer_whose_process_is_gone_is_unavailable_and_leaves_it_unknown():
    proc, _, meta, layout = await _start_peer_process()
    proc.kill()
    await anyio.to_thread.run_sync(proc.join, 10)
    with NixlKVAgent(f"left{next(_names)}", _pool()) as agent:
        with pytest.raises(Unavailable, match="could not load peer 'peer-process'"):
            await agent.meet(meta, layout, timeout_s=5)
        assert agent.met == []
        with pytest.raises(InvalidArgument, match="unknown NIXL peer 'peer-process'"):
            await agent.read("r", "peer-process", [0], [0], timeout_s=1)
