"""A lower bound on each job's queueing delay under run-to-completion FCFS, kept beside FastServe's MLFQ.

FCFS over ``B`` batch slots is list scheduling in arrival order: a job starts once it has arrived and a
slot is free, and holds the slot until it finishes, one token per step. A job's length is unknown until it
finishes, but the tokens it has produced so far are a lower bound, and FCFS start times only grow with
earlier jobs' lengths. So a replay of FCFS with ``tokens so far x step_s`` per job gives every job a wait
it would have had under FCFS at least (``step_s`` must not exceed a real step: the MLFQ uses the shortest
step it has seen)::

    free = [-inf] * B                                   (slot free times, a min-heap)
    for j in arrival order:  start = max(joined_j, pop(free));  push(start + tokens_j * step_s)
    wait_j >= start - joined_j

Jobs at the head of the arrival order that have left (their lengths are final) are folded into ``free``
once and dropped, so each replay covers the jobs from the oldest live one on.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass
class _Job:
    rid: str
    joined: float
    tokens: int = 0
    done: bool = False


class VirtualFCFS:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self._free = [-float("inf")] * slots
        self._jobs: list[_Job] = []  # arrival order, from the oldest not folded yet
        self._live: dict[str, _Job] = {}

    def join(self, rid: str, now: float) -> None:
        job = _Job(rid, now)
        self._jobs.append(job)
        self._live[rid] = job

    def progress(self, rid: str, tokens: int) -> None:
        """``rid`` has produced ``tokens`` output tokens so far."""
        job = self._live.get(rid)
        if job is not None:
            job.tokens = max(job.tokens, tokens)

    def leave(self, rid: str) -> None:
        job = self._live.pop(rid, None)
        if job is not None:
            job.done = True

    def waits(self, step_s: float) -> dict[str, float]:
        """The FCFS wait lower bound of every live job, seconds."""
        jobs, free = self._jobs, self._free
        folded = 0
        while folded < len(jobs) and jobs[folded].done:
            self._place(free, jobs[folded], step_s)
            folded += 1
        del jobs[:folded]
        free = list(free)
        out = {}
        for job in jobs:
            start = self._place(free, job, step_s)
            if not job.done:
                out[job.rid] = start - job.joined
        return out

    @staticmethod
    def _place(free: list[float], job: _Job, step_s: float) -> float:
        start = max(job.joined, heapq.heappop(free))
        heapq.heappush(free, start + job.tokens * step_s)
        return start
