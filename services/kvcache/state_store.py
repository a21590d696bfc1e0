"""Recurrent states stored with the blocks they follow, for models with linear-attention layers (hybrids).

Such a model's cached KV blocks resume nothing alone: its linear layers need their state after exactly that
prefix. So a session's turn stores, with its full blocks, the state its worker saved after the last of them,
keyed by that block's hash (the hash chains every token before it, so one hash is one state), and a next turn
resumes from the longest stored prefix that ends in a state (``deepest``).

States live in host memory, within ``capacity_bytes`` of their own (a hybrid's state is one size per sequence,
tens of MiB for a large model, unlike a block; they are few). With a disk tier (``files``, within ``disk_bytes``)
the states memory makes room by go to disk (once: a state never changes, so a file stays valid and a state read
back into memory is clean), a load reads one back from its file (keeping it in memory again), ``flush`` writes
the rest at shutdown, and a restarted kvcache finds them (``recover``), as the block tiers do. Eviction is
least recently used first in each tier; a state whose block a Lookup pinned (``pinned``, the block store's
pins) is not dropped until the pin expires.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio.to_thread

from services.common.grpc_state import Layers, state_nbytes

if TYPE_CHECKING:
    from services.kvcache.state_files import StateFiles

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredState:
    num_tokens: int  # tokens the state took in: the blocks' before it
    layers: Layers

    @property
    def nbytes(self) -> int:
        return state_nbytes(self.layers)


class StateStore:
    def __init__(self, capacity_bytes: int, pinned: Callable[[int], bool] = lambda h: False,
                 files: StateFiles | None = None, disk_bytes: int = 0) -> None:
        if capacity_bytes < 0 or disk_bytes < 0:
            raise ValueError(f"state capacities must be >= 0 bytes, got {capacity_bytes} and {disk_bytes}")
        self.capacity_bytes = capacity_bytes
        self.files = files if disk_bytes else None
        self.disk_bytes = disk_bytes if files is not None else 0
        self._pinned = pinned
        self._states: OrderedDict[int, StoredState] = OrderedDict()  # block hash -> state, LRU first
        self._disk: OrderedDict[int, int] = OrderedDict()  # block hash -> file bytes, LRU first
        self.used_bytes = 0
        self.disk_used = 0
        self.num_evictions = 0  # from memory
        self.num_disk_evictions = 0

    def __len__(self) -> int:
        return len(self._states)

    @property
    def num_on_disk(self) -> int:
        return len(self._disk)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._states or block_hash in self._disk

    def deepest(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` (cached ones) a stored state follows: 0 when none does."""
        return next((k for k in range(len(hashes), 0, -1) if hashes[k - 1] in self), 0)

    async def put(self, block_hash: int, state: StoredState) -> bool:
        """Stores ``state`` after ``block_hash``'s block, making room in memory (the least recently used
        unpinned states go, to disk when there is a disk tier); straight to disk when memory cannot hold it.
        False when it fits in neither. A state stored already is touched, not replaced: the same hash is the
        same state."""
        if block_hash in self:
            self.touch(block_hash)
            return True
        if await self._insert(block_hash, state):
            return True
        return self.files is not None and await self._write(block_hash, state)

    async def get(self, block_hash: int) -> StoredState | None:
        """The state stored after ``block_hash``'s block (touched: a load is a use), read from disk when memory
        dropped it (and kept in memory again), or None."""
        state = self._states.get(block_hash)
        if state is not None:
            self.touch(block_hash)
            return state
        if block_hash not in self._disk or self.files is None:
            return None
        state = await anyio.to_thread.run_sync(self.files.read, block_hash)
        if state is None:  # the file failed its checks (deleted) or went meanwhile
            self.disk_used -= self._disk.pop(block_hash, 0)
            return None
        if block_hash in self._disk:  # a write making room on disk may have taken its file meanwhile
            self._disk.move_to_end(block_hash)
        await self._insert(block_hash, state)
        return state

    async def flush(self) -> int:
        """Writes every state held in memory alone to disk, least recently used first (when the disk fills, the
        newest win): what a restart then finds. Returns the number written."""
        if self.files is None:
            return 0
        dirty = [(h, s) for h, s in self._states.items() if h not in self._disk]
        with anyio.CancelScope(shield=True):
            written = [await self._write(h, s) for h, s in dirty]
        return sum(written)

    def recover(self) -> int:
        """Indexes the disk tier's state files (blocking I/O: call before serving), oldest first; deletes the
        oldest beyond the capacity. Returns the number indexed."""
        if self.files is None:
            return 0
        for f in self.files.scan():
            self._disk[f.block_hash] = f.nbytes
            self.disk_used += f.nbytes
        while self.disk_used > self.disk_bytes:
            h, nbytes = self._disk.popitem(last=False)
            self.disk_used -= nbytes
            self.files.delete(h)
            self.num_disk_evictions += 1
        return len(self._disk)

    @property
    def enabled(self) -> bool:
        """Whether states are kept at all (room in memory or on disk)."""
        return bool(self.capacity_bytes or self.disk_bytes)

    def touch(self, block_hash: int) -> None:
        """A use of a stored state (a load, a store of it again): it goes last in the LRU order."""
        for index in (self._states, self._disk):
            if block_hash in index:
                index.move_to_end(block_hash)

    async def _insert(self, block_hash: int, state: StoredState) -> bool:
        """``state`` in memory, the states that make room for it written to disk (those without a file) when
        there is a disk tier, else dropped; False when it cannot fit."""
        if block_hash in self._states:
            return True
        # With a disk tier a pinned state may make room too: it goes to disk, not away.
        victims = self._room(self._states, state.nbytes, self.capacity_bytes - self.used_bytes,
                             self.capacity_bytes, lambda s: s.nbytes, pins=self.files is None)
        if victims is None:
            return False
        gone = [(h, self._states.pop(h)) for h in victims]
        for _, old in gone:
            self.used_bytes -= old.nbytes
            self.num_evictions += 1
        self._states[block_hash] = state
        self.used_bytes += state.nbytes
        if self.files is not None:
            for h, old in gone:
                if h not in self._disk:
                    await self._write(h, old)
        return True

    async def _write(self, block_hash: int, state: StoredState) -> bool:
        """``state``'s file, making room on disk; False when it cannot fit or the write failed."""
        need = self.files.nbytes(state)
        victims = self._room(self._disk, need, self.disk_bytes - self.disk_used, self.disk_bytes, lambda n: n)
        if victims is None:
            return False
        for h in victims:
            self.disk_used -= self._disk.pop(h)
            self.num_disk_evictions += 1
        self.disk_used += need  # reserved while it is written
        try:
            await anyio.to_thread.run_sync(self._write_file, block_hash, state, victims)
        except OSError as exc:
            self.disk_used -= need
            log.warning("writing the state after block %016x failed (%s): it is not on disk", block_hash, exc)
            return False
        if block_hash in self._disk:  # the same state written by another call meanwhile: one file
            self.disk_used -= need
        self._disk[block_hash] = need
        return True

    def _write_file(self, block_hash: int, state: StoredState, victims: list[int]) -> None:
        for h in victims:
            self.files.delete(h)
        self.files.write(block_hash, state)

    def _room(self, index: OrderedDict, need: int, free: int, capacity: int, size,
              pins: bool = True) -> list[int] | None:
        """The least recently used entries of ``index`` (unpinned ones, with ``pins``) whose going frees ``need``
        bytes, or None."""
        if need > capacity:
            return None
        victims = []
        for h, entry in index.items():
            if free >= need:
                break
            if not (pins and self._pinned(h)):
                victims.append(h)
                free += size(entry)
        return victims if free >= need else None
