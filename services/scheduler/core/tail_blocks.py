"""Prefix caching down to the token: a released request's partly filled last block stays cached, and a request
whose tokens continue it copies it instead of recomputing those tokens.

Full blocks are shared by reference; a partly filled block cannot be, since whoever takes it writes its next
tokens there. So when a request's blocks are released, its last block (when partly filled with computed KV)
is cached under the hash of its tokens so far (``block_hash.tail_hash``), free and evictable like any cached
block (freed first, so evicted before the full blocks it follows). A request admitted looks, right after the
full blocks of its prefix found cached, for the longest such tail of exactly its next tokens, takes a fresh
block, and the plan copies the tail into it (``StepPlan.copy``, applied before the forward pass, as a fork's
copy-on-write is). What this saves: up to ``block_size - 1`` tokens per request, which is most of a step for a
beam search's one-token steps (each continues a beam that just finished), or a conversation's next turn
continuing the last. Only an exact continuation finds a tail: the same prompt sent again does not (it must run
its last token, which the tail holds).

Off for models whose blocks are not all of a prefix's state (linear attention: their saved states are at
full blocks) and for sliding windows (blocks behind the window are dropped).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.common.block_hash import tail_hash
from services.scheduler.core.request import Request

if TYPE_CHECKING:
    from services.scheduler.core.scheduler import Scheduler


class TailBlocks:
    @property
    def _caches_tails(self: Scheduler) -> bool:
        c = self.config
        return c.caches_prefixes and not c.recurrent_state and c.sliding_window is None

    def _cache_tail(self: Scheduler, req: Request) -> None:
        """Before ``req``'s blocks are released: caches its partly filled last block of computed KV."""
        bs = self.blocks.block_size
        end = min(req.num_computed_tokens, len(req.prompt_token_ids) + len(req.output_token_ids))
        full, length = divmod(end, bs)
        if not length or full >= len(req.block_ids) or full > len(req.block_hashes):
            return
        hashes = req.block_hashes[:full]
        self.blocks.cache(req.block_ids[full], tail_hash(hashes, req.token_ids, bs, self.seed_of(req), length))

    def _take_tail(self: Scheduler, req: Request, hashes: list[int]) -> int:
        """``req`` holds the cached full blocks of its prefix (the first of ``hashes``) and nothing else: takes a
        copy of the longest cached tail of its next tokens, leaving at least one token to run. Returns the
        tokens it holds (0: none; the copy is the last in ``_copy``)."""
        if not self._caches_tails:
            return 0
        bs = self.blocks.block_size
        full = len(req.block_ids)
        seed, chain = self.seed_of(req), hashes[:full]  # a long context's chain copied once, not per length
        for length in range(min(bs - 1, req.num_tokens - 1 - full * bs), 0, -1):
            src = self.blocks.cached_block(tail_hash(chain, req.token_ids, bs, seed, length))
            if src is None:
                continue
            got = self.blocks.allocate(1)  # may be src itself (least recently freed): it holds the tokens then
            if got is None:
                return 0
            self._copy.append((src, got[0]))
            req.block_ids.append(got[0])
            req.num_computed_tokens += length
            return length
        return 0
