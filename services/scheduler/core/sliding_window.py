"""Freeing the blocks a sliding attention window left behind, as a method of ``Scheduler``.

When every layer of the model attends within ``window`` keys (Mistral; Qwen2/3 with all layers sliding), a
query at position p reads keys ``(p - window, p]`` only. A running request's next query is at
``num_computed_tokens`` or later, so its blocks wholly before ``num_computed_tokens - window + 1`` are never
read again: each step frees them (vLLM v1's sliding-window manager). The pool's null block takes their
place in ``block_ids``, which keeps every position's index (``block_ids[p // block_size]``); the worker's
table may still name the old blocks there, which it never reads (its attention skips them). A long
sequence then holds about ``window / block_size + 2`` blocks, not one per 16 tokens of its context.

Freed blocks that were cached stay cached (another request may share the prefix). Plans already sent may
still read a freed block; the worker runs plans in order, and transfers into it wait on ``reuse_fence``, as
for any block freed while plans are in flight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.scheduler.core.request import Request
    from services.scheduler.core.scheduler import Scheduler


class SlidingWindow:
    def _check_window(self: Scheduler) -> None:
        if self.config.sliding_window is not None and self.blocks.null_block is None:
            raise ValueError("sliding_window needs a pool that reserves the null block (BlockManager(..., "
                             "reserve_null=True)) to stand in for the blocks it frees")

    def _drop_out_of_window(self: Scheduler) -> None:
        """Frees each running request's blocks that no query of it reads again."""
        if self.config.sliding_window is not None:
            for req in self.running:
                self._drop_behind_window(req)

    def _drop_behind_window(self: Scheduler, req: Request) -> None:
        """Frees ``req``'s blocks wholly before the window of its next query (at ``num_computed_tokens``).
        A request whose KV is stored when it finishes (a session's turn, ``hold_blocks_on_finish``) keeps
        them all: the next turn loads its whole prefix from block 0, and reuse across turns is worth more
        to an agentic session than the memory."""
        window = self.config.sliding_window
        if window is None or req.hold_blocks_on_finish:
            return
        keep_from = max(0, req.num_computed_tokens - window + 1) // self.blocks.block_size  # first block read
        if keep_from > req.num_dropped_blocks:
            dropped = req.block_ids[req.num_dropped_blocks:keep_from]
            self.blocks.free(dropped)
            req.block_ids[req.num_dropped_blocks:keep_from] = [self.blocks.null_block] * len(dropped)
            req.num_dropped_blocks = keep_from
