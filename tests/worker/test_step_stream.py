"""The worker's step stream: a plan the scheduler sent ahead starts right behind the step before it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import anyio
import grpc
import pytest

from seawall.v1 import worker_pb2
from services.common.step import StepResult
from services.worker.config import WorkerConfig
from services.worker.servicer import WorkerServicer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _Runner:
    """Runs nothing: records each step as it runs."""

    def __init__(self, log: list) -> None:
        self.seqs: dict = {}
        self.kv = SimpleNamespace(layout=SimpleNamespace(bytes_per_block=1))
        self.log = log

    def execute(self, plan) -> StepResult:
        self.log.append(("run", plan.step_id))
        return StepResult(plan.step_id)


class _InlineTorch:
    """The torch thread, inline: records when a step is handed to it."""

    def __init__(self, log: list) -> None:
        self.log = log

    async def run(self, fn, *args):
        self.log.append(("start", args[0].step_id))
        await asyncio.sleep(0)  # a real hand-off suspends the caller
        return fn(*args)


class _Context:
    def __init__(self) -> None:
        self.plans: asyncio.Queue = asyncio.Queue()

    async def read(self):
        return await self.plans.get()

    def invocation_metadata(self):
        return ()


def _plan(step_id: int) -> worker_pb2.StepPlan:
    return worker_pb2.StepPlan(step_id=step_id, scheduler_id="s")


async def test_a_plan_read_ahead_starts_before_the_result_ahead_of_it_is_yielded():
    log: list = []
    servicer = WorkerServicer(WorkerConfig(), _Runner(log), None, torch_thread=_InlineTorch(log))
    context = _Context()
    for step_id in (1, 2):
        context.plans.put_nowait(_plan(step_id))
    stream = servicer.StepStream(None, context)
    first = await stream.__anext__()
    assert first.step_id == 1
    # Nobody asks for the next result (as while grpc writes this one out), and step 2 runs all the same: the
    # forward passes run back to back instead of waiting for a write and a read in between.
    with anyio.fail_after(5):
        while ("run", 2) not in log:
            await asyncio.sleep(0.001)
    assert log == [("start", 1), ("run", 1), ("start", 2), ("run", 2)]
    assert (await stream.__anext__()).step_id == 2
    context.plans.put_nowait(grpc.aio.EOF)
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert log == [("start", 1), ("run", 1), ("start", 2), ("run", 2)]


async def test_results_come_back_in_plan_order_and_shutdown_ends_the_stream_after_the_steps_read():
    log: list = []
    servicer = WorkerServicer(WorkerConfig(), _Runner(log), None, torch_thread=_InlineTorch(log))
    context = _Context()
    for step_id in range(1, 6):
        context.plans.put_nowait(_plan(step_id))
    stream = servicer.StepStream(None, context)
    assert [(await stream.__anext__()).step_id for _ in range(3)] == [1, 2, 3]
    servicer.close_streams()
    rest = [result.step_id async for result in stream]
    assert rest == [4, 5]  # read before the shutdown: they run and their results go out
    assert [e for e in log if e[0] == "run"] == [("run", i) for i in range(1, 6)]


async def test_a_step_that_fails_ends_the_stream_with_its_error():
    log: list = []
    runner = _Runner(log)
    servicer = WorkerServicer(WorkerConfig(), runner, None, torch_thread=_InlineTorch(log))

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
