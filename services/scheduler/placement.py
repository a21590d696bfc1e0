"""Placement by token load (DualPath, papers.md §4.5): which prefill worker runs a prompt, which decode worker
takes the request over, and which side reads its cached prefix from storage.

Pure: plain data in, a choice out, no clock and no I/O (``ReadMeter`` is told the time). ``mesh.py`` and
``dual_path.py`` feed it each worker's live numbers. As in the paper, a worker's token count (the tokens of
its unfinished requests) stands in for its GPU, storage and network load; every worker is its own node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

# A prefill node whose storage reads queued at most this many seconds is preferred: its storage NIC would
# soon go idle (the paper's α: the tokens a node reads in 3 s).
READ_HORIZON_S = 3.0
# A decode worker may take up to this much over the mean token load before the others are preferred (Z).
DECODE_SLACK = 1.05


@dataclass(frozen=True)
class EngineLoad:
    """One worker as placement sees it, for one request."""

    name: str
    tokens: int  # tok_e: tokens (context and output so far) of its unfinished requests
    seqs: int = 0  # seq_e: its unfinished requests
    read_queue: int = 0  # tokens its node's storage reads have queued
    read_queue_s: float | None = None  # the same in seconds at the node's measured read rate (None: unknown)
    free_tokens: int = 0  # free KV memory, in tokens
    cached_tokens: int = 0  # tokens of this request's prompt its own prefix cache holds (work it is spared)
    group: str = ""  # decode placement balances across groups first; "" = its own group


def pick_prefill(engines: Sequence[EngineLoad], max_tokens: int | None = None) -> EngineLoad | None:
    """The prefill worker for one request (the PE fetch of §4.5).

    Never one over ``max_tokens`` (β; None: no cap). Preferred are the workers whose node's read queue
    drains within ``READ_HORIZON_S`` (or is not measured yet); among the preferred, else among the rest, the
    fewest tokens. A worker's own prefix cache counts against its tokens (our workers keep one; the paper's
    do not). None when every worker is over the cap.
    """
    ok = [e for e in engines if max_tokens is None or e.tokens <= max_tokens]
    soon_idle = [e for e in ok if e.read_queue_s is None or e.read_queue_s <= READ_HORIZON_S]
    pool = soon_idle or ok
    return min(pool, key=lambda e: e.tokens - e.cached_tokens) if pool else None


def pick_decode(engines: Sequence[EngineLoad], request_tokens: int) -> EngineLoad | None:
    """The decode worker for a request of ``request_tokens`` tokens (the DE fetch of §4.5, one request at a time).

    Phase 1: the group with the fewest tokens among those where some worker has room for the request now (the
    paper takes the fewest-token group and waits there for room; a worker smaller than the request would wait
    forever). Phase 2, inside it, among the workers with room: those that stay within ``DECODE_SLACK`` × the
    group's mean load (counting the request) after taking it, the fewest requests first; if none stays
    within, the fewest tokens. None when no worker has room now (the request waits for one).
    """
    groups: dict[str, list[EngineLoad]] = defaultdict(list)
    for e in engines:
        groups[e.group or e.name].append(e)
    roomy = [g for g in groups.values() if any(e.free_tokens >= request_tokens for e in g)]
    if not roomy:
        return None
    group = min(roomy, key=lambda g: sum(e.tokens for e in g))
    fits = [e for e in group if e.free_tokens >= request_tokens]
    limit = DECODE_SLACK * (request_tokens + sum(e.tokens for e in group)) / len(group)
    within = [e for e in fits if e.tokens + request_tokens <= limit]
    if within:
        return min(within, key=lambda e: (e.seqs, e.tokens))
    return min(fits, key=lambda e: e.tokens)


def pick_read_side(prefill_queue: int, decode_queue: int | None) -> str:
    """``de-read`` when the decode node's storage reads have queued fewer tokens than the prefill node's,
    else ``pe-read`` (ties and no decode worker: the standard path)."""
    return "de-read" if decode_queue is not None and decode_queue < prefill_queue else "pe-read"


class ReadMeter:
    """One node's storage reads: tokens queued, and the rate it reads at while it has reads queued (tokens
    done over busy seconds), which turns the queue into seconds."""

    def __init__(self) -> None:
        self.queued = 0
        self.done = 0
        self._busy_s = 0.0
        self._since: float | None = None  # when the queue last became non-empty

    def start(self, tokens: int, now: float) -> None:
        if self.queued == 0:
            self._since = now
        self.queued += tokens

    def finish(self, tokens: int, now: float, ok: bool = True) -> None:
        """A read of ``tokens`` ended; a failed one frees the queue but adds nothing to the rate."""
        self.queued -= tokens
        if ok:
            self.done += tokens
        if self.queued == 0 and self._since is not None:
            self._busy_s += now - self._since
            self._since = None

    def rate(self, now: float) -> float | None:
        """Tokens per second while busy; None before any read has finished."""
        busy = self._busy_s + (now - self._since if self._since is not None else 0.0)
        return self.done / busy if self.done and busy > 0 else None

    def queue_s(self, now: float) -> float | None:
        """The queue in seconds at the measured rate (None: no rate yet)."""
        if self.queued == 0:
            return 0.0
        rate = self.rate(now)
        return self.queued / rate if rate else None


class StepMeter:
    """A worker's step time as a line, seconds = fixed + per_token × tokens, fitted to its recent steps
    (least squares, older steps weighing less): the cost of computing tokens there, overhead included."""

    def __init__(self, memory: float = 0.98) -> None:
        self.memory = memory  # each step keeps this share of the weight of every step before it
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.steps = 0

    def step(self, tokens: int, seconds: float) -> None:
        m = self.memory
        self.steps += 1
        self._w = m * self._w + 1
        self._x = m * self._x + tokens
        self._y = m * self._y + seconds
        self._xx = m * self._xx + tokens * tokens
        self._xy = m * self._xy + tokens * seconds

    def line(self) -> tuple[float, float] | None:
        """(fixed seconds per step, seconds per token); None until steps of different sizes were seen."""
        var = self._w * self._xx - self._x * self._x
        if self.steps < 2 or var <= 1e-9 * max(self._w * self._xx, 1.0):
            return None
        per_token = (self._w * self._xy - self._x * self._y) / var
        fixed = (self._y - per_token * self._x) / self._w
        return max(fixed, 0.0), max(per_token, 0.0)

    def seconds(self, tokens: int, chunk: int) -> float | None:
        """Time to compute ``tokens`` in steps of at most ``chunk`` tokens (None: no line yet)."""
        line = self.line()
        if line is None:
            return None
        fixed, per_token = line
        return -(-tokens // chunk) * fixed + tokens * per_token


def recompute_sooner(hit_tokens: int, read_queue_s: float | None, read_rate: float | None,
                     backlog_s: float | None, recompute_s: float | None) -> bool:
    """Whether computing a cached prefix of ``hit_tokens`` beats loading it, for this request.

    Loading ends when the node's queued reads and then this one are read (``read_queue_s`` +
    hit ÷ ``read_rate``), and the request still waits for the prefill worker's backlog; computing ends after
    the backlog (``backlog_s``) plus ``recompute_s``. Whatever is not measured yet means load (the default
    path). Greedy: the tokens a recompute adds to the backlog delay requests behind it, which is not weighed.
    """
    if read_queue_s is None or not read_rate or backlog_s is None or recompute_s is None:
        return False
    return backlog_s + recompute_s < read_queue_s + hit_tokens / read_rate
