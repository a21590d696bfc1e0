"""FastServe's skip-join multi-level feedback queue (papers.md §2.1-2.3), as plain bookkeeping.

Level i has quantum ``q[i] = base * ratio**i``; level 0 runs first, first in first out inside a level::

    join:     level = min{i : q[i] >= predicted time of the job's first step}     (skip-join)
    each step a job runs, it is charged the step's duration; served >= q[level] -> level + 1, served = 0
    not run for starvation_s -> level 0 (starvation promotion)

Order inside a level is a ticket: joining the back takes the next positive ticket, joining the front the
next negative one, so sorting by ``(level, ticket)`` is the priority order. A request's own ``priority`` (the
API's) comes before all of it: the MLFQ orders each priority class, a more important class runs first. A job
keeps its ticket while it stays in its level, so the jobs at the head of a queue keep running until their
quantum is used.

**Wait bound** (``max_wait_ratio``; in neither FastServe source, off by default). MLFQ can keep a job that has
started waiting behind every later short job, without limit short of starvation promotion. With the bound,
a job that has run is *overdue* once::

    waited = now - joined - ran  >  max_wait_ratio * ran + wait_slack_s + credit

and overdue jobs run ahead of every level, oldest first. At any moment the job could finish with its next
token, so this keeps its latency within ``(1 + max_wait_ratio)`` times its service, plus slack and credit,
whatever its length. ``credit`` (``wait_credit="fcfs"``) is a lower bound on the wait it would have had
under FCFS anyway (``virtual_fcfs.py``): a job that would have queued under FCFS may wait as long here.

``enst`` is the paper's estimated next scheduled time (§2.3): the smaller of the time until starvation
promotes the job and the work ahead of it spread over the batch slots, where a job ahead at a higher level
``l`` runs out its quantum there and the quanta of every level between ``l`` and the job's own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.scheduler.core.policies.virtual_fcfs import VirtualFCFS
from services.scheduler.core.request import Request

if TYPE_CHECKING:
    from services.scheduler.core.config import MLFQConfig
    from services.scheduler.core.step_time import StepTimeModel


@dataclass
class MLFQJob:
    level: int
    ticket: int  # position inside the level: smaller first
    last_run: float  # when it last ran (or joined): the starvation clock
    joined: float  # when it joined the queue (arrival on the scheduler's clock)
    seq: int  # arrival order, for ties in ``joined``
    served: float = 0.0  # seconds run at this level
    ran: float = 0.0  # seconds run in all: the service it has had


class MLFQ:
    def __init__(self, config: MLFQConfig, step_time: StepTimeModel, slots: int = 1) -> None:
        self.config = config
        self.step_time = step_time
        self.base = config.base_quantum_s or step_time.predict(1)
        self.jobs: dict[str, MLFQJob] = {}
        self._back = itertools.count(1)
        self._front = itertools.count(-1, -1)
        self._arrivals = itertools.count()
        self._steps = 0
        bounded = config.max_wait_ratio is not None
        self.fcfs = VirtualFCFS(slots) if bounded and config.wait_credit == "fcfs" else None
        self._credit: dict[str, float] = {}
        self._shortest_step = math.inf  # the FCFS replay's seconds per token unless fcfs_step_s is given

    def quantum(self, level: int) -> float:
        return self.base * self.config.quantum_ratio**level

    def quanta_through(self, level: int) -> float:
        """q[0] + ... + q[level] (0 for level -1)."""
        r = self.config.quantum_ratio
        return self.base * (r ** (level + 1) - 1) / (r - 1)

    def level_for(self, seconds: float) -> int:
        """The skip-join level: the first whose quantum covers ``seconds``."""
        if not self.config.skip_join or seconds <= self.base:
            return 0
        level = math.ceil(math.log(seconds / self.base, self.config.quantum_ratio) - 1e-9)
        while self.quantum(level) < seconds:  # guard against rounding in the logarithm
            level += 1
        return self._clamp(level)

    def retime(self, step_time: StepTimeModel) -> None:
        """Quanta and skip-join levels from a corrected step-time model (jobs keep their levels)."""
        self.step_time = step_time
        self.base = self.config.base_quantum_s or step_time.predict(1)

    def join(self, req: Request, first_step_tokens: int, now: float) -> None:
        level = self.level_for(self.step_time.predict(first_step_tokens))
        self.jobs[req.request_id] = MLFQJob(level, next(self._back), now, now, next(self._arrivals))
        if self.fcfs is not None:
            self.fcfs.join(req.request_id, now)

    def leave(self, request_id: str) -> None:
        self.jobs.pop(request_id, None)
        if self.fcfs is not None:
            self.fcfs.leave(request_id)

    def charge(self, reqs: Iterable[Request], elapsed: float, now: float) -> None:
        """The jobs in ``reqs`` ran for ``elapsed`` seconds: demote those whose quantum is used."""
        last = None if self.config.num_levels is None else self.config.num_levels - 1
        if elapsed > 0:
            self._shortest_step = min(self._shortest_step, elapsed)
        for req in reqs:
            if self.fcfs is not None:
                self.fcfs.progress(req.request_id, len(req.output_token_ids))
            job = self.jobs[req.request_id]
            job.last_run = now
            job.served += elapsed
            job.ran += elapsed
            if job.served >= self.quantum(job.level) and job.level != last:
                self._move(job, job.level + 1)

    def promote_starved(self, live: Iterable[Request], now: float) -> list[str]:
        """Every ``starvation_check_steps`` calls: jobs not run for ``starvation_s`` go to level 0."""
        self._steps += 1
        if self._steps % self.config.starvation_check_steps:
            return []
        promoted = []
        for req in live:
            job = self.jobs[req.request_id]
            if now - job.last_run >= self.config.starvation_s:
                job.last_run = now
                self._move(job, 0)
                promoted.append(req.request_id)
        return promoted

    def order(self, live: Iterable[Request], now: float | None = None) -> list[Request]:
        """Priority order, ``(priority, level, ticket)``; with the wait bound on and ``now`` given, overdue jobs
        come first in their priority class, oldest first."""
        jobs = self.jobs
        if self.config.max_wait_ratio is None or now is None:
            return sorted(live, key=lambda r: (r.priority, jobs[r.request_id].level, jobs[r.request_id].ticket))
        if self.fcfs is not None:
            step_s = self.config.fcfs_step_s or (0.0 if math.isinf(self._shortest_step) else self._shortest_step)
            self._credit = self.fcfs.waits(step_s)

        def key(r: Request) -> tuple[int, int, float, int]:
            job = jobs[r.request_id]
            if self.overdue(r.request_id, now):
                return r.priority, 0, job.joined, job.seq
            return r.priority, 1, job.level, job.ticket

        return sorted(live, key=key)

    def overdue(self, request_id: str, now: float) -> bool:
        """Whether the job has waited past the wait bound (see the module's docstring); False when it is off.
        The FCFS credit is the one the latest ``order`` computed."""
        ratio, job = self.config.max_wait_ratio, self.jobs[request_id]
        if ratio is None or job.ran <= 0:
            return False
        allowed = ratio * job.ran + self.config.wait_slack_s + self._credit.get(request_id, 0.0)
        return now - job.joined - job.ran > allowed

    def enst(self, order: list[Request], now: float, batch_slots: int) -> dict[str, float]:
        """Estimated next scheduled time of each job in ``order`` (the priority order), seconds from now."""
        out = {}
        ahead_left = 0.0  # quantum left of every job ahead, at its own level
        higher_n, higher_q = 0, 0.0  # jobs ahead at higher levels, and the sum of their quanta_through(level)
        level, level_n = -1, 0
        for req in order:
            job = self.jobs[req.request_id]
            if job.level != level:
                higher_n += level_n
                higher_q += level_n * self.quanta_through(level) if level_n else 0.0
                level, level_n = job.level, 0
            # Jobs ahead at level l < L also run the quanta of levels l+1 .. L-1 before this one's turn (none
            # when a less important priority class starts again at a lower level: an estimate, as a whole).
            between = max(0.0, higher_n * self.quanta_through(level - 1) - higher_q)
            execute = (ahead_left + between) / batch_slots
            promote = max(0.0, self.config.starvation_s - (now - job.last_run))
            out[req.request_id] = min(execute, promote)
            ahead_left += max(0.0, self.quantum(level) - job.served)
            level_n += 1
        return out

    def lengths(self, queued: Iterable[Request]) -> list[int]:
        deepest = max((j.level for j in self.jobs.values()), default=0)
        n = self.config.num_levels or deepest + 1
        counts = [0] * n
        for req in queued:
            counts[self.jobs[req.request_id].level] += 1
        return counts

    def _move(self, job: MLFQJob, level: int) -> None:
        job.level, job.served = self._clamp(level), 0.0
        job.ticket = next(self._front) if self.config.requeue_front else next(self._back)

    def _clamp(self, level: int) -> int:
        n = self.config.num_levels
        return level if n is None else min(level, n - 1)
