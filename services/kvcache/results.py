"""What the store hands out: tiers, lookups, staged load rounds and counters (plain data)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.kvcache.store import KVStore


class Tier(enum.IntEnum):
    """Storage tier; values match ``kvcache_pb2.StorageTier``."""

    DRAM = 1
    DISK = 2


@dataclass
class TierStats:
    capacity_bytes: int
    used_bytes: int = 0
    num_blocks: int = 0
    bytes_read: int = 0  # block bytes read from this tier by loads
    bytes_written: int = 0  # block bytes written by stores and promotions (DRAM) or demotions (disk)
    num_evictions: int = 0


@dataclass
class StoreStats:
    hit_blocks: int
    miss_blocks: int
    num_lookups: int
    num_corrupt: int  # disk blocks that failed their checks on read (deleted, served as misses)
    dram: TierStats
    disk: TierStats | None
    hit_dram_blocks: int = 0  # of hit_blocks, those a lookup found in DRAM
    hit_disk_blocks: int = 0  # ... and those found only on disk


@dataclass(frozen=True)
class LookupResult:
    num_cached: int
    num_dram: int
    num_disk: int
    num_state: int = 0  # leading blocks of num_cached a stored recurrent state follows (hybrids)


@dataclass
class Staged:
    """One round of a load, held in DRAM: ``slots[k]`` holds the block at position ``positions[k]`` of the
    load's hashes, found in ``tiers[k]``. ``limit``: the first position whose block is not (or no longer)
    cached; the load cannot go past it."""

    limit: int
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    tiers: list[Tier] = field(default_factory=list)

    def add(self, position: int, slot: int, tier: Tier) -> None:
        self.positions.append(position)
        self.slots.append(slot)
        self.tiers.append(tier)

    def sort_and_cut(self, store: KVStore) -> None:
        """Orders the round by position and releases what lies at or past the limit."""
        rows = sorted(zip(self.positions, self.slots, self.tiers, strict=True))
        store.release([s for p, s, _ in rows if p >= self.limit])
        rows = [r for r in rows if r[0] < self.limit]
        self.positions, self.slots, self.tiers = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
