"""Device block pool of one worker: allocation on demand, reference counts, and a prefix cache.

A full block may be *cached* under its chained hash (``services/common/block_hash.py``): when its last
reference goes, it stays in the free queue with its contents and hash, so a later request with the same
prefix takes it back instead of recomputing. Allocation takes the least recently freed block first and
evicts its hash (LRU). Requests free their blocks tail first, so a prefix's later blocks go before its
first ones.

Invariants (``check_integrity``):
* ``num_free + num_used == num_blocks``; a block is in the free queue exactly when its ref count is 0;
* the hash map points only at cached blocks and each cached block at its own hash (both directions agree);
* every owner's blocks are referenced at least once per owner holding them.

With ``reserve_null`` (a sliding-window model), block 0 is never handed out: a request's block table names it
where its blocks fell out of the attention window and were freed (vLLM's null block). Freeing or sharing
it is a no-op; whatever lands in it is never read.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, reserve_null: bool = False) -> None:
        if num_blocks < 1 + reserve_null or block_size < 1:
            raise ValueError(f"num_blocks must be >= {1 + reserve_null} and block_size >= 1, got {num_blocks}, "
                             f"{block_size}")
        self.null_block = 0 if reserve_null else None
        first = int(reserve_null)
        self._ids = range(first, num_blocks)
        self.num_blocks = len(self._ids)  # blocks an owner can hold
        self.block_size = block_size
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(self._ids)  # LRU first
        self._ref = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # block → hash, for cached blocks
        self._block_of: dict[int, int] = {}  # hash → block
        # The owner's clock (its latest plan's step id) when each block last became free: plans up to that one
        # may still use it on the worker (see Scheduler.reuse_fence).
        self.clock = 0
        self.freed_at = [0] * num_blocks

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (unreferenced cached blocks included: they are evicted)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._hash_of)

    def blocks_needed(self, num_tokens: int, num_owned: int) -> int:
        """How many more blocks hold ``num_tokens`` tokens when ``num_owned`` blocks are already held."""
        return max(0, -(-num_tokens // self.block_size) - num_owned)

    def cached_prefix(self, hashes: Sequence[int]) -> list[int]:
        """Blocks of the longest prefix of ``hashes`` that is cached (no side effects)."""
        blocks = []
        for h in hashes:
            b = self._block_of.get(h)
            if b is None:
                break
            blocks.append(b)
        return blocks

    def cached_block(self, block_hash: int) -> int | None:
        """The block cached under ``block_hash``, if any (no side effects)."""
        return self._block_of.get(block_hash)

    def take_cached(self, blocks: Sequence[int]) -> None:
        """References cached ``blocks`` (from ``cached_prefix``) for one more owner."""
        for b in blocks:
            assert b in self._hash_of, f"block {b} is not cached"
            self._ref[b] += 1
            self._free.pop(b, None)

    def share(self, blocks: Sequence[int]) -> None:
        """References already referenced ``blocks`` for one more owner (a forked request)."""
        for b in blocks:
            if b == self.null_block:
                continue
            assert self._ref[b] > 0, f"block {b} is shared but not referenced"
            self._ref[b] += 1

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks, or None (and nothing taken) when too few are free."""
        if count > len(self._free):
            return None
        blocks = []
        for _ in range(count):
            b, _ = self._free.popitem(last=False)
            h = self._hash_of.pop(b, None)
            if h is not None:
                del self._block_of[h]  # evicted: its contents are about to be overwritten
            self._ref[b] = 1
            blocks.append(b)
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        """Drops one reference to each block, tail first; unreferenced blocks join the free queue."""
        for b in reversed(blocks):
            if b == self.null_block:
                continue
            assert self._ref[b] > 0, f"block {b} freed but not referenced"
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
                self.freed_at[b] = self.clock

    def cache(self, block: int, block_hash: int) -> None:
        """Marks a block as holding the prefix named ``block_hash`` (first writer wins): a full block, or a
        released request's partly filled last one (tail_blocks.py), which is only ever copied."""
        if block in self._hash_of or block_hash in self._block_of or block == self.null_block:
            return
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block

    def check_integrity(self, owned: dict[str, list[int]]) -> None:
        """Raises AssertionError naming the culprit when ``owned`` (owner → blocks) disagrees with the pool."""
        used = [b for b in self._ids if self._ref[b] > 0]
        assert len(self._free) + len(used) == self.num_blocks, "free + used != total"
        for b in self._ids:
            assert (self._ref[b] == 0) == (b in self._free), f"block {b}: ref {self._ref[b]} vs free queue"
        assert self.null_block is None or self._ref[self.null_block] == 0, "the null block was referenced"
        assert self.null_block not in self._hash_of, "the null block was cached"
        assert all(self._block_of[h] == b for b, h in self._hash_of.items()), "hash maps disagree"
        assert len(self._block_of) == len(self._hash_of), "hash maps differ in size"
        refs = Counter(b for blocks in owned.values() for b in blocks if b != self.null_block)
        for b, n in refs.items():
            assert self._ref[b] == n, f"block {b} is held {n} times but has ref count {self._ref[b]}"
        leaked = set(used) - set(refs)
        assert not leaked, f"blocks {sorted(leaked)[:5]} are referenced but owned by no request"
