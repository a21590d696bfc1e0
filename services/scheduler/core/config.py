"""The scheduler core's configuration: budgets, the step policy by name, and the policies' parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from services.scheduler.core.policies import POLICY_CLASSES
from services.scheduler.core.step_time import StepTimeModel

SWAP_ORDERS = ("enst", "priority")
WAIT_CREDITS = ("fcfs", "none")


@dataclass(frozen=True)
class MLFQConfig:
    """FastServe's skip-join multi-level feedback queue (papers.md §2). Where the paper (§2.1, §2.3) and the
    released code (§2.2) differ, the defaults follow the paper except for the starvation threshold, which is
    the code's 3 s (the paper's 0.3 s made FastServe slower than FCFS in the simulator: docs/design.md).
    ``paper()`` and ``released_code()`` give either source's choices throughout."""

    # Quantum of the highest-priority level, seconds. None: the step-time model's shortest step (one token),
    # the paper's "smallest iteration time seen in profiling"; the code fixes 0.01 s.
    base_quantum_s: float | None = None
    # q[i+1] = quantum_ratio * q[i] (both: 2).
    quantum_ratio: float = 2.0
    # Number of levels; None: unbounded, levels made on demand (the code; the paper does not say).
    num_levels: int | None = None
    # A job joins the first level whose quantum covers its first step's predicted time (skip-join);
    # False: every job joins level 0 (plain MLFQ, the paper's ablation).
    skip_join: bool = True
    # A job that has not run for this long is promoted to level 0 (the code: 3 s; the paper's alpha: 0.3 s).
    starvation_s: float = 3.0
    # Starvation is checked every this many steps (the paper: every step; the code: every 1000 iterations).
    starvation_check_steps: int = 1
    # A demoted or promoted job joins the front of its new queue (the code) instead of the back (the paper).
    requeue_front: bool = False
    # Which resident jobs go to host first and which come back first: "enst" (the paper: largest estimated
    # next scheduled time out first, smallest in first) or "priority" (the code: lowest priority out first).
    swap_order: str = "enst"
    # Device blocks proactive swapping keeps free for arriving jobs, as a fraction of the pool (the paper sizes
    # the reserve from arrival history without a formula; the code keeps max_batch_size blocks).
    reserve_frac: float = 0.05
    # Wait bound (neither source has one; policies/mlfq.py): a job that has run is overdue once its time
    # waiting since it joined exceeds max_wait_ratio x its time run + wait_slack_s (+ its FCFS credit), and
    # overdue jobs run ahead of every level, oldest first, so a job's latency stays within (1 + ratio) x its
    # service plus slack and credit. None: off (FastServe as published).
    max_wait_ratio: float | None = None
    wait_slack_s: float = 0.0
    # "fcfs": a job may also wait as long as it would have queued under FCFS (a lower bound from a replay of
    # FCFS over the tokens produced so far, policies/virtual_fcfs.py); "none": no credit.
    wait_credit: str = "fcfs"
    # Seconds per token of that replay; None: the shortest step seen (keeps the credit a lower bound).
    fcfs_step_s: float | None = None

    def __post_init__(self) -> None:
        if self.base_quantum_s is not None and not self.base_quantum_s > 0:
            raise ValueError(f"mlfq.base_quantum_s must be > 0 or None (profiled), got {self.base_quantum_s}")
        if not self.quantum_ratio > 1 or math.isinf(self.quantum_ratio):
            raise ValueError(f"mlfq.quantum_ratio must be a finite number > 1, got {self.quantum_ratio}")
        if self.num_levels is not None and self.num_levels < 1:
            raise ValueError(f"mlfq.num_levels must be >= 1 or None (unbounded), got {self.num_levels}")
        if not self.starvation_s > 0:
            raise ValueError(f"mlfq.starvation_s must be > 0 (use math.inf to turn promotion off), "
                             f"got {self.starvation_s}")
        if self.starvation_check_steps < 1:
            raise ValueError(f"mlfq.starvation_check_steps must be >= 1, got {self.starvation_check_steps}")
        if self.swap_order not in SWAP_ORDERS:
            raise ValueError(f"mlfq.swap_order must be one of {', '.join(SWAP_ORDERS)}, got {self.swap_order!r}")
        if not 0 <= self.reserve_frac < 1:
            raise ValueError(f"mlfq.reserve_frac must be in [0, 1), got {self.reserve_frac}")
        if self.max_wait_ratio is not None and not 0 <= self.max_wait_ratio < math.inf:
            raise ValueError(f"mlfq.max_wait_ratio must be a finite number >= 0 or None (off), "
                             f"got {self.max_wait_ratio}")
        if not 0 <= self.wait_slack_s < math.inf:
            raise ValueError(f"mlfq.wait_slack_s must be a finite number >= 0, got {self.wait_slack_s}")
        if self.wait_credit not in WAIT_CREDITS:
            raise ValueError(f"mlfq.wait_credit must be one of {', '.join(WAIT_CREDITS)}, got {self.wait_credit!r}")
        if self.fcfs_step_s is not None and not 0 < self.fcfs_step_s < math.inf:
            raise ValueError(f"mlfq.fcfs_step_s must be a finite number > 0 or None (measured), "
                             f"got {self.fcfs_step_s}")

    @classmethod
    def paper(cls) -> MLFQConfig:
        """The paper's choices throughout (papers.md §2.1, §2.3), its alpha = 0.3 s included."""
        return cls(starvation_s=0.3)

    @classmethod
    def released_code(cls) -> MLFQConfig:
        """The constants of FastServe's released scheduler (LLMServe/FastServe @187a274, papers.md §2.2)."""
        return cls(base_quantum_s=0.01, starvation_s=3.0, starvation_check_steps=1000, requeue_front=True,
                   swap_order="priority")


@dataclass(frozen=True)
class SchedulerConfig:
    # Most tokens (decodes + prompt chunks) in one step; None = no limit.
    max_num_batched_tokens: int | None = None
    # Most prompt tokens in one step (the chunk budget) for the chunking policies (sarathi,
    # fastserve+sarathi); None = whole prompts, or the budget derived from tbt_target_s when that is set.
    chunk_size: int | None = None
    # Most sequences in one step.
    max_num_seqs: int = 256
    # A request stops with finish reason "length" when prompt + output reach this.
    max_model_len: int = 4096
    # Reuse the KV of full blocks whose chained hash matches (PagedAttention's prefix sharing).
    enable_prefix_caching: bool = True
    # The step policy, by name (services/scheduler/core/policies): "sarathi" (stall-free chunked prefill,
    # the default), "vllm" (prefill-first), "fcfs" (run to completion), "fastserve" (skip-join MLFQ with
    # proactive swapping), "fastserve+sarathi" (MLFQ order, stall-free chunked steps).
    policy: str = "sarathi"
    # "swap": a preempted request's KV is copied to host blocks while the host pool has room (recompute when
    # it has none); "recompute": its KV is dropped and recomputed when it runs again. None: the policy's own
    # choice (swap for the fastserve policies, recompute for the others).
    preemption_mode: str | None = None
    # Target time between tokens, seconds. With chunk_size None, a chunking policy's step budget tau is the
    # largest token count whose modeled step fits it (Sarathi-Serve §4.3); decodes count against tau but
    # are never skipped for it. None: no derived budget.
    tbt_target_s: float | None = None
    # The step-time model: derived budgets, FastServe's levels and quanta, and the logical clock.
    step_time: StepTimeModel = field(default_factory=StepTimeModel)
    # FastServe's queue parameters (the fastserve policies only).
    mlfq: MLFQConfig = field(default_factory=MLFQConfig)
    # Multi-step decoding (vLLM's num_scheduler_steps): while no request waits, a step of decodes only runs
    # up to this many decode passes on the worker without a round trip to the scheduler, each sequence's
    # blocks reserved ahead. Amortizes the per-step cost of scheduling and of the plan's and result's trips
    # where forward passes are short; tokens then reach clients in groups of up to this many. 1 = off.
    num_decode_steps: int = 1
    # Speculative decoding by n-gram lookup (vLLM's "ngram" method, prompt lookup decoding): a decode may run
    # its newest token and up to this many draft tokens in one pass; the worker drafts them from earlier
    # tokens of the same sequence and keeps those its sampler would have sampled anyway (speculative.py).
    # More tokens per pass where outputs repeat their context (code edits, summaries, loops). 0 = off.
    num_speculative_tokens: int = 0
    # Correct step_time's fixed cost from the durations schedule(now) measures (step_time.StepTimeCalibration):
    # the live mesh, whose clock is real, turns it on; the simulator and the offline engine keep their model.
    calibrate_step_time: bool = False
    # Every layer of the model attends within this many keys (sliding-window attention; None: full
    # attention): a running request's blocks that fell out of the window are freed as it advances, so a
    # long sequence holds about window / block_size + 2 blocks (window_blocks). The pool must reserve the
    # null block.
    sliding_window: int | None = None
    # The model has linear-attention layers (Qwen3-Next), whose recurrent state per sequence lives on its worker
    # and depends on every token in order: a prefix is taken from cached blocks only as far as a state the
    # worker saved (state_checkpoints.py; with none, caches_prefixes is off whatever enable_prefix_caching
    # says), a fork cannot share its parent's, and drafts cannot be verified (a rejected one cannot be taken
    # back out of the state).
    recurrent_state: bool = False
    # With recurrent_state: how many states the worker keeps for prefix caching (WorkerInfo.state_checkpoints),
    # and how many more in host memory, where the device's least recently used go (state_slots.py).
    state_checkpoints: int = 0
    host_state_checkpoints: int = 0

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "chunk_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None (no limit), got {value}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.num_decode_steps < 1:
            raise ValueError(f"num_decode_steps must be >= 1 (1 = one pass per step), got {self.num_decode_steps}")
        if self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0 (0 = off), got {self.num_speculative_tokens}")
        if self.num_speculative_tokens and self.num_decode_steps > 1:
            raise ValueError("num_speculative_tokens and num_decode_steps > 1 exclude each other: a plan's extra "
                             "decode tokens are either drafts to verify in one pass or passes of their own")
        if self.num_speculative_tokens and self.recurrent_state:
            raise ValueError("num_speculative_tokens: speculative decoding is not served for models with "
                             "linear-attention layers (their recurrent state cannot drop rejected drafts); leave it 0")
        if self.policy not in POLICY_CLASSES:
            raise ValueError(f"policy must be one of {', '.join(POLICY_CLASSES)}, got {self.policy!r}")
        if self.preemption_mode not in (None, "swap", "recompute"):
            raise ValueError(f"preemption_mode must be swap, recompute or None (the policy's choice), "
                             f"got {self.preemption_mode!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None (full attention), got {self.sliding_window}")
        for name in ("state_checkpoints", "host_state_checkpoints"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = none), got {getattr(self, name)}")
        if self.tbt_target_s is not None and not self.tbt_target_s > 0:
            raise ValueError(f"tbt_target_s must be > 0 or None, got {self.tbt_target_s}")

    @property
    def caches_prefixes(self) -> bool:
        """Whether full blocks are shared by their hashes (prefix caching on, and a model whose KV is all of a
        prefix's state, or whose worker saves the rest: state_checkpoints)."""
        return self.enable_prefix_caching and (not self.recurrent_state or self.state_checkpoints > 0)

    @property
    def whole_prompt_limit(self) -> int | None:
        """The most tokens of one request a step must take at once (None: no such bound): a policy that does not
        chunk runs a prompt whole in one step, and a preempted request's prompt and output again when it is
        recomputed, so a request that could grow past ``max_num_batched_tokens`` might never run."""
        if POLICY_CLASSES[self.policy].chunked:
            return None
        return self.max_num_batched_tokens

    def window_blocks(self, block_size: int) -> int | None:
        """The most blocks one request holds at once, whatever its length, when blocks behind a sliding window
        are freed (None: its whole context may be held). A step runs up to a chunk of it (or the extra decode
        tokens of a multi-step or speculative decode) after its window, and blocks the step left behind are
        freed when the next one is planned. A policy that runs prompts whole holds a whole prompt."""
        if self.sliding_window is None or not POLICY_CLASSES[self.policy].chunked:
            return None
        budget = self.chunk_size or self.derived_token_budget or self.max_num_batched_tokens
        if budget is None:
            return None
        step = max(budget, self.num_decode_steps, 1 + self.num_speculative_tokens)
        return -(-(self.sliding_window - 1 + step) // block_size) + 1

    @property
    def derived_token_budget(self) -> int | None:
        """Sarathi's tau from ``tbt_target_s`` when ``chunk_size`` is not given; None otherwise. Raises
        ValueError when the step-time model cannot fit even a one-token step in the target (checked where the
        model is the one of the hardware: a mesh's worker reports its own, services/engine/step_profile.py)."""
        if self.chunk_size is not None or self.tbt_target_s is None:
            return None
        try:
            return self.step_time.token_budget(self.tbt_target_s)
        except ValueError as exc:
            raise ValueError(f"tbt_target_s: {exc}") from None


# FastServe's queue constants by name: the paper's (with the released code's 3 s starvation threshold), the
# paper's exactly, or the released code's (papers.md §2.1-2.2).
MLFQ_PRESETS = {"default": MLFQConfig, "paper": MLFQConfig.paper, "released-code": MLFQConfig.released_code}
