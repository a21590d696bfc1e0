"""The worker's step stream: steps run in plan order on the torch thread (a thread of their own, or the
event-loop thread: ``InlineTorch``), and a plan the scheduler sent ahead starts the moment the step before it
ends."""

from __future__ import annotations

import asyncio
import threading

import anyio
import grpc
import pytest
import torch

from seawall.v1 import worker_pb2
from services.common.step import StepResult
from services.engine.kv_pool import KVLayout, PagedKVPool
from services.engine.torch_thread import InlineTorch, TorchThread
from services.worker.config import WorkerConfig
from services.worker.servicer import WorkerServicer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _Seqs(dict):
    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def pop(self, key, default=None):
        self.log.append(("drop", key))
        return super().pop(key, default)


class _Runner:
    """Runs nothing: records each step (and each sequence dropped) as it happens."""

    def __init__(self) -> None:
        self.log: list = []
        self.seqs = _Seqs(self.log)
        self.kv = PagedKVPool(KVLayout(1, 16, 1, 1, torch.float32), 2, 0, torch.device("cpu"))  # a tiny real one
        self.hold: dict[int, threading.Event] = {}  # step id -> released when set

    def drop(self, seq_id: str) -> bool:
        return self.seqs.pop(seq_id, None) is not None

    def drop_all(self) -> None:
        self.seqs.clear()

    def execute(self, plan) -> StepResult:
        if plan.step_id in self.hold:
            self.hold[plan.step_id].wait(10)
        self.log.append(("run", plan.step_id))
        return StepResult(plan.step_id)


class _Context:
    def __init__(self) -> None:
        self.plans: asyncio.Queue = asyncio.Queue()

    async def read(self):
        return await self.plans.get()

    def invocation_metadata(self):
        return ()


@pytest.fixture(params=["own", "loop"])
def step_thread(request):
    return request.param


def _servicer(runner: _Runner, step_thread: str = "own") -> WorkerServicer:
    torch_thread = TorchThread.plain() if step_thread == "own" else InlineTorch()
    return WorkerServicer(WorkerConfig(step_thread=step_thread), runner, None, torch_thread=torch_thread)


def _plan(step_id: int) -> worker_pb2.StepPlan:
    return worker_pb2.StepPlan(step_id=step_id, scheduler_id="s")


async def _until(condition) -> None:
    with anyio.fail_after(5):
        while not condition():
            await asyncio.sleep(0.001)


async def test_a_plan_read_ahead_runs_without_waiting_for_the_result_before_it_to_go_out(step_thread):
    runner = _Runner()
    context = _Context()
    for step_id in (1, 2):
        context.plans.put_nowait(_plan(step_id))
    stream = _servicer(runner, step_thread).StepStream(None, context)
    assert (await stream.__anext__()).step_id == 1
    # Nobody asks for the next result (as while grpc writes this one out), and step 2 runs all the same: the
    # forward passes run back to back instead of waiting for a write and a read in between.
    await _until(lambda: ("run", 2) in runner.log)
    assert (await stream.__anext__()).step_id == 2
    context.plans.put_nowait(grpc.aio.EOF)
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert runner.log == [("run", 1), ("run", 2)]


async def test_a_free_runs_after_the_steps_read_before_it():
    """On a thread of their own: a Free queues behind the steps read before it, even while they run."""
    runner = _Runner()
    runner.hold[1] = threading.Event()
    servicer = _servicer(runner)
    context = _Context()
    for step_id in (1, 2):
        context.plans.put_nowait(_plan(step_id))
    stream = servicer.StepStream(None, context)
    first = asyncio.ensure_future(stream.__anext__())
    await _until(lambda: context.plans.empty())  # both plans read; step 1 is running, step 2 queued
    free = asyncio.ensure_future(servicer.Free(worker_pb2.FreeRequest(seq_ids=["a"]), context))
    await asyncio.sleep(0.05)
    assert runner.log == []  # step 1 still holds the thread; nothing ran out of order meanwhile
    runner.hold[1].set()
    assert (await first).step_id == 1
    assert list((await free).unknown_seq_ids) == ["a"]
    assert runner.log == [("run", 1), ("run", 2), ("drop", "a")]
    assert (await stream.__anext__()).step_id == 2
    await stream.aclose()


async def test_on_the_event_loop_thread_a_free_runs_after_the_steps_read_before_it():
    """With the steps on the loop, a step runs as its plan is read: a Free that comes later finds it done."""
    runner = _Runner()
    servicer = _servicer(runner, "loop")
    context = _Context()
    for step_id in (1, 2):
        context.plans.put_nowait(_plan(step_id))
    stream = servicer.StepStream(None, context)
    first = asyncio.ensure_future(stream.__anext__())
    await _until(lambda: ("run", 2) in runner.log)
    free = await servicer.Free(worker_pb2.FreeRequest(seq_ids=["a"]), context)
    assert list(free.unknown_seq_ids) == ["a"]
    assert runner.log == [("run", 1), ("run", 2), ("drop", "a")]
    assert (await first).step_id == 1 and (await stream.__anext__()).step_id == 2
    await stream.aclose()


async def test_results_come_back_in_plan_order_and_shutdown_ends_the_stream_after_the_steps_read(step_thread):
    runner = _Runner()
    servicer = _servicer(runner, step_thread)
    context = _Context()
    for step_id in range(1, 6):
        context.plans.put_nowait(_plan(step_id))
    stream = servicer.StepStream(None, context)
    assert [(await stream.__anext__()).step_id for _ in range(3)] == [1, 2, 3]
    servicer.close_streams()
    rest = [result.step_id async for result in stream]
    assert rest == [4, 5]  # read before the shutdown: they run and their results go out
    assert runner.log == [("run", i) for i in range(1, 6)]


async def test_a_step_that_fails_ends_the_stream_with_its_error(step_thread):
    runner = _Runner()
    servicer = _servicer(runner, step_thread)

    def fail(plan):
        raise KeyError(f"seq-{plan.step_id}")

    runner.execute = fail
    context = _Context()
    aborted = []

    async def abort(code, details):
        aborted.append((code, details))
        raise RuntimeError("aborted")  # what grpc's abort does: raise out of the handler

    context.abort = abort
    context.plans.put_nowait(_plan(1))
    stream = servicer.StepStream(None, context)
    with pytest.raises(RuntimeError, match="aborted"):
        await stream.__anext__()
    assert aborted == [(grpc.StatusCode.FAILED_PRECONDITION, "'seq-1'")]
