"""The tiered block store: a DRAM tier (a block-major host pool) over a disk tier, keyed by chained block hash.

The indexes live here and change only on the event loop's thread; bytes move in worker threads (disk I/O) or
by the caller's transfer (NIXL, gRPC) into and out of DRAM slots the caller holds::

    slots = await store.take_slots(n)          # Store: free DRAM slots, held by the caller
    ... pull the worker's blocks into slots ...
    store.commit(hashes, slots); store.release(slots)

    staged = await store.stage(hashes, todo)   # Load, one round: DRAM hits, then disk ones read in
    ... write staged.slots into the worker's blocks at staged.positions ...
    store.release(staged.slots)

Terms. A *slot* is one block of the DRAM pool. It is *held* while its refs > 0 (a transfer reads or fills it,
or it is being written to disk): a held slot is never evicted or reused. An *indexed* slot holds a cached
block (``_dram[hash] == slot``); a held slot may also be unindexed (fresh bytes of a store not yet committed, a
duplicate promotion). A DRAM block is *clean* when the disk tier also has it, so evicting it writes nothing.

Invariants (``check_integrity``):
  * every slot is exactly one of: free (in ``_free``, refs 0) | indexed | held and unindexed;
  * ``_slot_hash[s] == h`` ⇔ ``_dram[h] == s``;
  * ``disk_used`` is the sum of the disk index's file sizes, and ``disk_used + reserved ≤ disk capacity``.

Movement. DRAM eviction (when ``take_slots`` finds no free slot) takes the least recently used unheld block,
writes it to disk unless it is clean (demotion) and reuses its slot; with no disk tier, or no room there, the
block is dropped. Disk eviction (to make room for a demotion) deletes the least recently used file that is
neither pinned nor being read. A disk hit is read into a DRAM slot and indexed there (promotion); the file
stays, so the block is clean. Loads and stores touch what they use (LRU); lookups do not.

Pins. ``lookup(pin_ms=...)`` pins the matched prefix: a pinned block is not deleted from the store until the
pin expires — disk eviction skips it, and DRAM eviction skips it when it cannot be written to disk. A pinned
block may still move from DRAM to disk.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import anyio
import anyio.to_thread
import numpy as np
import torch

from services.common.errors import InvalidArgument
from services.engine.kv_pool import ATTENTION_FREE_MAX_BLOCKS, KVLayout, PagedKVPool
from services.kvcache.disk_tier import DiskTier, ReadStatus, file_bytes
from services.kvcache.layout import describe
from services.kvcache.results import LookupResult, Staged, StoreStats, Tier, TierStats
from services.kvcache.state_files import StateFiles
from services.kvcache.state_store import StateStore

log = logging.getLogger(__name__)

_FLUSH_BATCH = 64  # blocks per disk write-back batch at shutdown
_SLOT_POLL_S = 0.05  # how often a waiter for a DRAM slot looks again (pins expire without an event)
_PIN_SWEEP_S = 1.0


class KVStore:
    """DRAM tier of ``dram_bytes`` over an optional disk tier of ``disk_bytes``; one KV layout for all blocks.

    The layout is given here or fixed later by ``ensure_layout`` (the first Store) or ``recover`` (the disk).
    """

    def __init__(self, dram_bytes: int, disk: DiskTier | None = None, disk_bytes: int = 0,
                 layout: KVLayout | None = None, max_pin_s: float = 60.0, io_threads: int = 4,
                 clock: Callable[[], float] = time.monotonic, state_bytes: int = 0,
                 state_disk_bytes: int = 0) -> None:
        self.dram_bytes = dram_bytes
        self.disk = disk
        self.disk_bytes = disk_bytes if disk is not None else 0
        self.max_pin_s = max_pin_s
        self._io = ThreadPoolExecutor(io_threads, thread_name_prefix="kvcache-io") if disk is not None else None
        self._clock = clock
        self.layout: KVLayout | None = None
        self.pool: PagedKVPool | None = None  # the DRAM tier, once the layout is known
        self._flat: np.ndarray | None = None  # pool as [num_slots, bytes_per_block] uint8 (a view)
        self._dram: OrderedDict[int, int] = OrderedDict()  # hash -> slot, least recently used first
        self._slot_hash: list[int | None] = []
        self._refs: list[int] = []
        self._num_held = 0  # slots with refs > 0
        self._free: list[int] = []
        self._disk: OrderedDict[int, int] = OrderedDict()  # hash -> file bytes, least recently used first
        self._disk_used = 0
        self._disk_reserved = 0  # bytes of demotions being written
        self._reading: Counter[int] = Counter()  # disk blocks being read: never evicted meanwhile
        self._pins: dict[int, float] = {}  # hash -> expiry (clock seconds)
        self._last_sweep = 0.0
        self._released: anyio.Event | None = None
        self._hits = self._misses = self._lookups = self._corrupt = 0
        self._hits_dram = self._hits_disk = 0
        self._dram_io = TierStats(dram_bytes)
        # Hybrids' recurrent states, each after the block whose hash keys it; kept while that block is pinned.
        # With a disk tier, also written to its state files (state_files.py).
        files = StateFiles(disk.root) if disk is not None and state_disk_bytes else None
        self.states = StateStore(state_bytes, self._pinned, files, state_disk_bytes)
        self._disk_io = TierStats(self.disk_bytes)
        if layout is not None:
            self.ensure_layout(layout, "the configured layout")

    # ---- layout ------------------------------------------------------------------------------------------

    def ensure_layout(self, layout: KVLayout, what: str) -> None:
        """Fixes the layout if none is set (allocating the DRAM tier), else checks ``layout`` is it.
        InvalidArgument names ``what`` when it differs or when no block of it fits in DRAM."""
        if self.layout is not None:
            if layout != self.layout:
                raise InvalidArgument(f"{what} has KV layout {describe(layout)}, but this kvcache holds "
                                      f"{describe(self.layout)}; one kvcache serves one model and block size")
            return
        # An attention-free model's blocks hold no bytes: the tier keeps their hashes, which key its states.
        num_slots = (self.dram_bytes // layout.bytes_per_block if layout.bytes_per_block
                     else ATTENTION_FREE_MAX_BLOCKS)
        if num_slots < 1:
            raise InvalidArgument(f"the DRAM tier ({self.dram_bytes} bytes) holds no block of {describe(layout)}; "
                                  "raise --dram-bytes")
        self.pool = PagedKVPool(layout, num_slots, 0, torch.device("cpu"), zeroed=False)  # slots are stored before read
        self._flat = self.pool.device_kv.view(torch.uint8).reshape(num_slots, layout.bytes_per_block).numpy()
        self._slot_hash = [None] * num_slots
        self._refs = [0] * num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.layout = layout
        log.info("kvcache layout: %s; DRAM tier %d blocks", describe(layout), num_slots)

    @property
    def num_slots(self) -> int:
        return len(self._refs)

    # ---- restart -----------------------------------------------------------------------------------------

    def recover(self) -> int:
        """Rebuilds the disk index from the block files, and the state store's from its files (blocking I/O:
        call before serving). Adopts the newest file's layout when none is set; deletes files of another layout,
        and the oldest beyond capacity. Returns the number of blocks indexed."""
        if self.disk is None:
            return 0
        files, _ = self.disk.scan()
        if self.layout is None and files:
            self.ensure_layout(files[-1].layout, "the disk tier")
        for f in files:
            if f.layout != self.layout:
                log.warning("block file %016x has layout %s, not %s: deleted", f.block_hash, describe(f.layout),
                            describe(self.layout))
                self.disk.delete(f.block_hash)
                continue
            self._disk[f.block_hash] = f.nbytes
            self._disk_used += f.nbytes
        while self._disk_used > self.disk_bytes:
            h, nbytes = self._disk.popitem(last=False)
            self._disk_used -= nbytes
            self.disk.delete(h)
            self._disk_io.num_evictions += 1
        states = self.states.recover()
        log.info("disk tier: %d blocks (%d bytes) and %d recurrent states (%d bytes) recovered from %s",
                 len(self._disk), self._disk_used, states, self.states.disk_used, self.disk.root)
        return len(self._disk)

    # ---- lookups -----------------------------------------------------------------------------------------

    def lookup(self, hashes: Sequence[int], pin_ms: int = 0) -> LookupResult:
        """The longest prefix of ``hashes`` held in any tier; pins it for ``pin_ms`` (clipped to the max)."""
        now = self._clock()
        num_dram = num_disk = 0
        for h in hashes:
            if h in self._dram:
                num_dram += 1
            elif h in self._disk:
                num_disk += 1
            else:
                break
        n = num_dram + num_disk
        if pin_ms and n:
            expiry = now + min(pin_ms / 1e3, self.max_pin_s)
            for h in hashes[:n]:
                self._pins[h] = max(self._pins.get(h, 0.0), expiry)
        if now - self._last_sweep > _PIN_SWEEP_S:
            self._pins = {h: t for h, t in self._pins.items() if t > now}
            self._last_sweep = now
        self._lookups += 1
        self._hits += n
        self._hits_dram += num_dram
        self._hits_disk += num_disk
        self._misses += len(hashes) - n
        return LookupResult(n, num_dram, num_disk, self.states.deepest(hashes[:n]))

    def present(self, block_hash: int) -> bool:
        """Whether the block is held in any tier; touches it (a store of a present block counts as a use)."""
        for index in (self._dram, self._disk):
            if block_hash in index:
                index.move_to_end(block_hash)
                return True
        return False

    def _pinned(self, h: int) -> bool:
        expiry = self._pins.get(h)
        if expiry is None:
            return False
        if expiry > self._clock():
            return True
        del self._pins[h]
        return False

    # ---- holding DRAM slots --------------------------------------------------------------------------------

    async def take_slots(self, n: int, wait: bool = True) -> list[int]:
        """Up to ``n`` DRAM slots for the caller to fill, held (refs 1) and unindexed: free ones first, then
        ones freed by evicting LRU blocks. With ``wait``, waits until at least one is available (bound it with
        the caller's deadline); without, may return none."""
        self._require_layout()
        got: list[int] = []
        try:
            while True:
                while self._free and len(got) < n:
                    s = self._free.pop()
                    self._hold(s)
                    got.append(s)
                while len(got) < n:
                    more = await self._evict(n - len(got))
                    if more is None:
                        break
                    got += more
                if got or not wait or n == 0:
                    return got
                await self._wait_release()
        except BaseException:
            self.release(got)
            raise

    def release(self, slots: Sequence[int]) -> None:
        """Drops the caller's hold on ``slots``; an unindexed slot nobody holds is free again."""
        for s in slots:
            if self._unhold(s) == 0 and self._slot_hash[s] is None:
                self._free.append(s)
        if slots and self._released is not None:
            self._released.set()
            self._released = None

    def _hold(self, s: int) -> None:
        if not self._refs[s]:
            self._num_held += 1
        self._refs[s] += 1

    def _unhold(self, s: int) -> int:
        assert self._refs[s] > 0, f"slot {s} released more often than held"
        self._refs[s] -= 1
        if not self._refs[s]:
            self._num_held -= 1
        return self._refs[s]

    async def _wait_release(self) -> None:
        if self._released is None:
            self._released = anyio.Event()
        with anyio.move_on_after(_SLOT_POLL_S):
            await self._released.wait()

    def view(self, slot: int) -> memoryview:
        """The bytes of one DRAM slot (writable)."""
        assert self._flat is not None
        return memoryview(self._flat[slot])

    # ---- stores ------------------------------------------------------------------------------------------

    def commit(self, hashes: Sequence[int], slots: Sequence[int]) -> int:
        """Indexes filled slots under their hashes (the caller still holds them: release after). A hash
        already held stays as it is and its slot is freed on release. Returns the number newly indexed."""
        new = 0
        for h, s in zip(hashes, slots, strict=True):
            if h in self._dram or h in self._disk or self._slot_hash[s] is not None:
                continue
            self._dram[h] = s
            self._slot_hash[s] = h
            self._dram_io.bytes_written += self.layout.bytes_per_block
            new += 1
        return new

    # ---- loads -------------------------------------------------------------------------------------------

    async def stage(self, hashes: Sequence[int], todo: Sequence[int]) -> Staged:
        """Holds in DRAM some of the blocks at positions ``todo`` (ascending) of ``hashes``, for one round of a
        load: every DRAM hit among them first, then disk hits, in order, read into free or evicted slots
        (promoted) — as many as can be held at once. ``limit`` is the first position whose block is not
        cached (or whose file failed its checks); no position from it on is staged. Waits while nothing
        below the limit can be held. The caller releases ``staged.slots``."""
        while True:
            staged, reads = self._hold_round(hashes, todo)
            if reads:
                await self._read_into_slots(staged, hashes, reads)
            if staged.positions or not todo or staged.limit <= todo[0]:
                bpb = self.layout.bytes_per_block if self.layout is not None else 0
                self._dram_io.bytes_read += bpb * staged.tiers.count(Tier.DRAM)
                self._disk_io.bytes_read += bpb * staged.tiers.count(Tier.DISK)
                return staged
            await self._wait_release()

    def _hold_round(self, hashes: Sequence[int], todo: Sequence[int]) -> tuple[Staged, list[int]]:
        """Holds the round's DRAM hits and marks its disk hits as being read (their positions are returned;
        their slots come later). Each block of a round needs a slot nobody else holds — its own (a DRAM hit)
        or one to evict (a disk hit) — so the round never waits for itself."""
        staged = Staged(limit=len(hashes))
        if not todo:
            return staged, []
        self._require_layout()
        in_dram: list[int] = []
        on_disk: list[int] = []
        for i in todo:
            if hashes[i] in self._dram:
                in_dram.append(i)
            elif hashes[i] in self._disk:
                on_disk.append(i)
            else:
                staged.limit = i
                break
        budget = self.num_slots - self._num_held
        for i in in_dram:
            slot = self._dram[hashes[i]]
            if not self._refs[slot]:
                if budget == 0:
                    continue
                budget -= 1
            self._hold(slot)
            self._dram.move_to_end(hashes[i])
            staged.add(i, slot, Tier.DRAM)
        reads = on_disk[:budget]
        for i in reads:
            self._disk.move_to_end(hashes[i])
            self._reading[hashes[i]] += 1
        return staged, reads

    async def _read_into_slots(self, staged: Staged, hashes: Sequence[int], reads: list[int]) -> None:
        """Gets slots for the round's disk blocks (at positions ``reads``), reads them in and promotes them.
        Blocks that got no slot wait for a later round; one that failed its read lowers the limit."""
        got: list[int] = []
        try:
            got = await self.take_slots(len(reads), wait=False)
            with anyio.CancelScope(shield=True):  # the index must learn what the threads did
                items = [(hashes[i], s) for i, s in zip(reads, got, strict=False)]
                statuses = await anyio.to_thread.run_sync(self._read_files, items)
        except BaseException:
            for i in reads:
                self._done_reading(hashes[i])
            self.release(got)
            self.release(staged.slots)
            raise
        for k, i in enumerate(reads):
            h = hashes[i]
            self._done_reading(h)
            if k >= len(got):
                continue
            if statuses[k] is ReadStatus.OK:
                self._promote(h, got[k])
            else:
                self._forget_disk(h, corrupt=statuses[k] is ReadStatus.CORRUPT)
                staged.limit = min(staged.limit, i)
            staged.add(i, got[k], Tier.DISK)
        staged.sort_and_cut(self)

    def _read_files(self, items: list[tuple[int, int]]) -> list[ReadStatus]:
        """Reads block files into slots, ``io_threads`` at a time (a deeper disk queue: cold reads of 512 KiB
        files ran ~2x faster with 8 than with 1 here)."""
        assert self.disk is not None and self.layout is not None and self._io is not None
        return list(self._io.map(lambda item: self.disk.read_into(item[0], self.layout, self.view(item[1])),
                                 items))

    def _done_reading(self, h: int) -> None:
        self._reading[h] -= 1
        if not self._reading[h]:
            del self._reading[h]

    def _promote(self, h: int, slot: int) -> None:
        self._dram_io.bytes_written += self.layout.bytes_per_block
        if h in self._dram:  # promoted meanwhile by another load: this slot is a private copy
            return
        self._dram[h] = slot
        self._slot_hash[slot] = h

    def _forget_disk(self, h: int, corrupt: bool) -> None:
        nbytes = self._disk.pop(h, None)
        if nbytes is not None:
            self._disk_used -= nbytes
        if corrupt:
            self._corrupt += 1

    # ---- eviction ------------------------------------------------------------------------------------------

    async def _evict(self, k: int) -> list[int] | None:
        """Frees up to ``k`` slots by evicting LRU blocks (demoting dirty ones); returns them held by the
        caller, or None when no block can be evicted now."""
        victims = self._pick_victims(k)
        if not victims:
            return None
        try:
            with anyio.CancelScope(shield=True):
                await self._write_back([(h, s) for h, s in victims if h not in self._disk])
        finally:
            got = []
            for h, s in victims:
                if self._unhold(s) or (h not in self._disk and self._pinned(h)):
                    continue  # held by a load meanwhile, or pinned and not on disk: it stays
                del self._dram[h]
                self._slot_hash[s] = None
                self._hold(s)
                self._dram_io.num_evictions += 1
                got.append(s)
        return got

    def _pick_victims(self, k: int) -> list[tuple[int, int]]:
        """Up to ``k`` LRU DRAM blocks nobody holds (held now, for the write-back), skipping pinned ones that
        could not go to disk."""
        can_demote = self.disk is not None and file_bytes(self.layout) <= self.disk_bytes
        victims = []
        for h, s in self._dram.items():
            if len(victims) == k:
                break
            if self._refs[s] or (not can_demote and h not in self._disk and self._pinned(h)):
                continue
            victims.append((h, s))
        for _, s in victims:
            self._hold(s)
        return victims

    async def _write_back(self, blocks: list[tuple[int, int]]) -> None:
        """Writes held DRAM blocks to disk, LRU first, as many as the disk can make room for; indexes them
        there. Blocks that do not fit, or whose write fails, stay DRAM-only."""
        if not blocks or self.disk is None:
            return
        size = file_bytes(self.layout)
        deleted = self._make_disk_room(len(blocks) * size)
        fit = max(0, (self.disk_bytes - self._disk_used - self._disk_reserved) // size)
        todo = blocks[:fit]
        self._disk_reserved += len(todo) * size
        try:
            results = await anyio.to_thread.run_sync(self._write_files, deleted, todo)
        finally:
            self._disk_reserved -= len(todo) * size
        for (h, _), result in zip(todo, results, strict=True):
            if isinstance(result, Exception):
                log.error("cannot write block %016x to the disk tier: %s", h, result)
                continue
            assert h not in self._disk, f"block {h:016x} was written to disk twice"
            self._disk[h] = result
            self._disk_used += result
            self._disk_io.bytes_written += self.layout.bytes_per_block

    def _make_disk_room(self, need: int) -> list[int]:
        """Drops LRU disk blocks (not pinned, not being read) from the index until ``need`` more bytes fit or
        none is left to drop; returns their hashes (the files are deleted by the caller's thread)."""
        excess = self._disk_used + self._disk_reserved + need - self.disk_bytes
        deleted: list[int] = []
        for h, nbytes in self._disk.items():  # LRU first; stops as soon as enough is found
            if excess <= 0:
                break
            if not self._reading[h] and not self._pinned(h):
                deleted.append(h)
                excess -= nbytes
        for h in deleted:
            self._disk_used -= self._disk.pop(h)
        self._disk_io.num_evictions += len(deleted)
        return deleted

    def _write_files(self, deleted: list[int], blocks: list[tuple[int, int]]) -> list[int | Exception]:
        assert self.disk is not None and self.layout is not None
        for h in deleted:
            self.disk.delete(h)

        def write(item: tuple[int, int]) -> int | Exception:
            try:
                return self.disk.write(item[0], self.layout, self.view(item[1]))
            except OSError as e:
                return e

        return list(self._io.map(write, blocks))

    async def flush(self) -> int:
        """Writes every DRAM block without a disk copy to disk, least recently used first (when the disk
        fills, the newest win). Returns the number of blocks written."""
        if self.disk is None or self.layout is None:
            return 0
        states = await self.states.flush()
        if states:
            log.info("wrote %d memory-only recurrent states to the disk tier", states)
        before = len(self._disk)
        dirty = [(h, s) for h, s in self._dram.items() if h not in self._disk and not self._refs[s]]
        for i in range(0, len(dirty), _FLUSH_BATCH):
            batch = [(h, s) for h, s in dirty[i:i + _FLUSH_BATCH] if self._dram.get(h) == s and not self._refs[s]]
            for _, s in batch:
                self._hold(s)
            try:
                with anyio.CancelScope(shield=True):
                    await self._write_back(batch)
            finally:
                self.release([s for _, s in batch])
        return len(self._disk) - before

    def close(self) -> None:
        """Stops the disk I/O threads (after the store's last use)."""
        if self._io is not None:
            self._io.shutdown(wait=True)

    # ---- accounting --------------------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        bpb = self.layout.bytes_per_block if self.layout is not None else 0
        dram = TierStats(**{**vars(self._dram_io), "used_bytes": len(self._dram) * bpb,
                            "num_blocks": len(self._dram)})
        disk = None
        if self.disk is not None:
            disk = TierStats(**{**vars(self._disk_io), "used_bytes": self._disk_used, "num_blocks": len(self._disk)})
        return StoreStats(self._hits, self._misses, self._lookups, self._corrupt, dram, disk, self._hits_dram,
                          self._hits_disk)

    def tier_of(self, block_hash: int) -> Tier | None:
        """Where a block is held (DRAM wins when both tiers have it); None when not held."""
        if block_hash in self._dram:
            return Tier.DRAM
        return Tier.DISK if block_hash in self._disk else None

    def check_integrity(self) -> None:
        """Asserts the invariants of the module docstring (tests call it)."""
        free = set(self._free)
        assert len(free) == len(self._free), "a slot is free twice"
        for s in range(self.num_slots):
            h = self._slot_hash[s]
            assert (s in free) + (h is not None) + (h is None and self._refs[s] > 0) == 1, f"slot {s} state"
            assert s not in free or self._refs[s] == 0, f"free slot {s} is held"
            assert h is None or self._dram.get(h) == s, f"slot {s} names block {h} but the index disagrees"
        assert all(self._slot_hash[s] == h for h, s in self._dram.items()), "DRAM index names a wrong slot"
        assert self._num_held == sum(1 for r in self._refs if r), "held slot count is off"
        assert self._disk_used == sum(self._disk.values()), "disk bytes do not add up"
        assert self._disk_used + self._disk_reserved <= self.disk_bytes or not self._disk, "disk over capacity"

    def _require_layout(self) -> None:
        if self.layout is None:
            raise InvalidArgument("this kvcache holds no block yet and has no KV layout: Store blocks first")
