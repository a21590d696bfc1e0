"""Where a model with linear-attention layers saves recurrent states for prefix caching, and what a request
resumes from (``Scheduler``'s part; state_slots.py keeps the slots).

Such a model's cached KV blocks do not resume a prefix alone: its linear layers need their state after exactly
that prefix. So the worker saves a sequence's state as its prompt passes the end of the prompt's last full block
(a *checkpoint*, into a slot the core assigns), and a later request whose prompt starts with those blocks takes
the cached blocks up to there and the checkpoint's state with them. A checkpoint is keyed by the hash of the
block it ends: the hash chains every token before it, so the same hash means the same state.

A checkpoint counts only once its block is cached (``confirm``), which is after the plan that saves it was made:
a plan that adds a sequence restores its state before that plan's forward pass, so a checkpoint assigned in the
same plan would not be there yet, while any later plan runs after the saving one. A decode's block may hold a
token still in flight when its plan is made (planned ahead of the step that samples it): its checkpoint is held
under (request, block index) until the token arrives and the block's hash is known (``bind``). With prefix
caching off, no request here takes a checkpoint, but kvcache stores a hybrid's blocks with the state saved
after them: a request's saves count as their blocks fill all the same (``_confirm_uncached_saves``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.common.block_hash import extend_hashes

if TYPE_CHECKING:
    from services.scheduler.core.request import Request
    from services.scheduler.core.scheduler import Scheduler


class CheckpointedPrefix:
    """``Scheduler``'s use of its worker's checkpoints (a method mixin, as hand_off.py's)."""

    def _checkpointed(self: Scheduler, hashes: list[int], cached: list[int]) -> tuple[list[int], int | None]:
        """The cached blocks ``cached`` (of ``hashes``) a request may take, and the checkpoint it starts from:
        all of them and None for a model without recurrent state; else only as far as a saved state."""
        if not self.config.recurrent_state:
            return cached, None
        k, slot = self.checkpoints.deepest(hashes[: len(cached)])
        return cached[:k], slot

    def _confirm_state_save(self: Scheduler, req: Request, block: int) -> None:
        """``req``'s ``block`` is cached: a state saved where it ends (under its hash, or under the request until
        its hash was known) counts from now on."""
        block_hash = req.block_hashes[block]
        self.checkpoints.bind((req.request_id, block), block_hash)
        self.checkpoints.confirm(block_hash)
        if req.latest_state_save == (req.request_id, block):
            req.latest_state_save = block_hash

    def _confirm_uncached_saves(self: Scheduler, req: Request, full: int) -> None:
        """Without a prefix cache, ``req``'s saved states are of use to kvcache, which stores a hybrid's blocks
        only with the state saved after the last of them (dual_path.py): they count once ``full`` blocks of it
        are computed and known, as with the cache. ``req`` saves where its prompt's last full block ends, and
        its latest state past that (one at a time); only these two can be waiting to count."""
        bs = self.blocks.block_size
        latest = req.latest_state_save
        blocks = {(len(req.prompt_token_ids) - 1) // bs - 1}
        if isinstance(latest, tuple):  # held under (request, block index) until the block's last token came
            blocks.add(latest[1])
        elif latest is not None:
            self.checkpoints.confirm(latest)
        blocks = [b for b in blocks if 0 <= b < full]
        if blocks:
            extend_hashes(req.block_hashes, req.token_ids, bs, self.seed_of(req))
            for block in blocks:
                self._confirm_state_save(req, block)

    def _branch_point(self: Scheduler, kv_blocks: int, state_blocks: int) -> int:
        """Where a prompt whose first ``kv_blocks`` blocks are cached, but resumable only after ``state_blocks``
        of them, parts from another prompt (tokens; 0 = nowhere): a prefix two prompts share (a system prompt)
        with no state saved after it. Saving one there as this prompt passes (Marconi's insertion at branch
        points) lets the next prompt sharing it resume from it."""
        if not self.config.recurrent_state or not self.checkpoints.capacity or kv_blocks <= state_blocks:
            return 0
        return kv_blocks * self.blocks.block_size

    def _state_save(self: Scheduler, req: Request, n: int) -> tuple[int, int] | None:
        """Where the step running ``n`` more tokens of ``req`` saves its state, (after how many of them, slot),
        or None: where it passes its branch point (``_branch_point``), else the end of its prompt's last full
        block (the last that a request with the same prompt could take: one token must run; a step passing both
        saves at the branch point, of use to more prompts), else where it fills a block past it (decoding: a
        conversation's next turn goes on from its latest; each replaces the request's one before, so that
        decodes do not crowd the prompts' states out; a multi-step decode's blocks hold tokens its own passes
        sample, so its save waits under the request for them, as a decode planned ahead does)."""
        bs = self.blocks.block_size
        computed = req.num_computed_tokens
        prompt_end = (len(req.prompt_token_ids) - 1) // bs * bs
        first = min(n, req.num_tokens - computed)
        if computed < req.state_branch <= computed + first:
            kind, end = "branch", req.state_branch
        elif computed < prompt_end <= computed + first:
            kind, end = "prompt", prompt_end
        else:  # the last block the step fills, a multi-step decode's later passes too
            kind, end = "output", (computed + n) // bs * bs
            if end <= computed or end < prompt_end:
                return None
        hashes = extend_hashes(req.block_hashes, req.token_ids, bs, self.seed_of(req))
        # A block whose last token is still in flight: held under the request until the token arrives (bind).
        block_hash = hashes[end // bs - 1] if len(hashes) >= end // bs else (req.request_id, end // bs - 1)
        if kind == "output":
            slot = self.checkpoints.replace(req.latest_state_save, block_hash)
            if slot is not None:
                req.latest_state_save = block_hash
        else:  # a prompt's own state is of use to the same prompt again only: the first to go when room is needed
            slot = self.checkpoints.assign(block_hash, cold=kind == "prompt")
        return None if slot is None else (end - computed, slot)
