"""Background responses' runs: events kept in order for readers that come and go, a failing run recorded
without ending the task group it runs in, and the finished runs' events kept only for the last few."""

from __future__ import annotations

import anyio
import pytest

from services.common.errors import NotFound
from services.scheduler.responses_background import BackgroundRun, BackgroundRuns

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _event(n: int, kind: str = "delta") -> dict:
    return {"type": kind, "sequence_number": n}


async def _gated(gate: anyio.Event, first: int, last: int, fail: bool = False):
    """Events ``0..first-1`` at once, the rest once ``gate`` is set; then a fault if ``fail``."""
    for n in range(first):
        yield _event(n)
    await gate.wait()
    for n in range(first, last):
        yield _event(n)
    if fail:
        raise RuntimeError("the detokenizer broke")


def _failed(run: BackgroundRun, exc: Exception) -> dict:
    return {"type": "response.failed", "sequence_number": len(run.events), "message": str(exc)}


async def _numbers(run: BackgroundRun, after: int = -1) -> list[int]:
    return [e["sequence_number"] async for e in run.follow(after)]


async def test_readers_follow_from_any_point_while_it_runs_and_after_it_ended():
    gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        runs = BackgroundRuns(tg)
        run = runs.start("resp_1", "req-1", _gated(gate, 3, 6), _failed)
        await anyio.wait_all_tasks_blocked()
        assert [e["sequence_number"] for e in run.events] == [0, 1, 2] and runs.running("resp_1") is run
        seen: dict[int, list[int]] = {}

        async def read(after: int) -> None:
            seen[after] = await _numbers(run, after)

        for after in (-1, 1, 2, 4):
            tg.start_soon(read, after)
        await anyio.wait_all_tasks_blocked()
        assert seen == {}  # all waiting for what comes next
        gate.set()
    assert seen == {-1: [0, 1, 2, 3, 4, 5], 1: [2, 3, 4, 5], 2: [3, 4, 5], 4: [5]}
    assert runs.running("resp_1") is None and runs.get("resp_1") is run
    assert await _numbers(run, 3) == [4, 5] and await _numbers(run, 5) == []


async def test_a_run_that_fails_ends_with_its_failure_event_and_the_task_group_goes_on():
    gate = anyio.Event()
    gate.set()
    async with anyio.create_task_group() as tg:
        runs = BackgroundRuns(tg)
        run = runs.start("resp_1", "req-1", _gated(gate, 1, 2, fail=True), _failed)
        await run.finished.wait()
        other = runs.start("resp_2", "req-2", _gated(gate, 1, 1), _failed)
        await other.finished.wait()
    assert run.events[-1] == {"type": "response.failed", "sequence_number": 2, "message": "the detokenizer broke"}
    assert await _numbers(other) == [0]


async def test_only_the_last_finished_runs_keep_their_events_and_a_running_one_always_does():
    gate, never = anyio.Event(), anyio.Event()
    gate.set()
    async with anyio.create_task_group() as tg:
        runs = BackgroundRuns(tg, finished_kept=2)
        long = runs.start("resp_long", "req-0", _gated(never, 1, 2), _failed)
        for k in range(3):
            await runs.start(f"resp_{k}", f"req-{k}", _gated(gate, 1, 1), _failed).finished.wait()
        assert runs.get("resp_0") is None and runs.get("resp_1") is not None and runs.events("resp_long") is long
        with pytest.raises(NotFound, match="no longer kept .* last 2 background responses"):
            runs.events("resp_0")
        runs.forget("resp_1")  # deleted: its events go with it
        runs.forget("resp_long")  # still running: kept until it ends
        assert runs.get("resp_1") is None and runs.get("resp_2") is not None and runs.running("resp_long") is long
        tg.cancel_scope.cancel()  # a shutdown: the run still going ends, and is kept as finished
    assert long.finished.is_set() and runs.running("resp_long") is None


async def test_readers_waiting_for_more_return_when_a_run_ends_without_a_last_event():
    gate = anyio.Event()
    seen: list[int] = []

    async def read(run: BackgroundRun) -> None:
        seen.extend(await _numbers(run))

    with anyio.fail_after(5):  # a reader waiting for an event that never came hung its connection
        async with anyio.create_task_group() as tg:
            runs = BackgroundRuns(tg)
            run = runs.start("resp_1", "req-1", _gated(gate, 1, 1), _failed)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(read, run)
            await anyio.wait_all_tasks_blocked()
            gate.set()  # the source ends after a wait, with no event after it
    assert seen == [0] and run.finished.is_set()
