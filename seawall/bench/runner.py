"""The load generator: sends a workload's requests at their arrival times and records what comes back.

One asyncio task per request sleeps until its arrival, waits for a slot when ``max_concurrency`` is set, then
streams the request and stamps every chunk (``metrics.RequestRecord``). Requests run greedy with
``ignore_eos``, so each produces exactly its ``max_tokens``. A poller samples ``GetStats`` (preemptions, KV
blocks) every ``poll_s`` while the run lasts, when the backend can. A ``--duration`` bound is the workload's
(it holds only the requests arriving before it); every request sent runs to the end.

Backends: ``GrpcBackend`` (the SDK's ``AsyncClient``; reports the server's queueing delay and stats) and
``HttpBackend`` (the OpenAI ``/v1/completions`` API with ``stream: true`` and token-id prompts; needs httpx;
the queueing delay from the ``x-queue-time`` header, stats over gRPC when given its address).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from seawall.bench.metrics import RequestRecord, StatsSample
from seawall.bench.workload import BenchRequest, Workload
from services.common.credentials import api_key_or_env
from services.common.errors import InvalidArgument


@dataclass
class Piece:
    """One streamed chunk, as a backend reports it."""

    num_tokens: int
    queue_delay_ms: float | None = None
    finish_reason: str | None = None


class Backend(Protocol):
    async def stream(self, req: BenchRequest, tag: str) -> AsyncIterator[Piece]: ...

    async def stats(self) -> StatsSample | None: ...

    async def policy(self) -> str | None: ...

    async def close(self) -> None: ...


def _sampling(req: BenchRequest) -> dict:
    out = {"max_tokens": req.max_tokens, "temperature": 0.0, "ignore_eos": True}
    if req.priority:
        out["priority"] = req.priority
    if req.model:
        out["model"] = req.model
    return out


class GrpcBackend:
    def __init__(self, address: str) -> None:
        from seawall.client import AsyncClient

        self.client = AsyncClient(address)

    async def stream(self, req: BenchRequest, tag: str) -> AsyncIterator[Piece]:
        extra = {"session_id": req.session_id} if req.session_id else {}
        async for chunk in self.client.stream(list(req.prompt), request_id=f"bench-{tag}-{req.index}",
                                              **_sampling(req), **extra):
            yield Piece(len(chunk.token_ids), chunk.queue_delay_ms or None, chunk.finish_reason)

    async def stats(self) -> StatsSample | None:
        s = await self.client.stats()
        return StatsSample(time.perf_counter(), s.num_preemptions,
                           sum(w.num_device_blocks_used for w in s.workers), sum(w.num_device_blocks for w in s.workers),
                           sum(w.num_host_blocks_used for w in s.workers), s.num_running, s.num_waiting,
                           s.num_swapped, sum(w.num_prefix_queried_blocks for w in s.workers),
                           sum(w.num_prefix_hit_blocks for w in s.workers),
                           sum(w.num_draft_tokens for w in s.workers),
                           sum(w.num_accepted_draft_tokens for w in s.workers), s.num_migrations, s.num_queued_moves)

    async def policy(self) -> str:
        return (await self.client.stats()).policy

    async def close(self) -> None:
        await self.client.close()


class HttpBackend:
    """Streams over HTTP; stats (and the policy) come over gRPC when ``stats_address`` is given."""

    def __init__(self, url: str, stats_address: str | None = None) -> None:
        try:
            import httpx
        except ImportError as exc:
            raise InvalidArgument("--http needs the httpx package (pip install httpx); or use --address "
                                  "HOST:PORT (gRPC)") from exc
        self.url = url.rstrip("/").removesuffix("/v1")
        # No pool cap: a capped pool holds a burst's requests back on this side, and their wait would count as
        # the server's TTFT (httpx allows 100 connections by default). Idle connections are dropped after 2 s,
        # before the server's keep-alive timeout (uvicorn: 5 s) could close one as it is reused.
        key = api_key_or_env(None)  # a mesh with an API key: $SEAWALL_API_KEY, as the SDK reads it
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=None, keepalive_expiry=2.0),
            headers={"Authorization": f"Bearer {key}"} if key else None)
        self.grpc = GrpcBackend(stats_address) if stats_address else None

    async def stream(self, req: BenchRequest, tag: str) -> AsyncIterator[Piece]:
        body = {"prompt": list(req.prompt), "stream": True, "return_token_ids": True, **_sampling(req)}
        if req.session_id:
            body["session_id"] = req.session_id
        async with self.client.stream("POST", f"{self.url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                raise RuntimeError(f"HTTP {resp.status_code}: {text[:200]}")
            # The server's queueing delay (its headers wait for the first token), on the first piece.
            queued = resp.headers.get("x-queue-time")
            delay_ms = float(queued) if queued is not None else None
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                yield Piece(len(choice.get("token_ids") or []), delay_ms, choice.get("finish_reason"))
                delay_ms = None

    async def stats(self) -> StatsSample | None:
        return await self.grpc.stats() if self.grpc else None

    async def policy(self) -> str | None:
        return await self.grpc.policy() if self.grpc else None

    async def close(self) -> None:
        await self.client.aclose()
        if self.grpc:
            await self.grpc.close()


@dataclass
class RunResult:
    records: list[RequestRecord]
    stats: list[StatsSample] = field(default_factory=list)
    wall_s: float = 0.0


class Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal, a line per quarter otherwise)."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.done = self.sent = 0
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._last_quarter = -1
        self._last_draw = 0.0

    def update(self, *, sent: int = 0, done: int = 0) -> None:
        self.sent += sent
        self.done += done
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.tty:
            if now - self._last_draw >= 0.2 or self.done == self.total:
                self._last_draw = now
                width = 30
                fill = width * self.done // max(self.total, 1)
                sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                                 f"done, {self.sent - self.done} in flight, {now - self.t0:5.1f} s")
                sys.stderr.flush()
        elif done:
            quarter = 4 * self.done // max(self.total, 1)
            if quarter != self._last_quarter:
                self._last_quarter = quarter
                sys.stderr.write(f"{self.label}: {self.done}/{self.total} done, {now - self.t0:.1f} s\n")

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


async def _one(backend: Backend, req: BenchRequest, rec: RequestRecord, t0: float, tag: str,
               slots: asyncio.Semaphore | None, progress: Progress) -> None:
    delay = t0 + req.arrival - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    if slots is not None:
        await slots.acquire()
    try:
        rec.sent = time.perf_counter() - t0
        progress.update(sent=1)
        async for piece in backend.stream(req, tag):
            if piece.num_tokens:
                rec.chunk_times.append(time.perf_counter() - t0)
                rec.chunk_tokens.append(piece.num_tokens)
            if piece.queue_delay_ms is not None and rec.queue_delay is None:
                rec.queue_delay = piece.queue_delay_ms / 1000.0
            rec.finish_reason = piece.finish_reason or rec.finish_reason
    except Exception as exc:  # noqa: BLE001 - one failed request is a data point, not the end of the run
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        if slots is not None:
            slots.release()
        progress.update(done=1)


async def _poll(backend: Backend, t0: float, poll_s: float, out: list[StatsSample], stop: asyncio.Event) -> None:
    while True:
        try:
            sample = await backend.stats()
        except Exception:  # noqa: BLE001 - stats are best effort; the run goes on without them
            sample = None
        if sample is None:
            return
        sample.t -= t0
        out.append(sample)
        if stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), poll_s)
        except TimeoutError:
            pass


async def run_load(backend: Backend, workload: Workload, *, max_concurrency: int | None = None,
                   tag: str = "run", progress: bool = True, poll_s: float = 0.1) -> RunResult:
    records = [RequestRecord(r.index, r.arrival, len(r.prompt), r.max_tokens, r.role, priority=r.priority)
               for r in workload.requests]
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = Progress(len(records), tag, progress)
    stop = asyncio.Event()
    stats: list[StatsSample] = []
    t0 = time.perf_counter()
    poller = asyncio.create_task(_poll(backend, t0, poll_s, stats, stop))
    try:
        await asyncio.gather(*(_one(backend, req, rec, t0, tag, slots, bar)
                               for req, rec in zip(workload.requests, records, strict=True)))
    finally:
        stop.set()
        await poller
        bar.close()
    return RunResult(records, stats, time.perf_counter() - t0)


async def warm_up(backend: Backend, workload: Workload, n: int = 4) -> None:
    """A few requests before timing: the longest prompt of the workload and ``n`` short ones, concurrently."""
    if n <= 0:
        return
    longest = max(workload.requests, key=lambda r: len(r.prompt))
    # Reversed, so that no warm-up block is a block the timed requests start with (a shared system prompt).
    backwards = longest.prompt[::-1]
    reqs = [BenchRequest(-1, 0.0, backwards, 4)]
    reqs += [BenchRequest(-2 - i, 0.0, backwards[i:i + 16] or (5,) * 16, 8) for i in range(n)]

    async def one(req: BenchRequest) -> None:
        async for _ in backend.stream(req, "warmup"):
            pass

    await asyncio.gather(*(one(r) for r in reqs))
