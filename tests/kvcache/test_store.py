"""The tiered store without gRPC: indexes, eviction and promotion, pins, restart — and bytes that always match."""

from __future__ import annotations

import random

import anyio
import numpy as np
import pytest
import torch

from services.common.errors import InvalidArgument
from services.engine.kv_pool import KVLayout
from services.kvcache.disk_tier import DiskTier
from services.kvcache.results import Tier
from services.kvcache.state_store import StoredState
from services.kvcache.store import KVStore
from tests.kvcache.conftest import BPB, LAYOUT, chain

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
FILE = BPB + 64


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _bytes_of(h: int) -> np.ndarray:
    return np.random.default_rng(h % 2**32).integers(0, 256, BPB, dtype=np.uint8)


async def put(store: KVStore, hashes) -> int:
    """Stores blocks whose bytes derive from their hash, as a Store RPC would (in rounds)."""
    new = 0
    todo = [h for h in hashes if not store.present(h)]
    while todo:
        slots = await store.take_slots(len(todo))
        for h, s in zip(todo, slots, strict=False):
            np.copyto(np.frombuffer(store.view(s), dtype=np.uint8), _bytes_of(h))
        new += store.commit(todo[:len(slots)], slots)
        store.release(slots)
        todo = todo[len(slots):]
    return new


async def get(store: KVStore, hashes) -> tuple[int, list[Tier]]:
    """Loads like a Load RPC, checking every staged block's bytes; returns (leading blocks, their tiers)."""
    todo, limit, tiers = list(range(len(hashes))), len(hashes), {}
    while todo:
        staged = await store.stage(hashes, todo)
        limit = min(limit, staged.limit)
        for p, s, t in zip(staged.positions, staged.slots, staged.tiers, strict=True):
            assert np.array_equal(np.frombuffer(store.view(s), dtype=np.uint8), _bytes_of(hashes[p])), p
            tiers[p] = t
        store.release(staged.slots)
        todo = [i for i in todo if i < limit and i not in tiers]
    return limit, [tiers[i] for i in range(limit)]


def _store(tmp_path=None, dram_blocks=4, disk_blocks=0, **kw) -> KVStore:
    disk = DiskTier(tmp_path) if tmp_path is not None else None
    return KVStore(dram_blocks * BPB, disk, disk_blocks * FILE, LAYOUT, **kw)


async def test_lookup_is_the_longest_prefix_with_per_tier_counts(tmp_path):
    store = _store(tmp_path, dram_blocks=2, disk_blocks=8)
    hashes = chain(6)
    await put(store, hashes[:3] + hashes[4:])
    assert store.lookup(hashes).num_cached == 3
    r = store.lookup(hashes[:3])
    assert (r.num_cached, r.num_dram, r.num_disk) == (3, 0, 3)  # DRAM holds 2: the last two stored
    assert store.lookup(hashes[3:]).num_cached == 0
    r = store.lookup(hashes[4:])
    assert (r.num_cached, r.num_dram, r.num_disk) == (2, 2, 0)
    s = store.stats()
    assert (s.num_lookups, s.hit_blocks, s.miss_blocks) == (4, 8, 6 - 3 + 0 + 3)
    store.check_integrity()


async def test_a_lookup_counts_the_prefix_a_stored_state_follows_and_pins_it_with_the_blocks():
    clock = Clock()
    store = _store(dram_blocks=8, clock=clock, max_pin_s=5, state_bytes=200)
    hashes = chain(5)
    await put(store, hashes[:3])
    state = StoredState(32, [(b"c" * 50, b"s" * 50)])
    assert await store.states.put(hashes[1], state) and await store.states.put(hashes[4], state)
    r = store.lookup(hashes, pin_ms=1_000)
    assert (r.num_cached, r.num_state) == (3, 2)  # the state after block 4 follows blocks not cached
    assert store.lookup(hashes[:1]).num_state == 0
    assert await store.states.put(chain(1, prompt=1)[0], state)  # the unpinned state after block 4 makes room
    assert hashes[1] in store.states and hashes[4] not in store.states
    large = StoredState(48, [(b"c" * 75, b"s" * 75)])
    assert not await store.states.put(chain(1, prompt=2)[0], large)  # only the unpinned 100 bytes could go
    clock.now += 2
    assert await store.states.put(chain(1, prompt=2)[0], large)  # the pin expired
    assert len(store.states) == 1


async def test_blocks_survive_any_mix_of_stores_loads_evictions_and_promotions(tmp_path):
    rng = random.Random(7)
    store = _store(tmp_path, dram_blocks=5, disk_blocks=12)
    prompts = [chain(rng.randint(1, 6), prompt=p) for p in range(8)]
    for _ in range(150):
        hashes = rng.choice(prompts)
        if rng.random() < 0.5:
            await put(store, hashes)
        else:
            n, tiers = await get(store, hashes)
            assert n == store.lookup(hashes).num_cached or n == 0  # nothing else runs concurrently
        store.check_integrity()
    s = store.stats()
    assert s.dram.num_evictions > 0 and s.disk.num_evictions > 0 and s.disk.bytes_read > 0
    assert s.disk.used_bytes <= 12 * FILE and s.dram.num_blocks <= 5


async def test_a_load_larger_than_dram_runs_in_rounds_and_reports_lookup_tiers(tmp_path):
    store = _store(tmp_path, dram_blocks=4, disk_blocks=16)
    hashes = chain(10)
    assert await put(store, hashes) == 10
    r = store.lookup(hashes)
    assert (r.num_dram, r.num_disk) == (4, 6)
    n, tiers = await get(store, hashes)
    assert n == 10 and tiers == [Tier.DISK] * 6 + [Tier.DRAM] * 4  # DRAM hits go first, untouched by promotion
    store.check_integrity()


async def test_no_disk_tier_drops_lru_blocks_but_never_pinned_ones():
    clock = Clock()
    store = _store(dram_blocks=2, clock=clock, max_pin_s=5)
    a, b, c, d = chain(4)
    await put(store, [a, b])
    store.lookup([a], pin_ms=1_000)
    await put(store, [c])  # a is the LRU block but pinned: b goes
    assert [store.tier_of(h) for h in (a, b, c)] == [Tier.DRAM, None, Tier.DRAM]
    clock.now += 2
    await put(store, [d])  # the pin expired
    assert [store.tier_of(h) for h in (a, c, d)] == [None, Tier.DRAM, Tier.DRAM]
    assert store.stats().dram.num_evictions == 2


async def test_pinned_blocks_may_move_to_disk_but_are_not_deleted_there(tmp_path):
    clock = Clock()
    store = _store(tmp_path, dram_blocks=1, disk_blocks=2, clock=clock)
    hashes = chain(5)
    await put(store, hashes[:3])  # h0, h1 on disk, h2 in DRAM
    store.lookup(hashes[:1], pin_ms=100_000)  # clipped to max_pin_s (60 s)
    await put(store, hashes[3:])  # h0 pinned: h1 and h2 go
    assert store.tier_of(hashes[0]) is Tier.DISK
    clock.now += 61
    await put(store, chain(2, start=5))
    assert store.tier_of(hashes[0]) is None
    store.check_integrity()


async def test_a_store_that_cannot_get_dram_waits_or_returns_none():
    store = _store(dram_blocks=2)
    held = await store.take_slots(2)
    assert await store.take_slots(1, wait=False) == []
    store.release(held)
    assert len(await store.take_slots(3, wait=False)) == 2


async def test_recover_rebuilds_the_index_adopts_the_layout_and_trims_to_capacity(tmp_path):
    store = _store(tmp_path, dram_blocks=4, disk_blocks=16)
    hashes = chain(8)
    await put(store, hashes)
    assert await store.flush() == 4 and store.stats().disk.num_blocks == 8

    again = KVStore(4 * BPB, DiskTier(tmp_path), 16 * FILE)  # no layout: taken from the files
    assert again.recover() == 8 and again.layout == LAYOUT
    assert (await get(again, hashes))[0] == 8

    small = KVStore(4 * BPB, DiskTier(tmp_path), 5 * FILE, LAYOUT)  # restarted with less disk: oldest go
    assert small.recover() == 5 and small.stats().disk.used_bytes == 5 * FILE
    assert len(list((tmp_path / "blocks").rglob("*.kv"))) == 5

    other = KVStore(4 * BPB, DiskTier(tmp_path), 16 * FILE, KVLayout(2, 32, 2, 16, torch.float16))
    assert other.recover() == 0 and not list((tmp_path / "blocks").rglob("*.kv"))


async def test_layouts_are_fixed_once_and_must_fit_dram():
    store = KVStore(3 * BPB)
    assert store.layout is None and store.lookup(chain(2)).num_cached == 0
    with pytest.raises(InvalidArgument, match="holds no block"):
        store.ensure_layout(KVLayout(2, 64, 2, 16, torch.float16), "the source")
    store.ensure_layout(LAYOUT, "the source")
    assert store.num_slots == 3
    with pytest.raises(InvalidArgument, match="the target has KV layout .* but this kvcache holds"):
        store.ensure_layout(KVLayout(2, 16, 2, 16, torch.bfloat16), "the target")


async def test_concurrent_stores_and_loads_through_a_tiny_dram_neither_deadlock_nor_mix_bytes(tmp_path):
    store = _store(tmp_path, dram_blocks=3, disk_blocks=10)
    prompts = [chain(5, prompt=p) for p in range(6)]

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            hashes = rng.choice(prompts)
            if rng.random() < 0.5:
                await put(store, hashes)
            else:
                await get(store, hashes)  # checks the bytes of every block it stages
            await anyio.sleep(0)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for seed in range(6):
                tg.start_soon(client, seed)
    store.check_integrity()
    assert store._num_held == 0 and not store._reading


async def test_an_attention_free_layout_keeps_block_hashes_and_the_states_they_key():
    """An attention-free model's blocks hold no bytes: the DRAM tier keeps up to ATTENTION_FREE_MAX_BLOCKS of
    their hashes whatever its bytes, blocks store and load (moving nothing), and the state after the last one
    is found with them."""
    from services.engine.kv_pool import ATTENTION_FREE_MAX_BLOCKS

    empty = KVLayout(num_layers=0, block_size=16, num_kv_heads=1, head_dim=64, dtype=torch.float32)
    store = KVStore(1, layout=empty, state_bytes=200)
    assert empty.bytes_per_block == 0 and store.num_slots == ATTENTION_FREE_MAX_BLOCKS
    hashes = chain(6)
    slots = await store.take_slots(4)  # a Store: its slots take nothing from the worker
    assert len(slots) == 4 and all(len(store.view(s)) == 0 for s in slots)
    assert store.commit(hashes[:4], slots) == 4
    store.release(slots)
    assert await store.states.put(hashes[3], StoredState(64, [(b"c" * 50, b"s" * 50)]))
    r = store.lookup(hashes)
    assert (r.num_cached, r.num_dram, r.num_state) == (4, 4, 4)
    staged = await store.stage(hashes, list(range(4)))
    assert staged.positions == [0, 1, 2, 3] and staged.tiers == [Tier.DRAM] * 4
    store.release(staged.slots)
    store.check_integrity()
