"""Forking a running request (parallel sampling, beam-style branching) with copy-on-write of its last block.

The child shares every full block of the parent's computed KV (reference counts; full blocks are never
written again). A partly filled last block would be written by both as they decode, so it is copied at the
fork — the write that would trigger the copy comes at the next step anyway — and the copy travels in the next
plan's ``copy`` list, which the worker applies before the forward pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.scheduler.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from services.scheduler.core.scheduler import Scheduler


class Fork:
    def fork(self: Scheduler, parent_id: str, child: Request) -> bool:
        """Makes ``child`` (its own id and params) continue from the parent's tokens and KV.

        False (and nothing changed) when the pool has no block for the copy of a partial last block.
        """
        if self.config.recurrent_state:
            raise ValueError("a model with linear-attention layers cannot fork a request: the child needs the "
                             "parent's recurrent state, which its KV blocks do not hold")
        parent = self.requests[parent_id]
        if parent.status is not RequestStatus.RUNNING or not parent.is_decoding or parent.num_pending:
            raise ValueError(f"only a decoding request whose tokens are all known can be forked; {parent_id!r} is "
                             f"{parent.status.value}")
        if child.request_id in self.requests:
            raise ValueError(f"duplicate request id {child.request_id!r}")
        bs = self.blocks.block_size
        computed = parent.num_computed_tokens
        full = computed // bs
        copied: list[int] = []
        if computed % bs:
            got = self.blocks.allocate(1)
            if got is None:
                return False
            copied = got
            self._copy.append((parent.block_ids[full], got[0]))
        shared = parent.block_ids[:full]
        self.blocks.share(shared)
        child.prompt_token_ids = list(parent.prompt_token_ids)
        child.output_token_ids = list(parent.output_token_ids)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = computed
        child.num_cached_blocks = min(parent.num_cached_blocks, full)
        child.num_dropped_blocks = parent.num_dropped_blocks  # the null block is shared as it stands
        child.block_ids = shared + copied
        child.status = RequestStatus.RUNNING
        self.requests[child.request_id] = child
        self.running.append(child)
        self.policy.on_add(child, self.now)
        return True
