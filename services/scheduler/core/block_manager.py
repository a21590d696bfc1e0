"""Device block pool of one worker: allocation on demand, reference-free ownership, checked invariants.

Invariants (``check_integrity``):
* every block id in ``[0, num_blocks)`` is either in the free queue or owned by exactly one request;
* ``num_free + num_used == num_blocks``;
* a request owns exactly ``ceil(tokens_in_cache / block_size)`` blocks or more (never fewer).
"""

from __future__ import annotations

from collections import deque


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._owner: dict[int, str] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, num_tokens: int, num_owned: int) -> int:
        """How many more blocks hold ``num_tokens`` tokens when ``num_owned`` blocks are already held."""
        return max(0, -(-num_tokens // self.block_size) - num_owned)

    def allocate(self, owner: str, count: int) -> list[int] | None:
        """``count`` fresh blocks for ``owner``, or None (and nothing taken) when too few are free."""
        if count > len(self._free):
            return None
        blocks = [self._free.popleft() for _ in range(count)]
        for b in blocks:
            self._owner[b] = owner
        return blocks

    def free(self, owner: str, blocks: list[int]) -> None:
        for b in blocks:
            holder = self._owner.pop(b, None)
            assert holder == owner, f"block {b} freed by {owner!r} but owned by {holder!r}"
            self._free.append(b)

    def check_integrity(self, owned: dict[str, list[int]]) -> None:
        """Raises AssertionError naming the culprit when ``owned`` (request → blocks) disagrees with the pool."""
        assert len(self._free) + len(self._owner) == self.num_blocks, "free + used != total"
        assert len(set(self._free)) == len(self._free), "a block is in the free queue twice"
        assert not set(self._free) & set(self._owner), "a block is both free and owned"
        seen: dict[int, str] = {}
        for rid, blocks in owned.items():
            for b in blocks:
                assert b not in seen, f"block {b} owned by both {seen[b]!r} and {rid!r}"
                seen[b] = rid
                assert self._owner.get(b) == rid, f"block {b} of {rid!r} is recorded as {self._owner.get(b)!r}'s"
        assert len(seen) == len(self._owner), f"{len(self._owner) - len(seen)} blocks leaked"
