"""Two schedulers that know what FastServe cannot, for ``fastserve_fairness.py --oracles``: how much mean-latency
gain is left under "no request over 1.5x its FCFS latency" when the scheduler knows more.

* ``exact-credit``: the wait bound, each request credited its *exact* FCFS queueing delay W (from the fcfs run).
  A request may finish with its next token, so without its length the bound must hold at every step:
  ``waited <= 1.5 W + 0.5 x run so far``; overdue requests run first, least slack first, then the MLFQ order.
* ``clairvoyant``: also knows each request's length (here ``max_tokens``: the bench runs with ``ignore_eos``) and
  its FCFS latency E. A request whose slack ``1.5 E - age - remaining tokens x step_s`` falls below ``margin_s``
  runs first, least slack first; the others run shortest remaining first.

Both replace the MLFQ object inside a ``fastserve`` policy of a simulation (not the core's code), so skip-join,
swapping and the step composition stay FastServe's.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.scheduler.core.policies.mlfq import MLFQ
from services.scheduler.core.request import Request


class ExactCreditMLFQ(MLFQ):
    def __init__(self, base: MLFQ, fcfs_wait: dict[str, float]) -> None:
        super().__init__(base.config, base.step_time)
        self.fcfs_wait = fcfs_wait

    def order(self, live: Iterable[Request], now: float | None = None) -> list[Request]:
        jobs = self.jobs

        def key(r: Request) -> tuple[int, float, int]:
            job = jobs[r.request_id]
            slack = 1.5 * self.fcfs_wait[r.request_id] + 0.5 * job.ran - (now - job.joined - job.ran)
            return (0, slack, job.seq) if job.ran > 0 and slack < 0 else (1, job.level, job.ticket)

        return sorted(live, key=key)


class ClairvoyantMLFQ(MLFQ):
    def __init__(self, base: MLFQ, fcfs_e2e: dict[str, float], step_s: float, margin_s: float) -> None:
        super().__init__(base.config, base.step_time)
        self.fcfs_e2e, self.step_s, self.margin_s = fcfs_e2e, step_s, margin_s

    def order(self, live: Iterable[Request], now: float | None = None) -> list[Request]:
        def key(r: Request) -> tuple[int, float, float]:
            remaining = r.params.max_tokens - len(r.output_token_ids)
            slack = 1.5 * self.fcfs_e2e[r.request_id] - (now - r.arrival_time) - remaining * self.step_s
            return (0, slack, r.arrival_time) if slack < self.margin_s else (1, remaining, r.arrival_time)

        return sorted(live, key=key)
