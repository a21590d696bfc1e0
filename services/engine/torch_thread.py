"""One thread for all of a server process's torch work (model loading, steps, KV copies).

Why: torch's CPU kernels parallelise with OpenMP, and GNU OpenMP keeps one thread team per thread that
starts parallel regions. When a service loads its model on the event-loop thread and runs steps in a pool
thread (``anyio.to_thread``), the process holds two teams, more OpenMP threads than this box has cores, and
every parallel region then pays a sleep/wake of its helpers: on 2 cores the forward passes of the
64 x (128 + 64) workload took 0.78-1.1 s that way against 0.51-0.56 s with loading and steps on one thread
(bench/README.md, "Mesh overhead"). So the event-loop thread is set to one torch thread (it never starts a
team) and everything torch runs here, on a thread set to the process's thread count.

``InlineTorch`` is the other answer: the torch work runs on the event-loop thread itself, which then is the
process's only torch thread. A CPU worker uses it (``WorkerConfig.step_thread``): its forward pass holds the
GIL between kernels, and every plan read, result written and future resolved on the loop while a step runs on
another thread takes the GIL from that step, each hand-off waking a thread. On 2 cores a 16-decode step of the
built-in model took 3.9-4.1 ms in the worker that way (2.0 ms in process) and 3.4-3.6 ms on the loop thread,
with a lower tail (bench/README.md, "Steps on the event-loop thread"). The price: the loop serves nothing else
(health checks, KV transfer requests) while a step runs, so it suits steps of milliseconds, not a GPU's
asynchronous launches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import anyio
import torch

T = TypeVar("T")


class TorchThread:
    def __init__(self, num_threads: int = 0) -> None:
        """``num_threads``: torch threads for the work (0 = torch's default here). Sets the calling thread to one."""
        n = num_threads or torch.get_num_threads()
        torch.set_num_threads(1)  # before the worker sets n: MKL's setting is process-wide, the last one wins
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="torch", initializer=torch.set_num_threads,
                                        initargs=(n,))
        self.num_threads = n
        self.call(lambda: None)  # start the thread now, so its setting is in place before any work

    @classmethod
    def plain(cls) -> TorchThread:
        """One thread for the work, leaving torch's thread settings as they are (tests, tools)."""
        self = cls.__new__(cls)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="torch")
        self.num_threads = torch.get_num_threads()
        return self

    async def run_in_order(self, fn: Callable[..., T], *args) -> T:
        """Queues ``fn(*args)`` behind the work already queued before this coroutine first yields (so calls
        run in the order they were made) and waits for it. The work is never abandoned halfway, nor dropped
        from the queue, when the caller goes away; its outcome is then read and dropped."""
        queued = asyncio.wrap_future(self._pool.submit(fn, *args))
        queued.add_done_callback(lambda f: f.cancelled() or f.exception())
        return await asyncio.shield(queued)

    def call(self, fn: Callable[..., T], *args) -> T:
        """Runs ``fn(*args)`` on the torch thread and waits for it (for start-up, before an event loop)."""
        return self._pool.submit(fn, *args).result()

    async def run(self, fn: Callable[..., T], *args) -> T:
        """Runs ``fn(*args)`` on the torch thread. Not cancellable once started, as ``anyio.to_thread``: a step
        is never abandoned halfway, so the caller's locks stay held until the work really ended."""
        with anyio.CancelScope(shield=True):
            return await asyncio.wrap_future(self._pool.submit(fn, *args))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class InlineTorch:
    """``TorchThread``'s interface, running the work on the caller's thread (the module docstring says when)."""

    def __init__(self, num_threads: int = 0) -> None:
        """``num_threads``: torch threads for the work (0 = torch's default here), set on the calling thread."""
        self.num_threads = num_threads or torch.get_num_threads()
        torch.set_num_threads(self.num_threads)

    async def run_in_order(self, fn: Callable[..., T], *args) -> T:
        return fn(*args)  # nothing runs meanwhile: the order is the order of the calls

    def call(self, fn: Callable[..., T], *args) -> T:
        return fn(*args)

    async def run(self, fn: Callable[..., T], *args) -> T:
        return fn(*args)

    def close(self) -> None:
        pass
