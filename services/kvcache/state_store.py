"""Recurrent states stored with the blocks they follow, for models with linear-attention layers (hybrids).

Such a model's cached KV blocks resume nothing alone: its linear layers need their state after exactly that
prefix. So a session's turn stores, with its full blocks, the state its worker saved after the last of them,
keyed by that block's hash (the hash chains every token before it, so one hash is one state), and a next turn
resumes from the longest stored prefix that ends in a state (``deepest``).

States live in host memory, within ``capacity_bytes`` of their own (a hybrid's state is one size per sequence,
tens of MiB for a large model, unlike a block; they are few). Eviction is least recently used first; a state
whose block a Lookup pinned (``pinned``, the block store's pins) stays until the pin expires.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.grpc_state import Layers, state_nbytes


@dataclass(frozen=True)
class StoredState:
    num_tokens: int  # tokens the state took in: the blocks' before it
    layers: Layers

    @property
    def nbytes(self) -> int:
        return state_nbytes(self.layers)


class StateStore:
    def __init__(self, capacity_bytes: int, pinned: Callable[[int], bool] = lambda h: False) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"state capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._pinned = pinned
        self._states: OrderedDict[int, StoredState] = OrderedDict()  # block hash -> state, LRU first
        self.used_bytes = 0
        self.num_evictions = 0

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._states

    def deepest(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` (cached ones) a stored state follows: 0 when none does."""
        return next((k for k in range(len(hashes), 0, -1) if hashes[k - 1] in self._states), 0)

    def put(self, block_hash: int, state: StoredState) -> bool:
        """Stores ``state`` after ``block_hash``'s block, evicting least recently used unpinned states to make
        room; False when it cannot fit (larger than the capacity, or the rest is pinned). A state stored
        already is touched, not replaced: the same hash is the same state."""
        if block_hash in self._states:
            self._states.move_to_end(block_hash)
            return True
        need = state.nbytes
        if need > self.capacity_bytes:
            return False
        victims, free = [], self.capacity_bytes - self.used_bytes
        for h, old in self._states.items():
            if free >= need:
                break
            if not self._pinned(h):
                victims.append(h)
                free += old.nbytes
        if free < need:
            return False
        for h in victims:
            self.used_bytes -= self._states.pop(h).nbytes
            self.num_evictions += 1
        self._states[block_hash] = state
        self.used_bytes += need
        return True

    def get(self, block_hash: int) -> StoredState | None:
        """The state stored after ``block_hash``'s block (touched: a load is a use), or None."""
        state = self._states.get(block_hash)
        if state is not None:
            self._states.move_to_end(block_hash)
        return state
