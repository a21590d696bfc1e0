"""The KVCache service end to end: a real grpc.aio kvcache in-process, real worker pools moving bytes over NIXL
and over gRPC (Worker.ReadKV / WriteKV), real block files on disk."""

from __future__ import annotations

import anyio
import grpc
import pytest
import torch

from seawall.v1 import common_pb2, kvcache_pb2
from services.engine.kv_pool import KVLayout
from tests.kvcache.conftest import BPB, LAYOUT, chain

NIXL, GRPC = common_pb2.KV_TRANSPORT_NIXL, common_pb2.KV_TRANSPORT_GRPC
DONE, NOT_FOUND = common_pb2.TRANSFER_STATUS_DONE, common_pb2.TRANSFER_STATUS_NOT_FOUND
DRAM, DISK = kvcache_pb2.STORAGE_TIER_DRAM, kvcache_pb2.STORAGE_TIER_DISK
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def store(kv, worker, ids, hashes, transport=NIXL, tid="s"):
    return await kv.stub.Store(kvcache_pb2.StoreRequest(
        transfer_id=tid, source=worker.endpoint(nixl=transport != GRPC), source_block_ids=ids,
        block_hashes=hashes, timeout_ms=20_000, transport=transport), timeout=30)


async def load(kv, worker, hashes, ids, transport=NIXL, tid="l", path=common_pb2.KV_TRANSPORT_UNSPECIFIED):
    return await kv.stub.Load(kvcache_pb2.LoadRequest(
        transfer_id=tid, target=worker.endpoint(nixl=transport != GRPC), block_hashes=hashes,
        target_block_ids=ids, timeout_ms=20_000, transport=transport, path=path), timeout=30)


async def lookup(kv, hashes, pin_ms=0):
    r = await kv.stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=hashes, pin_ms=pin_ms), timeout=10)
    return r.num_cached_blocks, r.num_dram_blocks, r.num_disk_blocks


@pytest.mark.parametrize("transport", [NIXL, GRPC])
async def test_store_then_load_moves_the_bytes_into_other_block_ids(make_kvcache, make_worker, transport):
    kv = await make_kvcache(dram_blocks=16)
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    hashes = chain(5)
    r = await store(kv, src, [3, 4, 5, 9, 0], hashes, transport)
    assert (r.status, r.num_blocks_stored, r.num_blocks_present, r.bytes) == (DONE, 5, 0, 5 * BPB), r.error
    r = await store(kv, src, [3, 4], hashes[:2], transport, tid="s2")  # already there: skipped and counted
    assert (r.status, r.num_blocks_stored, r.num_blocks_present, r.bytes) == (DONE, 0, 2, 0)
    assert await lookup(kv, hashes) == (5, 5, 0)

    untouched = dst.blocks([i for i in range(32) if i not in (20, 21, 22, 7, 31)])
    r = await load(kv, dst, hashes, [20, 21, 22, 7, 31], transport)
    assert (r.status, r.num_blocks_loaded, r.num_dram_blocks, r.num_disk_blocks) == (DONE, 5, 5, 0), r.error
    assert r.bytes == 5 * BPB and r.duration_ms > 0
    assert torch.equal(dst.blocks([20, 21, 22, 7, 31]), src.blocks([3, 4, 5, 9, 0]))
    assert torch.equal(dst.blocks([i for i in range(32) if i not in (20, 21, 22, 7, 31)]), untouched)
    kv.store.check_integrity()


async def test_without_nixl_here_or_there_transfers_fall_back_to_grpc(make_kvcache, make_worker):
    kv = await make_kvcache(nixl=False)
    src, dst = await make_worker(seed=1, nixl=False), await make_worker(seed=2)  # dst has NIXL, we do not
    hashes = chain(3)
    assert (await store(kv, src, [0, 1, 2], hashes, NIXL)).status == DONE  # NIXL asked, gRPC used
    r = await load(kv, dst, hashes, [5, 6, 7], NIXL)
    assert r.status == DONE and torch.equal(dst.blocks([5, 6, 7]), src.blocks([0, 1, 2]))
    assert kv.servicer.mover.agent is None


async def test_a_nixl_peer_met_once_needs_no_metadata_again(make_kvcache, make_worker):
    kv = await make_kvcache()
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    hashes = chain(2)
    assert (await store(kv, src, [0, 1], hashes)).status == DONE
    request = kvcache_pb2.LoadRequest(transfer_id="again", target=dst.endpoint(), block_hashes=hashes,
                                      target_block_ids=[3, 4], transport=NIXL)
    assert (await kv.stub.Load(request, timeout=30)).status == DONE
    request.target.ClearField("agent_metadata")
    request.target.grpc_address = ""  # so a gRPC fallback cannot hide a forgotten peer
    dst.pool.device_kv.zero_()
    assert (await kv.stub.Load(request, timeout=30)).status == DONE
    assert torch.equal(dst.blocks([3, 4]), src.blocks([0, 1]))


async def test_a_nixl_load_notifies_the_target_once_every_round_landed(make_kvcache, make_worker, tmp_path):
    kv = await make_kvcache(dram_blocks=2, disk_dir=tmp_path, disk_blocks=16)  # 5 blocks: several rounds
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    hashes = chain(5)
    assert (await store(kv, src, [0, 1, 2, 3, 4], hashes)).status == DONE
    r = await kv.stub.Load(kvcache_pb2.LoadRequest(transfer_id="n", target=dst.endpoint(), block_hashes=hashes,
                                                   target_block_ids=[9, 8, 7, 6, 5], notification_key="landed",
                                                   transport=NIXL), timeout=30)
    assert r.status == DONE and torch.equal(dst.blocks([9, 8, 7, 6, 5]), src.blocks(range(5)))
    assert await dst.agent.wait_notification(kv.servicer.mover.agent_name, b"landed", timeout_s=5)
    assert not await dst.agent.wait_notification(kv.servicer.mover.agent_name, b"landed", timeout_s=0.05)


async def test_lookup_finds_the_longest_cached_prefix_and_a_gap_stops_it(make_kvcache, make_worker):
    kv = await make_kvcache()
    src = await make_worker(seed=1)
    hashes = chain(6)
    await store(kv, src, [0, 1, 3, 4], [hashes[i] for i in (0, 1, 3, 4)])  # block 2 is missing
    assert await lookup(kv, hashes) == (2, 2, 0)
    assert await lookup(kv, hashes[3:5]) == (2, 2, 0)
    assert await lookup(kv, chain(3, prompt=1)) == (0, 0, 0)
    assert await lookup(kv, []) == (0, 0, 0)

    dst = await make_worker(seed=2)
    before = dst.blocks([12])
    r = await load(kv, dst, hashes[:4], [10, 11, 12, 13])
    assert (r.status, r.num_blocks_loaded, r.bytes) == (NOT_FOUND, 2, 2 * BPB) and "block 2 of 4" in r.error
    assert torch.equal(dst.blocks([10, 11]), src.blocks([0, 1])) and torch.equal(dst.blocks([12]), before)

    stats = await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)
    assert (stats.num_lookups, stats.hit_blocks, stats.miss_blocks) == (4, 4, 4 + 3)


async def test_dram_eviction_demotes_to_disk_and_loads_stage_back_through_dram(make_kvcache, make_worker,
                                                                               tmp_path):
    kv = await make_kvcache(dram_blocks=4, disk_dir=tmp_path, disk_blocks=32)
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    hashes = chain(10)
    r = await store(kv, src, list(range(10)), hashes)  # 10 blocks through a 4-block DRAM tier: 3 rounds
    assert (r.status, r.num_blocks_stored) == (DONE, 10), r.error
    assert await lookup(kv, hashes) == (10, 4, 6)  # the 6 oldest went to disk
    assert len(list((tmp_path / "blocks").rglob("*.kv"))) == 6

    r = await load(kv, dst, hashes, list(range(20, 30)))  # more than DRAM holds: loaded in rounds
    assert (r.status, r.num_blocks_loaded, r.num_dram_blocks, r.num_disk_blocks) == (DONE, 10, 4, 6), r.error
    assert torch.equal(dst.blocks(range(20, 30)), src.blocks(range(10)))
    kv.store.check_integrity()

    stats = await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)
    dram, disk = stats.tiers
    assert (dram.tier, dram.capacity_bytes, dram.num_blocks, dram.used_bytes) == (DRAM, 4 * BPB, 4, 4 * BPB)
    assert (disk.tier, disk.capacity_bytes) == (DISK, 32 * (BPB + 64))
    assert disk.num_blocks == len(list((tmp_path / "blocks").rglob("*.kv")))
    assert disk.used_bytes == disk.num_blocks * (BPB + 64)
    assert dram.bytes_read == 4 * BPB and disk.bytes_read == 6 * BPB
    assert dram.bytes_written == (10 + 6) * BPB  # stores, then promotions
    assert dram.num_evictions >= 6 and disk.bytes_written >= 6 * BPB


async def test_disk_eviction_is_lru_and_capacity_is_never_exceeded(make_kvcache, make_worker, tmp_path):
    kv = await make_kvcache(dram_blocks=2, disk_dir=tmp_path, disk_blocks=4)
    src = await make_worker(seed=1)
    hashes = chain(12)
    for i in range(12):
        assert (await store(kv, src, [i], [hashes[i]], tid=f"s{i}")).status == DONE
    stats = (await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)).tiers
    assert stats[1].num_blocks == 4 and stats[1].used_bytes <= stats[1].capacity_bytes
    assert stats[1].num_evictions == 12 - 2 - 4
    assert [kv.store.tier_of(h) for h in hashes] == [None] * 6 + [2] * 4 + [1] * 2


async def test_a_restarted_kvcache_serves_its_disk_tier(make_kvcache, make_worker, tmp_path):
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    kv = await make_kvcache(dram_blocks=8, disk_dir=tmp_path, disk_blocks=32)
    hashes = chain(6)
    assert (await store(kv, src, list(range(6)), hashes)).status == DONE
    assert await lookup(kv, hashes) == (6, 6, 0)  # all in DRAM; shutdown writes them out
    await make_kvcache.stop(kv)

    kv = await make_kvcache(dram_blocks=8, disk_dir=tmp_path, disk_blocks=32)  # no layout given: from the disk
    assert kv.store.layout == LAYOUT
    assert await lookup(kv, hashes) == (6, 0, 6)
    r = await load(kv, dst, hashes, [9, 8, 7, 6, 5, 4])
    assert (r.status, r.num_disk_blocks) == (DONE, 6), r.error
    assert torch.equal(dst.blocks([9, 8, 7, 6, 5, 4]), src.blocks(range(6)))
    assert await lookup(kv, hashes) == (6, 6, 0)  # promoted


async def test_a_corrupt_or_truncated_block_file_is_a_miss_and_never_served(make_kvcache, make_worker, tmp_path):
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    kv = await make_kvcache(dram_blocks=8, disk_dir=tmp_path, disk_blocks=32)
    hashes = chain(6)
    assert (await store(kv, src, list(range(6)), hashes)).status == DONE
    await make_kvcache.stop(kv)
    files = {h: kv.store.disk.path(h) for h in hashes}
    data = bytearray(files[hashes[2]].read_bytes())
    data[64 + 1000] ^= 0x10  # one flipped bit in the data
    files[hashes[2]].write_bytes(bytes(data))
    files[hashes[4]].write_bytes(files[hashes[4]].read_bytes()[:-100])  # truncated

    kv = await make_kvcache(dram_blocks=8, disk_dir=tmp_path, disk_blocks=32)
    assert not files[hashes[4]].exists()  # the truncated file failed the scan: deleted
    assert await lookup(kv, hashes) == (4, 0, 4)  # the flipped bit is found only on read
    before = dst.blocks(range(32))
    r = await load(kv, dst, hashes, list(range(10, 16)))
    assert (r.status, r.num_blocks_loaded, r.num_disk_blocks) == (NOT_FOUND, 2, 2) and "block 2 of 6" in r.error
    assert torch.equal(dst.blocks([10, 11]), src.blocks([0, 1]))
    assert torch.equal(dst.blocks(range(12, 32)), before[12:])  # nothing of the bad block (or after) landed
    assert not files[hashes[2]].exists()
    assert await lookup(kv, hashes) == (2, 2, 0)
    assert kv.store.stats().num_corrupt == 1
    kv.store.check_integrity()


async def test_blocks_of_another_layout_are_invalid_argument(make_kvcache, make_worker):
    kv = await make_kvcache()
    src = await make_worker(seed=1)
    assert (await store(kv, src, [0], chain(1))).status == DONE
    other = await make_worker(seed=3, layout=KVLayout(2, 32, 2, 16, torch.float16))
    for call in (store(kv, other, [0], chain(1, start=1)), load(kv, other, chain(1), [0])):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert "KV layout" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kv.stub.Load(kvcache_pb2.LoadRequest(target=src.endpoint(), block_hashes=chain(2),
                                                   target_block_ids=[1]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "2 block_hashes but 1" in err.value.details()


async def test_a_configured_layout_rejects_the_first_store_of_another(make_kvcache, make_worker):
    kv = await make_kvcache(layout=KVLayout(2, 32, 2, 16, torch.float16))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await store(kv, await make_worker(seed=1), [0], chain(1))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_loads_from_an_empty_kvcache_are_not_found(make_kvcache, make_worker):
    kv = await make_kvcache()
    dst = await make_worker(seed=2)
    r = await load(kv, dst, chain(2), [0, 1])
    assert (r.status, r.num_blocks_loaded) == (NOT_FOUND, 0)
    assert (await load(kv, dst, [], [])).status == DONE


async def test_stats_count_paths(make_kvcache, make_worker):
    kv = await make_kvcache()
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    hashes = chain(4)
    await store(kv, src, [0, 1, 2, 3], hashes)
    await load(kv, dst, hashes, [0, 1, 2, 3], path=kvcache_pb2.KV_READ_PATH_DE_READ)
    await load(kv, dst, hashes[:1], [0], path=kvcache_pb2.KV_READ_PATH_DE_READ)
    await load(kv, dst, hashes[:2], [0, 1], path=kvcache_pb2.KV_READ_PATH_PE_READ)
    stats = await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)
    paths = {p.path: (p.num_loads, p.bytes) for p in stats.paths}
    assert paths == {kvcache_pb2.KV_READ_PATH_PE_READ: (1, 2 * BPB), kvcache_pb2.KV_READ_PATH_DE_READ: (2, 5 * BPB)}
    assert list(stats.queues) == [] and stats.queue_depth == 0
    assert len(stats.tiers) == 1 and (stats.tiers[0].num_blocks, stats.tiers[0].used_bytes) == (4, 4 * BPB)


async def test_a_load_waiting_for_dram_shows_in_the_queue_and_ends_when_dram_frees(make_kvcache, make_worker,
                                                                                  tmp_path):
    kv = await make_kvcache(dram_blocks=2, disk_dir=tmp_path, disk_blocks=16)
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    hashes = chain(4)
    assert (await store(kv, src, [0, 1, 2, 3], hashes)).status == DONE
    held = await kv.store.take_slots(2)  # as a store in flight would: every DRAM block is busy
    assert await lookup(kv, hashes) == (4, 0, 4)

    async with anyio.create_task_group() as tg:
        results = []

        async def run_load():
            results.append(await load(kv, dst, hashes, [4, 5, 6, 7], path=kvcache_pb2.KV_READ_PATH_PE_READ))

        tg.start_soon(run_load)
        await anyio.sleep(0.3)
        stats = await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)
        assert [(q.agent_name, q.queued_loads, q.queued_bytes) for q in stats.queues] == [(dst.agent.name, 1, 4 * BPB)]
        assert stats.queue_depth == 1 and not results
        kv.store.release(held)
    (r,) = results
    assert (r.status, r.num_disk_blocks) == (DONE, 4), r.error
    assert torch.equal(dst.blocks([4, 5, 6, 7]), src.blocks([0, 1, 2, 3]))
    stats = await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)
    assert list(stats.queues) == [] and stats.queue_depth == 0
    kv.store.check_integrity()


async def test_a_load_that_cannot_get_dram_times_out(make_kvcache, make_worker, tmp_path):
    kv = await make_kvcache(dram_blocks=1, disk_dir=tmp_path, disk_blocks=16)
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    hashes = chain(2)
    await store(kv, src, [0, 1], hashes)
    held = await kv.store.take_slots(1)
    r = await kv.stub.Load(kvcache_pb2.LoadRequest(transfer_id="t", target=dst.endpoint(), block_hashes=hashes,
                                                   target_block_ids=[0, 1], timeout_ms=300), timeout=10)
    assert (r.status, r.num_blocks_loaded) == (common_pb2.TRANSFER_STATUS_TIMED_OUT, 0) and "DRAM" in r.error
    kv.store.release(held)
    kv.store.check_integrity()


async def test_kvcache_meets_a_worker_before_any_transfer_and_then_needs_no_metadata(make_kvcache, make_worker):
    kv = await make_kvcache()
    src, dst = await make_worker(seed=1), await make_worker(seed=2)
    assert kv.store.layout is None  # nothing stored yet
    reply = await kv.stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[src.endpoint(), dst.endpoint()]), timeout=30)
    assert list(reply.agent_names) == [src.agent.name, dst.agent.name] and kv.store.layout == LAYOUT
    again = await kv.stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[dst.endpoint()]), timeout=30)
    assert list(again.agent_names) == []
    assert sorted((await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)).nixl_peers) == \
        sorted([src.agent.name, dst.agent.name])
    # Met: a store and a load over NIXL without metadata or a gRPC address to fall back on.
    hashes = chain(2)
    source = src.endpoint(metadata=False)
    source.grpc_address = ""
    r = await kv.stub.Store(kvcache_pb2.StoreRequest(transfer_id="s", source=source, source_block_ids=[0, 1],
                                                     block_hashes=hashes, timeout_ms=20_000, transport=NIXL), timeout=30)
    assert r.status == DONE
    target = dst.endpoint(metadata=False)
    target.grpc_address = ""
    r = await kv.stub.Load(kvcache_pb2.LoadRequest(transfer_id="l", target=target, block_hashes=hashes,
                                                   target_block_ids=[3, 4], transport=NIXL), timeout=30)
    assert r.status == DONE and torch.equal(dst.blocks([3, 4]), src.blocks([0, 1]))


async def test_a_peer_kvcache_cannot_meet_says_why(make_kvcache, make_worker):
    kv = await make_kvcache()
    worker = await make_worker(seed=1)
    with pytest.raises(grpc.aio.AioRpcError, match="needs its agent_metadata") as err:
        await kv.stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[worker.endpoint(metadata=False)]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    other = await make_worker(seed=2, layout=KVLayout(2, 16, 2, 32, torch.float16))
    await kv.stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[worker.endpoint()]), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError, match="one kvcache serves one model and block size") as err:
        await kv.stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[other.endpoint()]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    off = await make_kvcache(nixl=False)
    with pytest.raises(grpc.aio.AioRpcError, match="no NIXL agent") as err:
        await off.stub.MeetPeers(common_pb2.MeetPeersRequest(peers=[worker.endpoint()]), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
