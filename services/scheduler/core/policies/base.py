"""The step-policy interface, the step being composed, and the parts policies are built from.

A policy decides *who runs in a step and with how many tokens, and who gives way*; the ``Scheduler`` owns
the machinery it calls for that (``admit``, ``reserve_or_preempt``, ``swap_in``, ``swap_out``,
``swap_in_fifo``: blocks, prefix cache, swaps, the plan). Each step the scheduler builds a ``Step`` and calls
``policy.compose(scheduler, step)``; the policy appends ``(request, tokens)`` pairs with ``step.add``.

Parts shared by the first-come-first-served policies (STYLE §9: a decode set, a prompt admitter, a
preemption rule): ``run_decodes``, ``run_prompts`` and ``Policy.pick_victim`` (newest arrival first).
Requests' ``priority`` comes before arrival in all three (``by_priority``, ``rank``): with one priority, the
order is plain first come first served.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, ClassVar

from services.scheduler.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from services.scheduler.core.config import SchedulerConfig
    from services.scheduler.core.scheduler import Scheduler

INF = float("inf")


class Step:
    """One step being composed: what is scheduled so far and what is left of its budgets."""

    __slots__ = ("now", "tokens", "prompt_tokens", "max_seqs", "scheduled", "ids")

    def __init__(self, now: float, tokens: float, max_seqs: int) -> None:
        self.now = now  # seconds, the caller's clock (or the core's logical clock)
        self.tokens = tokens  # left of max_num_batched_tokens: every token counts
        self.prompt_tokens = INF  # left of the prompt-token (chunk) budget; set by chunking policies
        self.max_seqs = max_seqs
        self.scheduled: list[tuple[Request, int]] = []
        self.ids: set[str] = set()  # request ids in ``scheduled``

    @property
    def room(self) -> float:
        """Prompt tokens this step can still take."""
        return min(self.tokens, self.prompt_tokens)

    @property
    def full(self) -> bool:
        return len(self.scheduled) >= self.max_seqs

    def add(self, req: Request, n: int, prompt: bool) -> None:
        self.scheduled.append((req, n))
        self.ids.add(req.request_id)
        self.tokens -= n
        if prompt:
            self.prompt_tokens -= n


class Policy(abc.ABC):
    """Chooses each step's requests and token counts; one instance per ``Scheduler``.

    Hooks the scheduler calls (all optional but ``compose``):

    * ``on_add(req, now)`` when a request enters (``add``, ``reserve_arrival``), ``on_remove(req)`` when it
      leaves (finished, aborted, handed off, drained);
    * ``compose(s, step)`` once per ``schedule()``;
    * ``on_step_done(reqs, elapsed, now)`` at the next ``schedule()``, with the requests that ran in the
      previous plan and how long it took on the scheduler's clock;
    * ``pick_victim(s, req, candidates)`` when ``req`` needs blocks and the pool is short.
    """

    name: ClassVar[str]
    # Prompts may run in chunks (the chunk budget applies); False: a prompt runs whole or waits.
    chunked: ClassVar[bool] = False
    # The preemption mode when SchedulerConfig.preemption_mode is None.
    default_preemption: ClassVar[str] = "recompute"

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    @abc.abstractmethod
    def compose(self, s: Scheduler, step: Step) -> None:
        """Adds this step's ``(request, tokens)`` to ``step`` through ``s``'s machinery, within its budgets."""

    def pick_victim(self, s: Scheduler, req: Request, candidates: list[Request]) -> Request | None:
        """Which of ``candidates`` (resident, not scheduled this step; ``req`` among them when resident) gives
        its blocks to ``req``; ``req`` itself means it gives way, None that nobody does. Default: the least
        important, newest arrival (vLLM's rule), so the oldest request of the highest priority always keeps its
        work; a waiting prompt takes blocks only from less important requests."""
        victim = newest(candidates)
        if victim is not None and req.status is RequestStatus.WAITING and victim.priority <= req.priority:
            return None
        return victim

    def on_add(self, req: Request, now: float) -> None:  # noqa: B027 - optional hook
        pass

    def on_remove(self, req: Request) -> None:  # noqa: B027 - optional hook
        pass

    def on_step_done(self, reqs: list[Request], elapsed: float, now: float) -> None:  # noqa: B027
        pass

    def on_config(self, config: SchedulerConfig) -> None:
        """The scheduler's config changed (a calibrated step-time model): what was derived from it follows."""
        self.config = config

    def queue_lengths(self, queued: list[Request]) -> list[int]:
        """Requests waiting for a turn per priority level, highest first; one level unless overridden."""
        return [len(queued)]

    def check_integrity(self, requests: Mapping[str, Request]) -> None:  # noqa: B027 - optional hook
        """Asserts the policy's own state agrees with the scheduler's ``requests``."""


def rank(req: Request) -> tuple[int, float, str]:
    """Who goes first: the highest priority (the lowest value), then the earliest arrival."""
    return req.priority, req.arrival_time, req.request_id


def newest(reqs: Iterable[Request]) -> Request | None:
    """The last in ``rank``: the first to give way."""
    return max(reqs, key=rank, default=None)


def by_priority(reqs: list[Request]) -> list[Request]:
    """``reqs``, the more important first, in their given order within a priority."""
    if all(r.priority == 0 for r in reqs):  # the common case: nothing to sort
        return reqs
    return sorted(reqs, key=lambda r: r.priority)  # stable


def chunk_budget(config: SchedulerConfig) -> tuple[float, bool]:
    """The prompt-token budget of a chunking policy and whether decodes count against it: ``chunk_size``
    (they do not), else tau from ``tbt_target_s`` (they do, as in Sarathi-Serve), else no limit."""
    if config.chunk_size is not None:
        return config.chunk_size, False
    if config.tbt_target_s is not None:
        tau = config.derived_token_budget
        return (INF if tau is None else tau), True
    return INF, False


def prompts_in_turn(s: Scheduler) -> list[Request]:
    """The running prompts' next chunks and the waiting prompts, in the order ``run_prompts`` serves them: by
    priority, running before waiting, running ones by arrival: the reverse of the order they give way in
    (``pick_victim``). A running chunk short of blocks then waits only when it is the newest of them; ahead of
    an older one that holds its blocks (admitted after it: a kvcache lookup first, or by priority), neither
    would ever run, each waiting for the other to give way."""
    return by_priority(sorted((r for r in s.running if not r.is_decoding), key=rank) + list(s.waiting))


def admit_by_priority(s: Scheduler, step: Step, room: float) -> None:
    """Admits the most important waiting prompt before the step is composed when it outranks a running request,
    taking blocks from less important requests if it must (``pick_victim``): those decode first in every step,
    so once in the step they could no longer give way, and would hold their blocks until they finish."""
    if not (s.waiting and s.running):
        return
    top = min(s.waiting, key=rank)
    if top.priority < max(r.priority for r in s.running):
        s.admit(top, room, step, evict=True)


def run_decodes(s: Scheduler, step: Step, reqs: Iterable[Request]) -> int:
    """The decode set: one token for each running decode in ``reqs``, in order, while the token budget and
    the sequence slots last; a decode short of blocks preempts per the policy's rule (possibly itself).
    Returns how many decodes were scheduled."""
    n = 0
    for req in reqs:
        if step.tokens < 1 or step.full:
            break
        if req.status is not RequestStatus.RUNNING:
            continue  # preempted by an earlier decode in this loop
        if s.reserve_or_preempt(req, 1, step):
            step.add(req, 1, prompt=False)
            n += 1
    return n


def run_prompts(s: Scheduler, step: Step, reqs: Iterable[Request], whole: bool) -> None:
    """The first-come-first-served prompt admitter: running prompts' next chunks and new prompts, in order,
    within the prompt budget. It stops at the first prompt that does not fit (no later prompt jumps it),
    and admits nothing new while a swapped request waits to resume. ``whole``: no chunking."""
    for req in reqs:
        room = step.room
        if room < 1 or step.full or (whole and req.num_uncomputed > room):
            break
        if req.status is RequestStatus.SWAPPED:
            continue  # swapped out by an earlier prompt in this loop; it resumes before any new prompt
        if req.status is RequestStatus.WAITING:
            if s.swapped:
                break
            # Short of blocks, a prompt may take them from less important requests (pick_victim).
            n = s.admit(req, room, step, evict=True)
            if not n:
                break
        else:
            n = int(min(req.num_uncomputed, room))
            if not s.reserve_or_preempt(req, n, step, may_preempt_self=False):
                break
        step.add(req, n, prompt=True)
