"""Bandwidth shaping: a token bucket per traffic class, so one machine shows the bottleneck a cluster has.

On one host every "NIC" is a memcpy (NIXL over shared memory moves 5+ GB/s here), so the storage-NIC
bottleneck DualPath is about never appears. A ``Shaper`` gives each emulated node one token bucket per
traffic class and direction; a transfer takes tokens for its bytes before (or, chunk by chunk, while) it
moves them::

    shaper = Shaper(storage_gbps=1.0)                      # 1 GB/s (10^9 bytes/s) per node; compute unshaped
    bucket = shaper.bucket(STORAGE, "decode-1", INGRESS)   # None when the class is not shaped
    if bucket is not None:
        await bucket.acquire(nbytes)                       # returns when the bytes may go

Traffic classes (DESIGN.md §3): ``storage`` is kvcache ↔ worker (Load into a worker, Store out of it), shaped
by the kvcache per worker node (that node's storage NIC); ``compute`` is worker ↔ worker KV pulls, shaped by
the receiving worker (its compute NIC). A NIC is full duplex: each direction (``in`` / ``out``, seen from the
worker node) has its own bucket. Off by default: a class with no rate has no bucket, and the transfer paths
skip shaping entirely (one ``is None`` test).

The bucket holds up to ``burst`` bytes of tokens and refills at ``rate`` bytes/s. ``acquire(n)`` takes ``n``
tokens at once, going into debt when there are fewer, and sleeps until the debt is paid, so callers are served
in the order they asked (FIFO) and concurrent transfers share the rate. Because the bucket refills while the
real copy runs, back-to-back transfers see the configured rate rather than the rate plus the copy time; a lone
transfer of ``n`` bytes from a full bucket waits ``(n - burst) / rate``. ``burst`` defaults to 10 ms of the
rate (at least 64 KiB): small against a KV load, large enough that per-chunk shaping is not a sleep per chunk.
A caller cancelled while it waits (deadline, abort) gives its tokens back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

STORAGE = "storage"
COMPUTE = "compute"
TRAFFIC_CLASSES = (STORAGE, COMPUTE)
INGRESS = "in"  # into the worker node (a kvcache Load, a pull by this worker)
EGRESS = "out"  # out of the worker node (a kvcache Store, a push by this worker)

GB = 1e9  # GB/s throughout Seawall are 10^9 bytes per second
DEFAULT_BURST_S = 0.01
MIN_BURST_BYTES = 64 << 10


class TokenBucket:
    """``rate`` bytes/s, at most ``burst`` bytes of tokens banked; starts full. One event loop only."""

    def __init__(self, rate: float, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"a token bucket needs a rate > 0 bytes/s, got {rate}")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(self.rate * DEFAULT_BURST_S, MIN_BURST_BYTES)
        if self.burst <= 0:
            raise ValueError(f"burst must be > 0 bytes, got {burst}")
        self._clock = clock
        self._tokens = self.burst
        self._stamp = clock()
        self.bytes = 0  # bytes acquired so far (cancelled acquisitions excluded)
        self.waited_s = 0.0  # seconds callers spent waiting for tokens, summed over callers

    def _refill(self) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        return now

    def delay(self) -> float:
        """Seconds a new acquisition of one byte would wait now (the debt ahead of it)."""
        self._refill()
        return max(0.0, -self._tokens / self.rate)

    async def acquire(self, nbytes: int) -> float:
        """Takes ``nbytes`` tokens; returns after the seconds it had to wait for them (0.0 when banked).
        Cancellation while waiting returns the tokens."""
        if nbytes <= 0:
            return 0.0
        self._refill()
        self._tokens -= nbytes
        self.bytes += nbytes
        if self._tokens >= 0:
            return 0.0
        wait = -self._tokens / self.rate
        try:
            await anyio.sleep(wait)
        except BaseException:
            self._refill()
            self._tokens = min(self.burst, self._tokens + nbytes)
            self.bytes -= nbytes
            raise
        self.waited_s += wait
        return wait


@dataclass(frozen=True)
class BucketKey:
    traffic_class: str
    node: str
    direction: str


class Shaper:
    """One ``TokenBucket`` per (traffic class, node, direction), created on first use. A rate of 0 (the
    default) leaves that class unshaped: ``bucket`` returns None and ``acquire`` returns at once."""

    def __init__(self, storage_gbps: float = 0.0, compute_gbps: float = 0.0, burst_s: float = DEFAULT_BURST_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        for name, value in (("storage_gbps", storage_gbps), ("compute_gbps", compute_gbps)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0 GB/s (0 = not shaped), got {value}")
        if burst_s <= 0:
            raise ValueError(f"burst_s must be > 0, got {burst_s}")
        self.rates = {c: g * GB for c, g in ((STORAGE, storage_gbps), (COMPUTE, compute_gbps)) if g > 0}
        self.burst_s = burst_s
        self._clock = clock
        self._buckets: dict[BucketKey, TokenBucket] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.rates)

    def bucket(self, traffic_class: str, node: str = "", direction: str = INGRESS) -> TokenBucket | None:
        """The bucket of one node's traffic of a class in one direction; None when the class is not shaped."""
        rate = self.rates.get(traffic_class)
        if rate is None:
            if traffic_class not in TRAFFIC_CLASSES:
                raise ValueError(f"unknown traffic class {traffic_class!r}; use one of {TRAFFIC_CLASSES}")
            return None
        key = BucketKey(traffic_class, node, direction)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(rate, max(rate * self.burst_s, MIN_BURST_BYTES), self._clock)
        return bucket

    async def acquire(self, traffic_class: str, nbytes: int, node: str = "", direction: str = INGRESS) -> float:
        """Waits until ``nbytes`` of the class may move to/from ``node``; seconds waited (0.0 when unshaped)."""
        bucket = self.bucket(traffic_class, node, direction)
        return 0.0 if bucket is None else await bucket.acquire(nbytes)

    def buckets(self) -> dict[BucketKey, TokenBucket]:
        """Every bucket made so far (for metrics)."""
        return dict(self._buckets)
