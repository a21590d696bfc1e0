"""The scheduler core: continuous batching over a paged KV pool, with a step policy chosen by name.

Pure logic: no I/O, no clock reads, no torch. A step under ``sarathi`` (Sarathi-Serve's stall-free batching)::

    1. running decodes first (one token each) — a decode never waits behind a prompt;
    2. then the running prompt's next chunk, then new prompts, while the prompt-token budget lasts;
    3. under block pressure the newest running request is preempted (swapped or dropped for recompute).

Under ``vllm`` (the classic prefill-first baseline) a step is either whole new prompts, whenever one fits,
or decodes only. Swapped requests resume before any new prompt is admitted.

``schedule()`` returns a ``StepPlan``; ``on_result()`` applies the sampled tokens and returns events for the
caller to stream. The caller owns time: ``add`` takes the arrival time as an argument.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from services.common.block_hash import extend_hashes
from services.common.sampling_params import FinishReason, check_stop
from services.common.step import ContinuingSequence, NewSequence, SampledToken, StepPlan, StepResult
from services.scheduler.core.block_manager import BlockManager
from services.scheduler.core.request import Request, RequestStatus

POLICIES = ("sarathi", "vllm")


@dataclass(frozen=True)
class SchedulerConfig:
    # Most tokens (decodes + prompt chunks) in one step; None = no limit.
    max_num_batched_tokens: int | None = None
    # Most prompt tokens in one step (the chunk budget); None = whole prompts.
    chunk_size: int | None = None
    # Most sequences in one step.
    max_num_seqs: int = 256
    # A request stops with finish reason "length" when prompt + output reach this.
    max_model_len: int = 4096
    # Reuse the KV of full blocks whose chained hash matches (PagedAttention's prefix sharing).
    enable_prefix_caching: bool = True
    # "sarathi": stall-free batching, decodes first then prompt chunks within chunk_size (Sarathi-Serve);
    # "vllm": prefill-first, a step of whole prompts whenever one fits, else decodes (vLLM's classic policy).
    policy: str = "sarathi"
    # "swap": a preempted request's KV is copied to host blocks while the host pool has room (recompute when
    # it has none); "recompute": its KV is dropped and recomputed when it runs again.
    preemption_mode: str = "recompute"

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "chunk_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None (no limit), got {value}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.preemption_mode not in ("swap", "recompute"):
            raise ValueError(f"preemption_mode must be swap or recompute, got {self.preemption_mode!r}")


@dataclass
class TokenEvent:
    request_id: str
    token: SampledToken
    finish_reason: str | None


@dataclass
class _Budget:
    """What is left of one step's token budgets."""

    tokens: float  # decodes + prompt tokens
    prompt_tokens: float  # prompt tokens (the chunk budget)


@dataclass
class PrefixCacheStats:
    queried_blocks: int = 0  # full prompt blocks looked up at admission
    hit_blocks: int = 0  # of those, served from the cache


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager, host_blocks: BlockManager | None = None,
                 hash_seed: int = 0) -> None:
        """``blocks``: the worker's device pool; ``host_blocks``: its host pool, for swapping (None: no swap).
        ``hash_seed`` names the model and KV layout (``block_hash.hash_seed``): hashes never match across."""
        self.config = config
        self.blocks = blocks
        self.host_blocks = host_blocks
        self.hash_seed = hash_seed
        self.prefix_stats = PrefixCacheStats()
        self.preemptions = {"swap": 0, "recompute": 0}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()  # resumed first in first out, before any new prompt
        self.arriving: dict[str, Request] = {}  # KV being transferred in; not schedulable yet
        self.handed_off: dict[str, list[int]] = {}  # blocks held while their KV is sent to another worker
        self.requests: dict[str, Request] = {}
        self._on_worker: set[str] = set()  # requests whose state the worker holds
        self._to_drop: list[str] = []  # finished/preempted since the last plan: the worker drops them
        self._sent_blocks: dict[str, int] = {}  # blocks of each request the worker already knows
        # Block copies for the next plan. The worker runs swap-outs before swap-ins, so a device block freed
        # by a swap-out may be a swap-in target; host blocks read by a swap-in are freed one plan later so a
        # swap-out in the same plan cannot overwrite them first.
        self._swap_out: list[tuple[int, int]] = []
        self._swap_in: list[tuple[int, int]] = []
        self._host_to_free: list[int] = []
        self._swapped_in_now: set[str] = set()
        self._step_id = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish(self, request_id: str, reason: str = FinishReason.ABORT) -> None:
        """Ends a request early (abort, stop string seen by the detokenizer); frees its blocks."""
        req = self.requests.get(request_id)
        if req is None or req.status is RequestStatus.FINISHED:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req in self.swapped:
            self.swapped.remove(req)
            self.host_blocks.free(req.host_block_ids)
            req.host_block_ids = []
        self.arriving.pop(request_id, None)
        self._release(req)
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        del self.requests[request_id]

    # --- Disaggregated hand-off: a prompt runs on a prefill worker, its KV moves, decoding continues here ---

    def hand_off(self, request_id: str) -> list[int]:
        """Ends a running request on this worker but keeps its blocks: their KV is about to be sent to another
        worker. The caller calls ``release_handed_off`` once the transfer ended."""
        req = self.requests.pop(request_id)
        self.running.remove(req)
        held, req.block_ids = req.block_ids, []
        self._sent_blocks.pop(request_id, None)
        if request_id in self._on_worker:
            self._on_worker.discard(request_id)
            self._to_drop.append(request_id)  # the worker drops the sequence; block contents stay
        req.status = RequestStatus.FINISHED
        self.handed_off[request_id] = held
        return list(held)

    def release_handed_off(self, request_id: str) -> None:
        self.blocks.free(self.handed_off.pop(request_id))

    def reserve_arrival(self, request: Request) -> list[int] | None:
        """Takes a request whose ``num_computed_tokens`` were computed on another worker and reserves blocks
        for them; it waits (ARRIVING) until ``arrive``. None when the pool cannot hold them now."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        got = self.blocks.allocate(self.blocks.blocks_needed(request.num_computed_tokens, 0))
        if got is None:
            return None
        request.block_ids, request.num_cached_blocks = got, 0
        request.status = RequestStatus.ARRIVING
        self.requests[request.request_id] = request
        self.arriving[request.request_id] = request
        return list(got)

    def arrive(self, request_id: str) -> None:
        """The request's KV landed in its blocks: it runs from the next step on."""
        req = self.arriving.pop(request_id)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self._cache_full_blocks(req)

    def cancel_arrival(self, request_id: str) -> None:
        """The transfer failed: the request recomputes its KV here, queued ahead of new prompts."""
        req = self.arriving.pop(request_id)
        self._release(req)
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    def drain(self) -> list[Request]:
        """Removes every request (the worker died): each comes back reset to be recomputed elsewhere, with
        the tokens it already produced. The pools are abandoned with the worker."""
        reqs = sorted(self.requests.values(), key=lambda r: (r.arrival_time, r.request_id))
        for req in reqs:
            req.block_ids, req.host_block_ids = [], []
            req.num_computed_tokens = req.num_cached_blocks = 0
            req.status = RequestStatus.WAITING
        self.requests.clear()
        self.arriving.clear()
        self.handed_off.clear()
        self.waiting.clear()
        self.running.clear()
        self.swapped.clear()
        return reqs

    def schedule(self) -> StepPlan:
        self._step_id += 1
        if self._host_to_free:
            self.host_blocks.free(self._host_to_free)
            self._host_to_free = []
        self._swapped_in_now = self._swap_in_what_fits()
        chunked = self.config.policy == "sarathi"  # vllm runs prompts whole: chunk_size does not apply
        budget = _Budget(self.config.max_num_batched_tokens or float("inf"),
                         (self.config.chunk_size if chunked else None) or float("inf"))
        scheduled: list[tuple[Request, int]] = []
        if self.config.policy == "vllm":
            # vLLM's classic prefill-first policy: a step of whole new prompts whenever one fits (running
            # decodes stall meanwhile), otherwise a decode-only step.
            self._schedule_prompts(scheduled, budget, whole=True)
            if not scheduled:
                self._schedule_decodes(scheduled, budget)
        else:
            # Sarathi-Serve's stall-free batching: decodes first, then prompt chunks within the budget.
            self._schedule_decodes(scheduled, budget)
            self._schedule_prompts(scheduled, budget, whole=False)
        # Preemptions above land in this plan's drop list, which the worker applies before adding sequences.
        plan = StepPlan(self._step_id, finished=self._to_drop, swap_out=self._swap_out, swap_in=self._swap_in)
        self._to_drop, self._swap_out, self._swap_in = [], [], []
        self._fill_plan(plan, scheduled)
        return plan

    def _schedule_decodes(self, scheduled: list[tuple[Request, int]], budget: _Budget) -> None:
        """Running decodes, oldest first; the newest are preempted while blocks run out."""
        for req in [r for r in self.running if r.is_decoding]:
            if budget.tokens < 1 or len(scheduled) >= self.config.max_num_seqs:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted by an older decode in this loop
            if not self._reserve_or_preempt(req, 1, scheduled):
                continue
            scheduled.append((req, 1))
            budget.tokens -= 1

    def _schedule_prompts(self, scheduled: list[tuple[Request, int]], budget: _Budget, whole: bool) -> None:
        """Running prompts' next chunks, then new prompts, first come first served within the budget.

        ``whole``: a prompt runs entirely in this step or waits (no chunking).
        """
        for req in [r for r in self.running if not r.is_decoding] + list(self.waiting):
            room = min(budget.tokens, budget.prompt_tokens)
            if room < 1 or len(scheduled) >= self.config.max_num_seqs or (whole and req.num_uncomputed > room):
                break
            if req.status is RequestStatus.WAITING and (self.swapped or not self._admit(req, room)):
                break  # FCFS: no later prompt jumps a prompt that does not fit, nor a swapped request
            n = int(min(req.num_uncomputed, room))
            if req.status is RequestStatus.RUNNING and not self._reserve_or_preempt(req, n, scheduled, False):
                break
            if req.status is RequestStatus.WAITING:
                self.waiting.remove(req)
                self.running.append(req)
                req.status = RequestStatus.RUNNING
            scheduled.append((req, n))
            budget.tokens -= n
            budget.prompt_tokens -= n

    def _swap_in_what_fits(self) -> set[str]:
        """Moves swapped requests, oldest first, back to device blocks while they fit."""
        resumed = set()
        while self.swapped:
            req = self.swapped[0]
            dev = self.blocks.allocate(len(req.host_block_ids))
            if dev is None:
                break
            self.swapped.popleft()
            self._swap_in.extend(zip(req.host_block_ids, dev, strict=True))
            self._host_to_free.extend(req.host_block_ids)
            req.host_block_ids, req.block_ids = [], dev
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            resumed.add(req.request_id)
        return resumed

    def on_result(self, plan: StepPlan, result: StepResult) -> list[TokenEvent]:
        events = []
        for rid, n in plan.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            req.num_computed_tokens += n
            self._cache_full_blocks(req)
            token = result.sampled.get(rid)
            if token is None:
                continue
            req.output_token_ids.append(token.token_id)
            reason = check_stop(req.params, req.output_token_ids, req.eos_token_ids)
            if reason is None and req.num_tokens >= self.config.max_model_len:
                reason = FinishReason.LENGTH
            events.append(TokenEvent(rid, token, reason))
            if reason is not None:
                self.finish(rid, reason)
        return events

    def _admit(self, req: Request, budget: float) -> bool:
        """Takes the cached prefix and blocks for the first chunk; on failure leaves ``req`` untouched."""
        cached: list[int] = []
        queried = 0
        if self.config.enable_prefix_caching:
            hashes = extend_hashes(req.block_hashes, req.all_token_ids, self.blocks.block_size, self.hash_seed)
            # At least one token must run: its logits give the next token.
            queried = min(len(hashes), (req.num_tokens - 1) // self.blocks.block_size)
            cached = self.blocks.cached_prefix(hashes[:queried])
            self.blocks.take_cached(cached)
        req.block_ids = list(cached)
        req.num_cached_blocks = len(cached)
        req.num_computed_tokens = len(cached) * self.blocks.block_size
        if not self._reserve(req, int(min(req.num_uncomputed, budget))):
            self.blocks.free(cached)
            req.block_ids, req.num_computed_tokens, req.num_cached_blocks = [], 0, 0
            return False
        if req.num_preemptions == 0:
            self.prefix_stats.queried_blocks += queried
            self.prefix_stats.hit_blocks += len(cached)
            req.num_prefix_hit_tokens = req.num_computed_tokens
        return True

    def _reserve(self, req: Request, n: int) -> bool:
        need = self.blocks.blocks_needed(req.num_computed_tokens + n, len(req.block_ids))
        got = self.blocks.allocate(need)
        if got is None:
            return False
        req.block_ids.extend(got)
        return True

    def _cache_full_blocks(self, req: Request) -> None:
        """Registers the request's newly computed full blocks in the prefix cache."""
        if not self.config.enable_prefix_caching:
            return
        full = req.num_computed_tokens // self.blocks.block_size
        if full <= req.num_cached_blocks:
            return
        extend_hashes(req.block_hashes, req.all_token_ids, self.blocks.block_size, self.hash_seed)
        for i in range(req.num_cached_blocks, full):
            self.blocks.cache(req.block_ids[i], req.block_hashes[i])
        req.num_cached_blocks = full

    def _reserve_or_preempt(self, req: Request, n: int, scheduled: list[tuple[Request, int]],
                            may_preempt_self: bool = True) -> bool:
        """Reserves blocks for ``n`` more tokens, preempting the newest request until they fit.

        Never preempts a request already scheduled this step, nor one just swapped in (its swap-in has not
        happened yet, so there is nothing to swap out). When ``req`` itself is the newest left it gives way
        if ``may_preempt_self`` (a decode), else it just waits for this step (a prompt chunk keeps its KV).
        """
        while not self._reserve(req, n):
            taken = {r.request_id for r, _ in scheduled} | self._swapped_in_now
            candidates = [r for r in self.running if r.request_id not in taken]
            victim = max(candidates, key=lambda r: (r.arrival_time, r.request_id)) if candidates else req
            if victim is req and not may_preempt_self:
                return False
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        """Swap the KV to host blocks when configured and it fits, else drop it for recompute."""
        self.running.remove(req)
        req.num_preemptions += 1
        host = None
        if (self.config.preemption_mode == "swap" and self.host_blocks is not None
                and req.request_id not in self._swapped_in_now):
            host = self.host_blocks.allocate(len(req.block_ids))
        self.preemptions["recompute" if host is None else "swap"] += 1
        if host is None:
            self._release(req)
            req.status = RequestStatus.WAITING
            self.waiting.appendleft(req)
            return
        self._swap_out.extend(zip(req.block_ids, host, strict=True))
        self.blocks.free(req.block_ids)
        # The worker keeps the sequence; its new block table is sent in full when it runs again.
        req.block_ids, req.host_block_ids = [], host
        req.num_cached_blocks = 0  # re-registered from the swapped-in copies
        self._sent_blocks.pop(req.request_id, None)
        req.status = RequestStatus.SWAPPED
        self.swapped.append(req)

    def _release(self, req: Request) -> None:
        self.blocks.free(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = req.num_cached_blocks = 0
        self._sent_blocks.pop(req.request_id, None)
        if req.request_id in self._on_worker:
            self._on_worker.discard(req.request_id)
            self._to_drop.append(req.request_id)

    def _fill_plan(self, plan: StepPlan, scheduled: list[tuple[Request, int]]) -> None:
        for req, n in scheduled:
            rid = req.request_id
            sent = self._sent_blocks.get(rid)
            if rid in self._on_worker and sent is None:  # resumed from a swap: the whole table is new
                plan.continuing.append(ContinuingSequence(rid, [], block_ids=list(req.block_ids)))
            elif rid in self._on_worker:
                plan.continuing.append(ContinuingSequence(rid, req.block_ids[sent:]))
            else:
                plan.new.append(NewSequence(rid, req.all_token_ids, len(req.prompt_token_ids),
                                            req.num_computed_tokens, list(req.block_ids), req.params))
                self._on_worker.add(rid)
            self._sent_blocks[rid] = len(req.block_ids)
            plan.num_scheduled_tokens[rid] = n

    def check_integrity(self) -> None:
        owners = {r.request_id: r.block_ids for r in [*self.running, *self.arriving.values()]}
        owners.update({f"{rid} (handed off)": ids for rid, ids in self.handed_off.items()})
        self.blocks.check_integrity(owners)
        assert all(r.status is RequestStatus.ARRIVING for r in self.arriving.values())
        assert all(r.status is RequestStatus.WAITING and not r.block_ids for r in self.waiting)
        assert all(r.status is RequestStatus.SWAPPED and not r.block_ids for r in self.swapped)
        if self.host_blocks is not None:
            owned = {r.request_id: r.host_block_ids for r in self.swapped}
            owned["(read by the last plan's swap-ins)"] = self._host_to_free
            self.host_blocks.check_integrity(owned)
