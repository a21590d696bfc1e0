"""The step contract as plain data: what the scheduler asks a worker to run in one forward pass.

Follows vLLM v1's "full on first sight, diffs after": a sequence the worker has not seen (or must rebuild
after a recompute preemption) comes as a ``NewSequence`` with all its tokens; afterwards only its
``num_scheduled_tokens`` entry, and a ``ContinuingSequence`` when its block table changed.
``services/common/convert.py`` maps these to and from ``seawall.v1.worker_pb2``; the scheduler core and the
engine never see protobuf.

A worker runs, for each scheduled sequence, tokens ``[num_computed, num_computed + n)`` of what it knows of
that sequence; when that reaches the end of its known tokens, it samples the next one::

    token_ids:  [ prompt ............................ | outputs ... ]
                [ computed (KV cached) | scheduled n ]
                                                      ^ sample here when computed + n == len(token_ids)

When ``n`` reaches past the known tokens (a multi-step decode: the scheduler lets the worker run ``n``
decode passes without a round trip), the worker runs the known tokens, samples, and goes on one pass per
token with the tokens it samples itself: ``computed + n - len(token_ids) + 1`` tokens in all, always that
many (past a stop token too: the scheduler drops what follows a stop, and never schedules past
``max_tokens`` or the context).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.errors import SeawallError
from services.common.sampling_params import SamplingParams


@dataclass(frozen=True)
class LoraRef:
    """A LoRA adapter as a sequence names it: its served name and the directory of its files
    (``services/common/lora.py`` reads them)."""

    name: str
    path: str


@dataclass
class NewSequence:
    seq_id: str
    token_ids: list[int]  # prompt followed by any outputs already generated (after a recompute preemption)
    prompt_len: int  # how many of token_ids are prompt (penalties treat prompt and output differently)
    num_computed_tokens: int  # tokens whose KV is already in the blocks (prefix-cache hit or transferred)
    block_ids: list[int]
    params: SamplingParams
    lora: LoraRef | None = None  # the adapter the sequence runs with; None = the base model
    # A recurrent model's cached prefix: the checkpoint slot holding the state of its num_computed_tokens.
    state_checkpoint: int | None = None


@dataclass
class ContinuingSequence:
    seq_id: str
    new_block_ids: list[int]  # appended to the sequence's block table
    # The newest sampled token of a decode, when the worker did not sample it itself (disaggregated hand-off).
    appended_token_ids: list[int] = field(default_factory=list)
    # When set, replaces the whole block table (a swapped-out sequence resumed into new device blocks).
    block_ids: list[int] | None = None


@dataclass
class StepPlan:
    step_id: int
    new: list[NewSequence] = field(default_factory=list)
    # Sequences the worker holds whose block table or tokens changed; the rest are in num_scheduled_tokens only.
    continuing: list[ContinuingSequence] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)  # the worker drops these sequences' state
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, host block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host block, device block)
    copy: list[tuple[int, int]] = field(default_factory=list)  # (src device block, dst device block)
    # Forward passes the plan takes: 1, or more for multi-step decodes. The scheduler's note, not sent: a
    # worker derives the passes from the tokens it knows.
    num_passes: int = 1
    # A decode scheduled past its known tokens verifies up to that many draft tokens in this one pass
    # instead of running multi-step passes: the worker drafts them, runs newest token + drafts, and samples
    # (and returns) the drafts its sampler agrees with plus the token after them.
    speculative: bool = False
    # A recurrent model's states saved for prefix caching: seq_id -> (after how many of the tokens this step
    # runs for it, checkpoint slot).
    state_saves: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Sequences swapped out by this plan: a recurrent model's worker moves their states to host memory too.
    swapped_out: list[str] = field(default_factory=list)
    # Saved states copied from a device checkpoint slot to a host one, in order, before the plan's sequences are
    # added (state_slots.py): (device slot, host slot).
    state_moves: list[tuple[int, int]] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


@dataclass
class SampledToken:
    token_id: int
    logprob: float | None = None
    rank: int | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


def merge_prompt_scores(held: list[SampledToken], start: int, tokens: list[SampledToken]) -> None:
    """Appends the scores of prompt positions ``start``, ``start + 1``... to ``held`` (positions 1.. so far),
    skipping positions already held: a prompt recomputed after a preemption or a lost worker scores again."""
    for pos, token in enumerate(tokens, start):
        if pos == len(held) + 1:
            held.append(token)


@dataclass
class StepResult:
    step_id: int
    # Tokens each sequence sampled, in order: one, or several for a multi-step decode.
    sampled: dict[str, list[SampledToken]] = field(default_factory=dict)
    forward_seconds: float = 0.0
    # Prompt tokens scored this step (SamplingParams.prompt_logprobs): per sequence, the position of the first
    # one and a SampledToken per consecutive position (token_id is the prompt's token there).
    prompt_logprobs: dict[str, tuple[int, list[SampledToken]]] = field(default_factory=dict)
    # Sequences that failed alone (the rest of the step stands), e.g. constraints that leave no token possible.
    # The worker keeps such a sequence, runs none of it again and reports the error whenever a plan schedules
    # it, until a plan finishes it: plans sent before the scheduler learned of the error still run.
    errors: dict[str, SeawallError] = field(default_factory=dict)
    # Speculative plans: draft tokens run, and how many of them were kept.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Embedding requests (SamplingParams.pooling) whose prompt ended this step: the last token's final hidden
    # state, not normalized. Each also "sampled" token 0 in ``sampled``, which ends it (max_tokens 1).
    embeddings: dict[str, list[float]] = field(default_factory=dict)
