"""A request as the scheduler core sees it: tokens, progress, blocks and a small state machine."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import overload

from services.common.sampling_params import SamplingParams
from services.common.step import LoraRef


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued; also a recompute-preempted request waiting to run again
    RUNNING = "running"  # has blocks; prefilling (chunk by chunk) or decoding
    SWAPPED = "swapped"  # preempted with its KV copied to host blocks; resumes where it stopped
    ARRIVING = "arriving"  # has blocks; its KV is being transferred in from another worker (disaggregated)
    FINISHED = "finished"


@dataclass(eq=False)  # a request is an entity: queues find and remove it by identity, not by field values
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    eos_token_ids: tuple[int, ...] = ()
    # Lower runs sooner (vLLM's meaning; 0 = normal): the first-come-first-served policies order by it, then
    # by arrival, and take blocks from the least important first. FastServe's levels ignore it.
    priority: int = 0
    # The LoRA adapter it runs with (None: the base model). Its KV differs from the base model's for the same
    # tokens, so its block hashes start from a seed of their own (``hash_salt``).
    lora: LoraRef | None = None
    # An activated LoRA's first position (services/common/lora.py, ``activation_start``; None: never): the KV
    # before it is the base model's, after it depends on where the adapter started (``activated_salt``).
    # 0: from the first token (a plain LoRA).
    lora_from: int | None = 0
    # vLLM's cache_salt: only requests with the same salt share cached KV (a tenant's prompts cannot be probed
    # by another's timing). "" = none.
    cache_salt: str = ""
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    host_block_ids: list[int] = field(default_factory=list)  # while swapped out
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    # Chained hashes of the full blocks of all_token_ids (extended as tokens arrive).
    block_hashes: list[int] = field(default_factory=list)
    # Leading blocks already registered in the prefix cache.
    num_cached_blocks: int = 0
    # Leading blocks that fell out of a sliding attention window and were freed: the null block stands in
    # for them in block_ids (sliding_window.py).
    num_dropped_blocks: int = 0
    # Prompt tokens served from the prefix cache at admission (reported as cached_prompt_tokens).
    num_prefix_hit_tokens: int = 0
    # A recurrent model's cached prefix: the worker's checkpoint slot holding the state it starts from.
    state_checkpoint: int | None = None
    # A recurrent model's prompt whose first state_branch tokens (whole blocks) are cached with no state saved
    # after them, a prefix it shares with another prompt: its state is saved there (state_checkpoints.py).
    state_branch: int = 0
    # The block hash its latest state saved past its prompt ends at (state_checkpoints.py; (request id, block
    # index) until that block's last token arrives), replaced by the next.
    latest_state_save: Hashable | None = None
    # When it finishes (stop or length), keep its blocks in ``Scheduler.handed_off`` instead of freeing them,
    # so that their KV can be stored (to kvcache) before the blocks are reused.
    hold_blocks_on_finish: bool = False
    # Output tokens that steps already sent will sample (the caller planned ahead of their results,
    # ``Scheduler.expect``): counted in ``num_tokens``, absent from ``output_token_ids`` until they arrive.
    num_pending: int = 0

    def reset_for_recompute(self) -> None:
        """Forgets every block and computed token (the KV is gone); outputs are kept, so it recomputes
        prompt + outputs and continues where it stopped."""
        self.block_ids, self.host_block_ids = [], []
        self.num_computed_tokens = self.num_cached_blocks = self.num_dropped_blocks = 0
        self.status = RequestStatus.WAITING

    @cached_property
    def hash_salt(self) -> str:
        """What sets this request's block hashes apart from the model's: its adapter and its cache salt (read
        each time its hashes grow, so made once)."""
        adapted = self.lora is not None and self.lora_from == 0  # an activated LoRA's salt is its own
        if not adapted and not self.cache_salt:
            return ""
        lora = f"lora|{self.lora.name}|{self.lora.path}" if adapted else ""
        return f"{lora}|salt|{self.cache_salt}" if self.cache_salt else lora

    @cached_property
    def activated_salt(self) -> str:
        """An activated LoRA's salt of the blocks from the one it starts in on ("" for any other request): it
        names where it started, since a token's KV depends on whether the adapter applied to the ones before."""
        if self.lora is None or not self.lora_from:
            return ""
        return f"lora|{self.lora.name}|{self.lora.path}|from|{self.lora_from}"

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def token_ids(self) -> TokenIds:
        """Prompt + output tokens without copying them: hashing a newly full block reads 16 of them, and a
        copy of a 32K-token context for each block cost more than the hash."""
        return TokenIds(self.prompt_token_ids, self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending

    @property
    def live_block_ids(self) -> list[int]:
        """Its blocks that hold KV still read (all but those dropped out of a sliding window)."""
        return self.block_ids[self.num_dropped_blocks:]

    @property
    def num_uncomputed(self) -> int:
        """Tokens known but not yet in the KV cache: the rest of the prompt, or 1 while decoding."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """The prompt is computed and only the newest output token is not: the next step is a decode."""
        computed = self.num_computed_tokens
        return computed >= len(self.prompt_token_ids) and self.num_tokens - computed == 1

    def __repr__(self) -> str:
        # Never log prompts or token ids (STYLE §5).
        return (f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_ids)})")


class TokenIds(Sequence[int]):
    """A read-only view of two token lists back to back (a request's prompt and outputs)."""

    __slots__ = ("_head", "_tail")

    def __init__(self, head: list[int], tail: list[int]) -> None:
        self._head, self._tail = head, tail

    def __len__(self) -> int:
        return len(self._head) + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index):
        n = len(self._head)
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            if stop <= n:
                return self._head[start:stop]
            if start >= n:
                return self._tail[start - n : stop - n]
            return self._head[start:] + self._tail[: stop - n]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("token index out of range")
        return self._head[index] if index < n else self._tail[index - n]
