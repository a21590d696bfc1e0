"""The slots a worker keeps saved recurrent states in for prefix caching (state_checkpoints.py has what they are
for): ``capacity`` on the device, where steps save them, and ``host_capacity`` more in host memory, where the
device's least recently used ones go when a save needs their slot (as vLLM and SGLang offload KV to the CPU: a
hybrid's state is tens of MiB a sequence, and device memory is the KV pool's). A sequence resumes from either:
the worker copies the state into its own slot. Slots are numbered across both, the device's first.

A checkpoint is keyed by the hash of the block it ends, so the same hash is the same state, and counts once the
step saving it ran (``confirm``). Eviction is least recently used first, in one order over both tiers. A
checkpoint another worker is reading (services/scheduler/peer_prefix.py) is pinned, and one the plan being built
saves, or a sequence of it resumes from, is held until the plan is done (``end_plan``): neither is evicted or
replaced meanwhile (a plan with more saves than free slots skips the rest). The worker applies a plan's moves to host memory before it adds the plan's sequences, so a sequence
may resume from a state the same plan moved.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence


class StateCheckpoints:
    def __init__(self, capacity: int, host_capacity: int = 0) -> None:
        if capacity < 0 or host_capacity < 0:
            raise ValueError(f"state checkpoint capacities must be >= 0, got {capacity} and {host_capacity}")
        self.capacity, self.host_capacity = capacity, host_capacity
        # Block hash (or (request, block index) until it is known) -> slot, least recently used first.
        self._slot_of: OrderedDict[Hashable, int] = OrderedDict()
        self._ready: set[int] = set()  # hashes whose blocks are cached
        self._free = list(range(capacity - 1, -1, -1))
        self._host_free = list(range(capacity + host_capacity - 1, capacity - 1, -1))
        self._pins: Counter[Hashable] = Counter()  # checkpoints being read by another worker
        self._taken: set[Hashable] = set()  # checkpoints the plan being built saves or resumes from
        self._moves: list[tuple[int, int]] = []  # (device slot, host slot) copies the plan being built makes

    def __len__(self) -> int:
        return len(self._ready)

    @property
    def num_on_host(self) -> int:
        return sum(1 for key in self._ready if self._slot_of[key] >= self.capacity)

    def covered(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` (cached blocks) a saved state resumes after (no side effects:
        what routing estimates)."""
        return next((k for k in range(len(hashes), 0, -1) if hashes[k - 1] in self._ready), 0)

    def deepest(self, hashes: Sequence[int]) -> tuple[int, int | None]:
        """The longest prefix of ``hashes`` (cached blocks) ending in a saved state: (its blocks, the state's
        slot), or (0, None). Marks the checkpoint used, and holds it until ``end_plan``."""
        k = self.covered(hashes)
        if not k:
            return 0, None
        self._slot_of.move_to_end(hashes[k - 1])
        self._taken.add(hashes[k - 1])
        return k, self._slot_of[hashes[k - 1]]

    def assign(self, block_hash: Hashable, cold: bool = False) -> int | None:
        """The device slot a step saves the state ending in ``block_hash``'s block into, making room when none
        is free (the least recently used device checkpoint goes to host memory, or is dropped); None when there
        are no slots, or it is saved already. A checkpoint assigned but not confirmed (its request left before
        its step) is assigned again: the same prefix saves the same state. ``cold``: it is the next to go (until
        it is used), not the last."""
        if not self.capacity or block_hash in self._ready:
            return None
        if block_hash in self._slot_of:
            return self._slot_of[block_hash]
        slot = self._free.pop() if self._free else self._evict_device()
        if slot is None:  # every slot is being read: this state is not saved
            return None
        self._slot_of[block_hash] = slot
        self._taken.add(block_hash)  # two saves of one plan in one slot: whichever the worker writes last wins
        if cold:
            self._slot_of.move_to_end(block_hash, last=False)
        return slot

    def replace(self, old: Hashable | None, block_hash: Hashable) -> int | None:
        """``assign`` for a request's newest state in place of its ``old`` one (released first, so that it makes
        the room rather than another's); None, and ``old`` kept, when ``block_hash``'s state is saved already."""
        if not self.capacity or block_hash in self._ready:
            return None
        if old is not None and old != block_hash and old in self._slot_of and not self._held(old):
            self._ready.discard(old)
            self._release(self._slot_of.pop(old))
        return self.assign(block_hash)

    def bind(self, key: Hashable, block_hash: int) -> None:
        """The checkpoint held under ``key`` (request, block index) ends in ``block_hash``'s block."""
        slot = self._slot_of.pop(key, None)
        if slot is None:
            return
        if block_hash in self._slot_of:  # saved by another request meanwhile: one copy is enough
            self._release(slot)
        else:
            self._slot_of[block_hash] = slot

    def confirm(self, block_hash: int) -> None:
        """The step that saved the state ending in ``block_hash``'s block ran: later requests may take it."""
        if block_hash in self._slot_of:
            self._ready.add(block_hash)

    def lend(self, block_hash: int) -> int:
        """The slot of the saved state ending in ``block_hash``'s block, kept there (pinned) while another worker
        reads it, until ``unpin``; marks it used."""
        if block_hash not in self._ready:
            raise ValueError(f"no saved state ends in block {block_hash:#x}")
        self._slot_of.move_to_end(block_hash)
        self._pins[block_hash] += 1
        return self._slot_of[block_hash]

    def unpin(self, block_hash: int) -> None:
        """One reader of the state ``lend`` kept is done with it."""
        self._pins[block_hash] -= 1
        if self._pins[block_hash] <= 0:
            del self._pins[block_hash]

    def end_plan(self) -> list[tuple[int, int]]:
        """The plan being built is done: the (device slot, host slot) copies it makes, in order; what its
        sequences resume from may go again."""
        moves, self._moves = self._moves, []
        self._taken.clear()
        return moves

    def clear(self) -> None:
        """Forgets every checkpoint (the worker that held them is gone or starts afresh)."""
        self._slot_of.clear()
        self._ready.clear()
        self._pins.clear()
        self.end_plan()
        self._free = list(range(self.capacity - 1, -1, -1))
        self._host_free = list(range(self.capacity + self.host_capacity - 1, self.capacity - 1, -1))

    def _held(self, key: Hashable) -> bool:
        return key in self._pins or key in self._taken

    def _lru(self, tier: Callable[[int], bool]) -> Hashable | None:
        return next((key for key, slot in self._slot_of.items() if tier(slot) and not self._held(key)), None)

    def _release(self, slot: int) -> None:
        (self._free if slot < self.capacity else self._host_free).append(slot)

    def _evict_device(self) -> int | None:
        """Frees the least recently used device slot not held: its saved state moves to host memory (keeping
        its place in the order) when there is room there or room can be made, else it is dropped."""
        victim = self._lru(lambda slot: slot < self.capacity)
        if victim is None:
            return None
        slot = self._slot_of[victim]
        host = None
        if victim in self._ready and self.host_capacity:
            host = self._host_free.pop() if self._host_free else self._evict_host()
        if host is None:
            self._ready.discard(victim)
            del self._slot_of[victim]
        else:
            self._slot_of[victim] = host  # an existing key keeps its place in the order
            self._moves.append((slot, host))
        return slot

    def _evict_host(self) -> int | None:
        victim = self._lru(lambda slot: slot >= self.capacity)
        if victim is None:
            return None
        self._ready.discard(victim)
        return self._slot_of.pop(victim)
