"""The scheduler core: continuous batching over a paged KV pool, with a step policy chosen by name.

Pure logic: no I/O, no clock reads, no torch. The machinery lives here: admission with the prefix cache,
block reservation, preemption (swap to the host pool or drop for recompute), swap-in, the step plan and
the results. *Who* runs in a step, with how many tokens, and who gives way is the policy's
(``policies/``: ``sarathi``, ``vllm``, ``fcfs``, ``fastserve``, ``fastserve+sarathi``)::

    schedule(now) -> StepPlan        the policy composes a step through admit / reserve_or_preempt /
                                     swap_in / swap_out; drops and swaps ride in the same plan
    on_result(plan, result) -> [TokenEvent]   applies sampled tokens; finished requests leave

Time is passed in: ``add`` takes the arrival time in the request, ``schedule(now)`` the step's start. When
``now`` is None the core keeps a logical clock that advances by the step-time model's estimate of each
plan, so callers that never pass time still get deterministic MLFQ quanta and starvation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

from services.common.block_hash import SwitchedSeed, extend_hashes, salted_seed
from services.common.sampling_params import FinishReason, check_stop
from services.common.step import ContinuingSequence, NewSequence, SampledToken, StepPlan, StepResult
from services.scheduler.core.block_manager import BlockManager
from services.scheduler.core.config import MLFQConfig, SchedulerConfig
from services.scheduler.core.fork import Fork
from services.scheduler.core.hand_off import HandOff
from services.scheduler.core.migration import Migration
from services.scheduler.core.multi_step import MultiStep
from services.scheduler.core.policies import POLICY_NAMES, Step, make_policy
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.core.shared_prefix import SharedPrefix
from services.scheduler.core.sliding_window import SlidingWindow
from services.scheduler.core.speculative import Speculative
from services.scheduler.core.state_checkpoints import CheckpointedPrefix
from services.scheduler.core.state_slots import StateCheckpoints
from services.scheduler.core.step_time import StepTimeCalibration, StepTimeModel
from services.scheduler.core.tail_blocks import TailBlocks

POLICIES = POLICY_NAMES  # the registry's names, for CLI choices

__all__ = ["POLICIES", "DraftStats", "MLFQConfig", "PrefixCacheStats", "Scheduler", "SchedulerConfig", "StepTimeModel",
           "TokenEvent"]


@dataclass
class TokenEvent:
    request_id: str
    token: SampledToken
    finish_reason: str | None


@dataclass
class PrefixCacheStats:
    queried_blocks: int = 0  # full prompt blocks looked up at admission
    hit_blocks: int = 0  # of those, served from the cache
    tail_tokens: int = 0  # tokens of partly filled blocks copied from the cache after those (tail_blocks.py)


@dataclass
class DraftStats:
    drafted: int = 0  # draft tokens the worker verified (speculative plans' results)
    kept: int = 0  # of those, kept


class Scheduler(HandOff, Migration, Fork, MultiStep, SharedPrefix, SlidingWindow, Speculative, CheckpointedPrefix,
                TailBlocks):
    def __init__(self, config: SchedulerConfig, blocks: BlockManager, host_blocks: BlockManager | None = None,
                 hash_seed: int = 0) -> None:
        """``blocks``: the worker's device pool; ``host_blocks``: its host pool, for swapping (None: no swap).
        ``hash_seed`` names the model and KV layout (``block_hash.hash_seed``): hashes never match across."""
        self.config = config
        self.blocks = blocks
        self.host_blocks = host_blocks
        self.hash_seed = hash_seed
        self._check_window()
        self.policy = make_policy(config)
        self.preemption_mode = config.preemption_mode or self.policy.default_preemption
        self.prefix_stats = PrefixCacheStats()
        # A recurrent model's states its worker saved for prefix caching (state_checkpoints.py).
        self.checkpoints = (StateCheckpoints(config.state_checkpoints, config.host_state_checkpoints)
                            if config.recurrent_state else StateCheckpoints(0))
        self.draft_stats = DraftStats()
        # Speculative decoding's pause where drafts keep missing (speculative.py): the kept-drafts estimate,
        # the steps left in a pause, whether the next speculative step is a probe after one.
        self._draft_gain, self._draft_pause, self._draft_probing = 1.0, 0, False
        self.preemptions = {"swap": 0, "recompute": 0}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # holding device blocks (not necessarily scheduled every step)
        self.swapped: deque[Request] = deque()  # KV on host blocks
        self.arriving: dict[str, Request] = {}  # KV being transferred in; not schedulable yet
        # Arrivals finished (aborted) while their KV was still being written: their blocks stay referenced
        # until the transfer's owner calls ``release_landing``, or a late write would land in a new owner's KV.
        self.landing: list[Request] = []
        self.handed_off: dict[str, list[int]] = {}  # blocks held while their KV is sent to another worker
        # Running requests about to migrate (migration.py), not scheduled: the latest plan that may run each.
        self.leaving: dict[str, int] = {}
        # Handed off with a recurrent state the transfer reads from the worker too: dropped there on release.
        self._drop_on_release: set[str] = set()
        self.requests: dict[str, Request] = {}
        self.now = 0.0  # start of the latest step: the caller's clock, or the logical one
        self._on_worker: set[str] = set()  # requests whose state the worker holds
        self._to_drop: list[str] = []  # finished/preempted since the last plan: the worker drops them
        self._sent_blocks: dict[str, int] = {}  # blocks of each request the worker already knows
        # Block hash -> (the request computing it, its index there): shared_prefix.py.
        self._computing: dict[int, tuple[str, int]] = {}
        self._expected: set[int] = set()  # step ids of plans applied by ``expect``, results not in yet
        # Block copies for the next plan. The worker runs swap-outs before swap-ins, so a device block freed
        # by a swap-out may be a swap-in target; host blocks read by a swap-in are freed one plan later so a
        # swap-out in the same plan cannot overwrite them first.
        self._swap_out: list[tuple[int, int]] = []
        self._swapped_out: list[str] = []  # the requests those are, for a recurrent model's worker
        self._copy: list[tuple[int, int]] = []  # copy-on-write at forks: (device block, its copy)
        self._swap_in: list[tuple[int, int]] = []
        self._host_to_free: list[int] = []
        self._swapped_in_now: set[str] = set()  # never a victim in the step that swapped it in
        self._preempted_now: set[str] = set()
        self._last_ran: list[str] = []  # requests in the latest plan, charged its duration at the next step
        self._last_step_s = 0.0  # the step-time model's estimate of the latest plan
        self._step_id = 0
        # Only a real clock measures steps; the logical one advances by the model itself.
        self._calibration = StepTimeCalibration() if config.calibrate_step_time else None

    def seed_of(self, req: Request) -> int | SwitchedSeed:
        """The seed of ``req``'s block hashes: the model's, or salted by its LoRA adapter or cache salt; an
        activated LoRA's switches to its salt at the block it starts in."""
        salt = req.hash_salt
        seed = salted_seed(self.hash_seed, salt) if salt else self.hash_seed
        if req.activated_salt:
            return SwitchedSeed(seed, req.lora_from // self.blocks.block_size, req.activated_salt)
        return seed

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.policy.on_add(request, self.now)

    def finish(self, request_id: str, reason: str = FinishReason.ABORT, num_outputs: int | None = None) -> None:
        """Ends a request early (abort, stop string seen by the detokenizer); frees its blocks. ``num_outputs``:
        the outputs to keep, when the stop came in a token before the last one resolved (a multi-step decode
        resolves several at once)."""
        req = self.requests.get(request_id)
        if req is None or req.status is RequestStatus.FINISHED:
            return
        if num_outputs is not None:
            del req.output_token_ids[num_outputs:]
        if req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        elif req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.SWAPPED:
            self.swapped.remove(req)
            self.host_blocks.free(req.host_block_ids)
            req.host_block_ids = []
        if req.status is RequestStatus.ARRIVING:
            del self.arriving[request_id]
            self.landing.append(req)  # keeps its blocks: see release_landing
        elif req.hold_blocks_on_finish and req.block_ids and reason in (FinishReason.STOP, FinishReason.LENGTH):
            self._hold(req)
        else:
            self._release(req)
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        self._forget(req)

    def queue_lengths(self) -> list[int]:
        """Requests waiting for a turn (not in the latest plan; arriving ones aside) per priority level,
        index 0 the highest; one entry for policies without levels."""
        ran = set(self._last_ran)
        queued = [r for r in (*self.running, *self.waiting, *self.swapped) if r.request_id not in ran]
        return self.policy.queue_lengths(queued)

    # --- a step ----------------------------------------------------------------------------------------------

    def schedule(self, now: float | None = None) -> StepPlan:
        """The next step's plan. ``now``: when the step starts, seconds on the caller's clock (never going
        back); None advances the logical clock by the modeled duration of the previous plan."""
        now = self._advance_clock(now)
        self._step_id += 1
        self.blocks.clock = self._step_id  # blocks this plan frees may still be used by it (reuse_fence)
        if self._host_to_free:
            self.host_blocks.free(self._host_to_free)
            self._host_to_free = []
        self._swapped_in_now, self._preempted_now = set(), set()
        self._drop_out_of_window()
        step = Step(now, self.config.max_num_batched_tokens or float("inf"), self.config.max_num_seqs)
        # Requests whose tokens in flight end them (max_tokens, the context) have nothing left to run, and
        # requests about to migrate hold still: the policy does not see them this step.
        still = [r for r in self.running
                 if r.request_id in self.leaving or (r.num_pending and self._ends_with_pending(r))]
        if still:
            self.running = [r for r in self.running if r not in still]
        self.policy.compose(self, step)
        self.running.extend(still)
        speculative = self._speculate(step)
        scheduled = self._multi_step(step.scheduled)
        # Preemptions above land in this plan's drop list, which the worker applies before adding sequences.
        plan = StepPlan(self._step_id, finished=self._to_drop, swap_out=self._swap_out, swap_in=self._swap_in,
                        copy=self._copy, speculative=speculative, swapped_out=self._swapped_out)
        self._to_drop, self._swap_out, self._swap_in, self._copy, self._swapped_out = [], [], [], [], []
        self._fill_plan(plan, scheduled)
        plan.state_moves = self.checkpoints.end_plan()  # saves in this plan took the device slots of these
        if not speculative:  # drafts are verified in the one pass
            plan.num_passes = 1 + max((n - r.num_uncomputed for r, n in scheduled), default=0)
        self._last_ran = list(plan.num_scheduled_tokens)
        self._last_step_s = self._predict(scheduled, speculative)
        return plan

    def _advance_clock(self, now: float | None) -> float:
        if now is None:
            now = self.now + self._last_step_s
        elif now < self.now:
            raise ValueError(f"schedule(now={now}) is earlier than the previous step ({self.now}): time is "
                             "monotonic")
        if self._last_ran:
            ran = [self.requests[rid] for rid in self._last_ran if rid in self.requests]
            self.policy.on_step_done(ran, now - self.now, now)
            if self._calibration is not None:
                model = self._calibration.observe(self.config.step_time, self._last_step_s, now - self.now)
                if model is not None:
                    self._set_step_time(model)
        self.now, self._last_ran, self._last_step_s = now, [], 0.0
        return now

    def _set_step_time(self, model: StepTimeModel) -> None:
        """Plans with ``model`` from now on (derived budgets, quanta); kept out when it cannot fit the TBT
        target, which was met with the model before."""
        config = replace(self.config, step_time=model)
        try:
            config.derived_token_budget  # noqa: B018 - raises when the target no longer fits
        except ValueError:
            return
        self.config = config
        self.policy.on_config(config)

    def samples(self, plan: StepPlan) -> bool:
        """Whether some sequence of ``plan`` (just scheduled, result not applied) reaches the end of its known
        tokens and so samples one. When none does, the outcome is known before the step runs, and planning
        the next step ahead of it (``expect``) risks nothing."""
        requests = self.requests
        return any(rid not in requests or requests[rid].num_computed_tokens + n >= requests[rid].num_tokens
                   for rid, n in plan.num_scheduled_tokens.items())

    def samples_a_decode(self, plan: StepPlan) -> bool:
        """Whether some sequence of ``plan`` (just scheduled) is a decode, as opposed to prompt chunks, whose
        last one samples the first token. Planning ahead of first tokens costs the scheduler little beside
        the forward pass; planning ahead of decodes streams every running request's token beside it."""
        requests = self.requests
        return any(rid not in requests or requests[rid].is_decoding for rid in plan.num_scheduled_tokens)

    def expect(self, plan: StepPlan) -> None:
        """``plan`` (just scheduled) is on its way and the caller plans the next step before its result:
        its tokens count as computed now, and each sequence reaching the end of its tokens gets a pending
        token, decoded by the next plan (the worker appends what it sampled). ``on_result`` fills the tokens
        in, in plan order, whatever became of the request meanwhile. A speculative plan cannot be expected:
        what it keeps is in its result only (speculative.py)."""
        if plan.speculative:
            raise ValueError(f"step {plan.step_id} verifies draft tokens: its result decides how many tokens it "
                             "computed, so the next plan must wait for it")
        self._apply_sent(plan)
        self._expected.add(plan.step_id)

    def _apply_sent(self, plan: StepPlan, result: StepResult | None = None) -> None:
        """What a plan does: tokens computed, and a pending token per token sampled (one where the plan
        reaches the end of the known tokens, more for a multi-step decode or a decode whose drafts were
        kept). Only a speculative plan needs its ``result`` for that."""
        for rid, n in plan.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            if plan.speculative:  # never expected (expect refuses it): its result is here
                n = self._kept(req, n, result)
            req.num_pending += max(0, req.num_computed_tokens + n - req.num_tokens + 1)
            req.num_computed_tokens += n
            self._cache_full_blocks(req)

    def _resolve(self, plan: StepPlan, result: StepResult) -> list[TokenEvent]:
        events = []
        for rid in plan.num_scheduled_tokens:
            req = self.requests.get(rid)
            for token in result.sampled.get(rid, ()):
                if req is None or req.status is RequestStatus.FINISHED or not req.num_pending:
                    break  # finished meanwhile (samples past its stop are discarded), or drained
                req.num_pending -= 1
                req.output_token_ids.append(token.token_id)
                # Only when a plan sent since already computed this token (planned ahead, or the next pass of
                # a multi-step decode) can a block have filled; a swapped request's are registered at swap-in.
                if (req.status is RequestStatus.RUNNING
                        and req.num_computed_tokens >= req.num_tokens - req.num_pending):
                    self._cache_full_blocks(req)
                reason = self._stop_reason(req)
                events.append(TokenEvent(rid, token, reason))
                if reason is not None:
                    self.finish(rid, reason)
        return events

    def _ends_with_pending(self, req: Request) -> bool:
        return (len(req.output_token_ids) + req.num_pending >= req.params.max_tokens
                or req.num_tokens >= self.config.max_model_len)

    def _stop_reason(self, req: Request) -> str | None:
        reason = check_stop(req.params, req.output_token_ids, req.eos_token_ids)
        if reason is None and len(req.prompt_token_ids) + len(req.output_token_ids) >= self.config.max_model_len:
            reason = FinishReason.LENGTH
        return reason

    def on_result(self, plan: StepPlan, result: StepResult) -> list[TokenEvent]:
        """Applies ``plan``'s result: the sampled tokens, in plan order (``plan`` is applied first unless
        ``expect`` already did). Returns one event per token kept."""
        if plan.step_id in self._expected:
            self._expected.discard(plan.step_id)
        else:
            if plan.speculative:
                self._note_kept(plan, result)
            self._apply_sent(plan, result)
        self.draft_stats.drafted += result.num_draft_tokens
        self.draft_stats.kept += result.num_accepted_tokens
        return self._resolve(plan, result)

    # --- machinery the policies call -------------------------------------------------------------------------

    @property
    def swap_enabled(self) -> bool:
        return self.preemption_mode == "swap" and self.host_blocks is not None

    @property
    def swapping_out(self) -> bool:
        """Whether this step swapped anything out so far."""
        return bool(self._swap_out)

    def swapped_in_now(self, req: Request) -> bool:
        return req.request_id in self._swapped_in_now

    def preempted_now(self, req: Request) -> bool:
        return req.request_id in self._preempted_now

    @property
    def preempted_in_plan(self) -> AbstractSet[str]:
        """The requests the last plan preempted (swapped out or dropped for recompute); read it, do not keep
        it (the next plan starts a new one). Looked at after every plan: no copy."""
        return self._preempted_now

    def admit(self, req: Request, room: float, step: Step, evict: bool = False) -> int:
        """Starts waiting ``req``: takes its cached prefix and blocks for up to ``room`` tokens of its first
        chunk. Returns how many tokens it runs now (it is RUNNING), or 0 with ``req`` untouched. ``evict``:
        when short of blocks, take them from the policy's victims (never from requests in ``step``)."""
        if req.num_pending:
            return 0  # preempted while a token of it was in flight: its worker needs every token to recompute
        if self._waits_for_shared_prefix(req, step):
            return 0  # a running request computes its next blocks now: take them from the cache next step
        while not (n := self._try_admit(req, room)):
            victim = self._victim(req, step) if evict else None
            if victim is None or victim is req:
                return 0
            self._preempt(victim)
        self.waiting.remove(req)
        self.running.append(req)
        req.status = RequestStatus.RUNNING
        return n

    def reserve_or_preempt(self, req: Request, n: int, step: Step, may_preempt_self: bool = True) -> bool:
        """Reserves blocks for ``n`` more tokens of running ``req``, preempting the policy's victims until
        they fit. Never preempts a request already in ``step``, nor one just swapped in (its swap-in has not
        happened yet, so there is nothing to swap out). When ``req`` is the victim it gives way if
        ``may_preempt_self`` (a decode), else it just waits for this step (a prompt chunk keeps its KV)."""
        if req.num_computed_tokens + n <= len(req.block_ids) * self.blocks.block_size:
            return True  # the common decode: room left in its last block
        while not self._reserve(req, n):
            victim = self._victim(req, step) or req
            if victim is req and not may_preempt_self:
                return False
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def swap_in(self, req: Request, n: int, step: Step, evict: bool = False) -> bool:
        """Moves swapped ``req`` back into device blocks that hold its KV and ``n`` more tokens; it is RUNNING
        (not scheduled: the caller adds it to ``step``). False when the blocks cannot be found; ``evict``:
        take them from the policy's victims."""
        need = max(len(req.host_block_ids),
                   self.blocks.blocks_needed(req.num_computed_tokens + n, req.num_dropped_blocks))
        while (dev := self.blocks.allocate(need)) is None:
            victim = self._victim(req, step) if evict else None
            if victim is None or victim is req:
                return False
            self._preempt(victim)
        self.swapped.remove(req)
        self._move_in(req, dev)
        return True

    def swap_in_fifo(self) -> None:
        """Moves swapped requests, oldest first, back to device blocks while they fit."""
        while self.swapped:
            req = self.swapped[0]
            dev = self.blocks.allocate(len(req.host_block_ids))
            if dev is None:
                break
            self.swapped.popleft()
            self._move_in(req, dev)

    def swap_out(self, req: Request) -> bool:
        """Copies running ``req``'s KV to host blocks (proactive swapping); False when the host pool is full."""
        host = self.host_blocks.allocate(len(req.live_block_ids)) if self.swap_enabled else None
        if host is None:
            return False
        self.running.remove(req)
        req.num_preemptions += 1
        self.preemptions["swap"] += 1
        self._move_out(req, host)
        return True

    def can_swap_out(self, req: Request) -> bool:
        """Whether preempting running ``req`` now would swap its KV out (rather than drop it)."""
        return (self.swap_enabled and req.request_id not in self._swapped_in_now
                and self.host_blocks.num_free >= len(req.live_block_ids))

    def _victim(self, req: Request, step: Step) -> Request | None:
        taken = step.ids | self._swapped_in_now
        return self.policy.pick_victim(self, req, [r for r in self.running if r.request_id not in taken])

    def _try_admit(self, req: Request, room: float) -> int:
        """Takes the cached prefix and blocks for the first chunk; returns its tokens, or 0 (``req`` left
        untouched) when the blocks are not there."""
        cached: list[int] = []
        hashes: list[int] = []
        queried, checkpoint, branch = 0, None, 0
        # A request scoring its prompt must compute every position: a cached block would skip its scores.
        use_cache = self.config.caches_prefixes and req.params.prompt_logprobs is None
        if use_cache:
            hashes = extend_hashes(req.block_hashes, req.token_ids, self.blocks.block_size, self.seed_of(req))
            # At least one token must run: its logits give the next token.
            queried = min(len(hashes), (req.num_tokens - 1) // self.blocks.block_size)
            kv = self.blocks.cached_prefix(hashes[:queried])
            cached, checkpoint = self._checkpointed(hashes, kv)
            self.blocks.take_cached(cached)
            branch = self._branch_point(len(kv), len(cached))
        req.block_ids = list(cached)
        req.num_cached_blocks = len(cached)
        req.num_computed_tokens = len(cached) * self.blocks.block_size
        tail = self._take_tail(req, hashes) if use_cache else 0
        self._drop_behind_window(req)  # a long cached prefix: only its last window is taken
        n = int(min(req.num_uncomputed, room))
        if n < 1 or not self._reserve(req, n):
            if tail:
                self._copy.pop()  # its copy of a tail block: the block is freed with the rest
            self.blocks.free(req.block_ids)
            req.block_ids, req.num_computed_tokens, req.num_cached_blocks, req.num_dropped_blocks = [], 0, 0, 0
            return 0
        req.state_checkpoint, req.state_branch = (checkpoint if cached else None), branch
        if use_cache and not self.config.recurrent_state:  # a recurrent model's blocks alone are no use to wait for
            self._note_computing(req, hashes, len(cached))
        if req.num_preemptions == 0:
            self.prefix_stats.queried_blocks += queried
            self.prefix_stats.hit_blocks += len(cached)
            self.prefix_stats.tail_tokens += tail
            req.num_prefix_hit_tokens = req.num_computed_tokens
        return n

    def _reserve(self, req: Request, n: int) -> bool:
        need = self.blocks.blocks_needed(req.num_computed_tokens + n, len(req.block_ids))
        if need == 0:
            return True
        got = self.blocks.allocate(need)
        if got is None:
            return False
        req.block_ids.extend(got)
        return True

    def _cache_full_blocks(self, req: Request) -> None:
        """Registers the request's newly computed full blocks in the prefix cache (without one, a recurrent
        model's states saved after them count all the same: ``_confirm_uncached_saves``)."""
        # Only blocks of known tokens: a pending token's block gets its hash when the token arrives.
        full = min(req.num_computed_tokens, req.num_tokens - req.num_pending) // self.blocks.block_size
        if not self.config.caches_prefixes:
            if self.checkpoints.capacity:
                self._confirm_uncached_saves(req, full)
            return
        if full <= req.num_cached_blocks:
            return
        extend_hashes(req.block_hashes, req.token_ids, self.blocks.block_size, self.seed_of(req))
        for i in range(max(req.num_cached_blocks, req.num_dropped_blocks), full):
            self.blocks.cache(req.block_ids[i], req.block_hashes[i])
            if self.checkpoints.capacity:  # a state saved where this block ends counts now
                self._confirm_state_save(req, i)
            self._computing.pop(req.block_hashes[i], None)  # in the cache now: waiters find it there
        req.num_cached_blocks = full

    def _preempt(self, req: Request) -> None:
        """Swap the KV to host blocks when configured and it fits, else drop it for recompute."""
        self.running.remove(req)
        req.num_preemptions += 1
        self._preempted_now.add(req.request_id)
        host = self.host_blocks.allocate(len(req.live_block_ids)) if self.can_swap_out(req) else None
        self.preemptions["recompute" if host is None else "swap"] += 1
        if host is None:
            self._release(req)
            req.status = RequestStatus.WAITING
            self.waiting.appendleft(req)
            return
        self._move_out(req, host)

    def _move_out(self, req: Request, host: list[int]) -> None:
        self._preempted_now.add(req.request_id)
        self._swap_out.extend(zip(req.live_block_ids, host, strict=True))
        if self.config.recurrent_state:  # its state leaves the device with its blocks
            self._swapped_out.append(req.request_id)
        self.blocks.free(req.block_ids)
        # The worker keeps the sequence; its new block table is sent in full when it runs again.
        req.block_ids, req.host_block_ids = [], host
        req.num_cached_blocks = 0  # re-registered from the swapped-in copies
        self._sent_blocks.pop(req.request_id, None)
        req.status = RequestStatus.SWAPPED
        self.swapped.append(req)

    def _move_in(self, req: Request, dev: list[int]) -> None:
        self._swap_in.extend(zip(req.host_block_ids, dev, strict=False))  # dev may hold room to grow
        self._host_to_free.extend(req.host_block_ids)
        # Blocks dropped out of a sliding window were not swapped: the null block stands in for them again.
        req.host_block_ids, req.block_ids = [], [self.blocks.null_block] * req.num_dropped_blocks + dev
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self._swapped_in_now.add(req.request_id)

    def _release(self, req: Request) -> None:
        self._forget_computing(req)
        if self._caches_tails:
            self._cache_tail(req)
        self.blocks.free(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = req.num_cached_blocks = req.num_dropped_blocks = 0
        self._sent_blocks.pop(req.request_id, None)
        if req.request_id in self._on_worker:
            self._on_worker.discard(req.request_id)
            self._to_drop.append(req.request_id)

    def _forget(self, req: Request) -> None:
        """The request leaves this scheduler (finished, handed off)."""
        self._forget_computing(req)
        self.leaving.pop(req.request_id, None)
        del self.requests[req.request_id]
        self.policy.on_remove(req)

    def _fill_plan(self, plan: StepPlan, scheduled: list[tuple[Request, int]]) -> None:
        for req, n in scheduled:
            rid = req.request_id
            sent = self._sent_blocks.get(rid)
            if rid in self._on_worker and sent is None:  # resumed from a swap: the whole table is new
                plan.continuing.append(ContinuingSequence(rid, [], block_ids=list(req.block_ids)))
            elif rid in self._on_worker:
                if sent < len(req.block_ids):  # otherwise nothing changed: the id in num_scheduled_tokens is all
                    plan.continuing.append(ContinuingSequence(rid, req.block_ids[sent:]))
            else:
                plan.new.append(NewSequence(rid, req.all_token_ids, len(req.prompt_token_ids),
                                            req.num_computed_tokens, list(req.block_ids), req.params, req.lora,
                                            req.state_checkpoint))
                self._on_worker.add(rid)
            save = self._state_save(req, n) if self.checkpoints.capacity else None
            if save is not None:
                plan.state_saves[rid] = save
            self._sent_blocks[rid] = len(req.block_ids)
            plan.num_scheduled_tokens[rid] = n

    def check_integrity(self) -> None:
        owners = {r.request_id: r.block_ids for r in [*self.running, *self.arriving.values()]}
        owners.update({f"{rid} (handed off)": ids for rid, ids in self.handed_off.items()})
        owners.update({f"{r.request_id} (landing {i})": r.block_ids for i, r in enumerate(self.landing)})
        self.blocks.check_integrity(owners)
        assert all(r.status is RequestStatus.RUNNING and r.block_ids for r in self.running), "running w/o blocks"
        assert all(r.status is RequestStatus.ARRIVING for r in self.arriving.values())
        assert all(r.status is RequestStatus.WAITING and not r.block_ids for r in self.waiting)
        assert all(r.status is RequestStatus.SWAPPED and not r.block_ids for r in self.swapped)
        assert all(self.requests[rid].status is RequestStatus.RUNNING for rid in self.leaving), "leaving, not running"
        live = len(self.running) + len(self.waiting) + len(self.swapped) + len(self.arriving)
        assert live == len(self.requests), f"{live} requests queued, {len(self.requests)} known"
        self.policy.check_integrity(self.requests)
        if self.host_blocks is not None:
            owned = {r.request_id: r.host_block_ids for r in self.swapped}
            owned["(read by the last plan's swap-ins)"] = self._host_to_free
            self.host_blocks.check_integrity(owned)
