"""Which recurrent states a worker keeps for prefix caching of a model with linear-attention layers.

Such a model's cached KV blocks do not resume a prefix alone: its linear layers need their state after exactly
that prefix. So the worker saves a sequence's state as its prompt passes the end of the prompt's last full block
(a *checkpoint*, into one of ``capacity`` slots the core assigns), and a later request whose prompt starts with
those blocks takes the cached blocks up to there and the checkpoint's state with them. A checkpoint is keyed by
the hash of the block it ends: the hash chains every token before it, so the same hash means the same state.

The slots are recycled least recently used first. A checkpoint counts only once its block is cached
(``confirm``), which is after the plan that saves it was made: a plan that adds a sequence restores its state
before that plan's forward pass, so a checkpoint assigned in the same plan would not be there yet, while any
later plan runs after the saving one. A decode's block may hold a token still in flight when its plan is made
(planned ahead of the step that samples it): its checkpoint is held under (request, block index) until the
token arrives and the block's hash is known (``bind``). A checkpoint another worker is reading (a prefix read
from this worker's cache, services/scheduler/peer_prefix.py) is pinned: its slot is neither evicted nor
replaced until ``unpin``.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from services.common.block_hash import extend_hashes

if TYPE_CHECKING:
    from services.scheduler.core.request import Request
    from services.scheduler.core.scheduler import Scheduler


class StateCheckpoints:
    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"state checkpoint capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        # Block hash (or (request, block index) until it is known) -> slot, least recently used first.
        self._slot_of: OrderedDict[Hashable, int] = OrderedDict()
        self._ready: set[int] = set()  # hashes whose blocks are cached
        self._free = list(range(capacity - 1, -1, -1))
        self._pins: Counter[Hashable] = Counter()  # checkpoints being read by another worker

    def __len__(self) -> int:
        return len(self._ready)

    def covered(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` (cached blocks) a saved state resumes after (no side effects:
        what routing estimates)."""
        return next((k for k in range(len(hashes), 0, -1) if hashes[k - 1] in self._ready), 0)

    def deepest(self, hashes: Sequence[int]) -> tuple[int, int | None]:
        """The longest prefix of ``hashes`` (cached blocks) ending in a saved state: (its blocks, the state's
        slot), or (0, None). Marks the checkpoint used."""
        k = self.covered(hashes)
        if not k:
            return 0, None
        self._slot_of.move_to_end(hashes[k - 1])
        return k, self._slot_of[hashes[k - 1]]

    def assign(self, block_hash: Hashable, cold: bool = False) -> int | None:
        """The slot a step saves the state ending in ``block_hash``'s block into, evicting the least recently
        used checkpoint when none is free; None when there are no slots, or it is saved already. A checkpoint
        assigned but not confirmed (its request left before its step) is assigned again: the same prefix saves
        the same state. ``cold``: it is the next to go (until it is used), not the last."""
        if not self.capacity or block_hash in self._ready:
            return None
        if block_hash in self._slot_of:
            return self._slot_of[block_hash]
        if self._free:
            slot = self._free.pop()
        else:
            evicted = next((key for key in self._slot_of if key not in self._pins), None)
            if evicted is None:  # every slot is being read: this state is not saved
                return None
            slot = self._slot_of.pop(evicted)
            self._ready.discard(evicted)
        self._slot_of[block_hash] = slot
        if cold:
            self._slot_of.move_to_end(block_hash, last=False)
        return slot

    def replace(self, old: Hashable | None, block_hash: Hashable) -> int | None:
        """``assign`` for a request's newest state in place of its ``old`` one (released first, so that it makes
        the room rather than another's); None, and ``old`` kept, when ``block_hash``'s state is saved already."""
        if not self.capacity or block_hash in self._ready:
            return None
        if old is not None and old != block_hash and old in self._slot_of and old not in self._pins:
            self._ready.discard(old)
            self._free.append(self._slot_of.pop(old))
        return self.assign(block_hash)

    def bind(self, key: Hashable, block_hash: int) -> None:
        """The checkpoint held under ``key`` (request, block index) ends in ``block_hash``'s block."""
        slot = self._slot_of.pop(key, None)
        if slot is None:
            return
        if block_hash in self._slot_of:  # saved by another request meanwhile: one copy is enough
            self._free.append(slot)
        else:
            self._slot_of[block_hash] = slot

    def confirm(self, block_hash: int) -> None:
        """The step that saved the state ending in ``block_hash``'s block ran: later requests may take it."""
        if block_hash in self._slot_of:
            self._ready.add(block_hash)

    def pin(self, block_hash: int) -> None:
        """Keeps the saved state ending in ``block_hash``'s block in its slot while another worker reads it."""
        if block_hash not in self._ready:
            raise ValueError(f"no saved state ends in block {block_hash:#x}")
        self._pins[block_hash] += 1

    def unpin(self, block_hash: int) -> None:
        """One reader of the state ``pin`` kept is done with it."""
        self._pins[block_hash] -= 1
        if self._pins[block_hash] <= 0:
            del self._pins[block_hash]

    def clear(self) -> None:
        """Forgets every checkpoint (the worker that held them is gone or starts afresh)."""
        self._slot_of.clear()
        self._ready.clear()
        self._pins.clear()
        self._free = list(range(self.capacity - 1, -1, -1))


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
        decodes do not crowd the prompts' states out). Only within the step's first pass (a multi-step decode's
        later passes save nothing)."""
        bs = self.blocks.block_size
        computed = req.num_computed_tokens
        prompt_end = (len(req.prompt_token_ids) - 1) // bs * bs
        first = min(n, req.num_tokens - computed)
        if computed < req.state_branch <= computed + first:
            kind, end = "branch", req.state_branch
        elif computed < prompt_end <= computed + first:
            kind, end = "prompt", prompt_end
        else:
            kind, end = "output", (computed + first) // bs * bs
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
