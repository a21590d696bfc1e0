"""``fastserve`` and ``fastserve+sarathi``: skip-join MLFQ with token-level preemption and proactive KV
swapping (FastServe, papers.md §2).

Every live request (running, waiting, swapped) has a place in the MLFQ (``mlfq.py``); a step walks them in
priority order (the requests' own ``priority`` first, strictly, as in every policy; the MLFQ within one):

* **Token-level preemption.** Only the first ``max_num_seqs`` in that order run; a lower-priority running
  request that loses its slot keeps its KV and simply does not run this step. A higher-priority request
  short of blocks (to grow, to be admitted, to be swapped back in) takes them from resident requests
  *behind* it that are not in this step: the largest estimated next scheduled time first (``enst``; or the
  lowest priority first with ``swap_order="priority"``), swapped out while the host pool has room,
  recomputed otherwise. A decode with nobody behind it gives way itself.
* **Proactive swapping** (after the step is composed, when swapping is on): while fewer than
  ``reserve_frac`` of the device blocks are free, idle resident requests are swapped out, furthest next
  scheduled time first (never recomputed); when nothing was swapped out this step, swapped requests come
  back, soonest next scheduled time first, while the reserve stays free.

* **Wait bound** (``MLFQConfig.max_wait_ratio``, off by default): a started job that has waited too long
  for its service so far runs ahead of the queues (``mlfq.py``).

``fastserve`` runs prompts whole (FastServe's iteration-level batching): in priority order, a prompt that
does not fit the token budget is skipped for this step. ``fastserve+sarathi`` keeps the MLFQ's choice of
who runs but composes the step as Sarathi-Serve does: those requests' decodes first, then their prompt
chunks in priority order within the chunk budget (``chunk_size``, or tau from ``tbt_target_s``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from services.scheduler.core.policies.base import Policy, Step, chunk_budget, rank
from services.scheduler.core.policies.mlfq import MLFQ
from services.scheduler.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from collections.abc import Mapping

    from services.scheduler.core.config import SchedulerConfig
    from services.scheduler.core.scheduler import Scheduler


class FastServePolicy(Policy):
    name = "fastserve"
    default_preemption = "swap"

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.mlfq = MLFQ(config.mlfq, config.step_time, config.max_num_seqs)
        self.budget, self.decodes_count = chunk_budget(config) if self.chunked else (math.inf, False)
        self._rank: dict[str, int] = {}
        self._enst: dict[str, float] | None = None
        self._order: list[Request] = []
        self._now = 0.0

    # --- the queue -----------------------------------------------------------------------------------------

    def on_add(self, req: Request, now: float) -> None:
        self.mlfq.join(req, int(min(req.num_uncomputed, self.budget)), now)

    def on_remove(self, req: Request) -> None:
        self.mlfq.leave(req.request_id)

    def on_step_done(self, reqs: list[Request], elapsed: float, now: float) -> None:
        self.mlfq.charge(reqs, elapsed, now)

    def on_config(self, config: SchedulerConfig) -> None:
        super().on_config(config)
        self.mlfq.retime(config.step_time)
        self.budget, self.decodes_count = chunk_budget(config) if self.chunked else (math.inf, False)

    def queue_lengths(self, queued: list[Request]) -> list[int]:
        return self.mlfq.lengths(queued)

    def check_integrity(self, requests: Mapping[str, Request]) -> None:
        assert self.mlfq.jobs.keys() == requests.keys(), (
            f"MLFQ jobs {sorted(self.mlfq.jobs.keys() ^ requests.keys())[:5]} disagree with the scheduler's")

    # --- a step ----------------------------------------------------------------------------------------------

    def compose(self, s: Scheduler, step: Step) -> None:
        live = [*s.running, *s.waiting, *s.swapped]
        self.mlfq.promote_starved(live, step.now)
        self._order = self.mlfq.order(live, step.now)
        self._rank = {r.request_id: i for i, r in enumerate(self._order)}
        self._enst, self._now = None, step.now
        self._fill(s, step)
        if s.swap_enabled:
            self._swap_proactively(s, step)

    def _fill(self, s: Scheduler, step: Step) -> None:
        """Whole prompts and decodes, in priority order, until the slots are full; a prompt larger than what
        is left of the token budget is skipped for this step."""
        for req in self._order:
            if len(step.scheduled) >= step.max_seqs:
                break
            if req.is_decoding:
                if step.tokens >= 1:
                    self._run(s, step, req, 1, decode=True)
            elif req.num_uncomputed <= step.room:
                self._run(s, step, req, req.num_uncomputed, decode=False)

    def _run(self, s: Scheduler, step: Step, req: Request, n: int, decode: bool) -> bool:
        """Schedules ``n`` tokens of ``req`` when its blocks can be found (from requests behind it)."""
        status = req.status
        if status is RequestStatus.RUNNING:
            ok = s.reserve_or_preempt(req, n, step, may_preempt_self=decode)
        elif s.preempted_now(req):
            return False  # it gave its blocks to a request ahead of it in this step
        elif status is RequestStatus.SWAPPED:
            ok = s.swap_in(req, n, step, evict=True)
        else:
            n = s.admit(req, n, step, evict=True)
            ok = n > 0
        if ok:
            step.add(req, n, prompt=not decode)
        return ok

    def pick_victim(self, s: Scheduler, req: Request, candidates: list[Request]) -> Request | None:
        """A request that can be swapped out, behind ``req`` in priority: the furthest next scheduled time
        first (``enst``), or the lowest priority (``priority``). When none can, KV must be dropped for
        recompute, and that follows the requests' own priority and arrival as vLLM does (the least important
        newest gives way, possibly ``req`` itself): a fixed order, so the first in it always keeps its work and
        starvation promotions cannot make requests recompute each other forever."""
        place = self._rank
        own = place.get(req.request_id, -1)
        behind = [r for r in candidates
                  if r is not req and place.get(r.request_id, len(place)) > own and s.can_swap_out(r)]
        if behind:
            return max(behind, key=self._eviction_key)
        return max((r for r in candidates if rank(r) >= rank(req)), key=rank, default=None)

    def _eviction_key(self, req: Request) -> tuple[float, int]:
        """Larger goes to host first: (ENST, rank) under "enst", the rank alone under "priority"."""
        rank = self._rank.get(req.request_id, len(self._rank))
        if self.config.mlfq.swap_order == "priority":
            return 0.0, rank
        if self._enst is None:
            self._enst = self.mlfq.enst(self._order, self._now, self.config.max_num_seqs)
        return self._enst.get(req.request_id, math.inf), rank

    def _swap_proactively(self, s: Scheduler, step: Step) -> None:
        reserve = math.ceil(self.config.mlfq.reserve_frac * s.blocks.num_blocks)
        if s.blocks.num_free < reserve:
            idle = [r for r in s.running if r.request_id not in step.ids and not s.swapped_in_now(r)]
            for req in sorted(idle, key=self._eviction_key, reverse=True):
                if s.blocks.num_free >= reserve or not s.swap_out(req):
                    break
        if s.swapping_out:
            return  # no swap-in in a step that swapped out: no ping-pong
        back = sorted((r for r in s.swapped if not s.preempted_now(r)), key=self._eviction_key)
        for req in back[: self.config.max_num_seqs]:
            if s.blocks.num_free - len(req.host_block_ids) < reserve or not s.swap_in(req, 0, step):
                break


class FastServeSarathiPolicy(FastServePolicy):
    name = "fastserve+sarathi"
    chunked = True

    def _fill(self, s: Scheduler, step: Step) -> None:
        """The first max_num_seqs in priority order run: their decodes first, then their prompt chunks. Slots
        they leave (short of blocks) go to the next ones in order the same way, their decodes counting
        against what is left of a derived budget."""
        k = step.max_seqs
        step.prompt_tokens = self.budget
        for backfill, group in ((False, self._order[:k]), (True, self._order[k:])):
            decodes, prompts = [], []
            for req in group:
                (decodes if req.is_decoding else prompts).append(req)
            ran = 0
            for req in decodes:
                if len(step.scheduled) >= k or step.tokens < 1 or (
                        backfill and self.decodes_count and step.prompt_tokens < 1):
                    break
                ran += self._run(s, step, req, 1, decode=True)
            if self.decodes_count:
                step.prompt_tokens = max(0, step.prompt_tokens - ran)
            for req in prompts:
                if len(step.scheduled) >= k or step.room < 1:
                    break
                self._run(s, step, req, int(min(req.num_uncomputed, step.room)), decode=False)
