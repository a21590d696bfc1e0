"""Background responses (``background: true``): a response that runs past the HTTP request that created it.

Its streaming events are kept in order (a sequence number is an index), so any number of readers can follow
it from any point (``GET /v1/responses/{id}?stream=true&starting_after=N``) while it runs and after it ended,
and a reader that goes away stops nothing. The endpoint (responses_endpoint.py) makes the events, stores the
response and cancels it; this module only runs the event source to its end and keeps what it made."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from services.common.errors import NotFound

log = logging.getLogger(__name__)

# Finished runs whose events are kept for readers who come back; a run still going is always kept. A run's
# events are about its output's size again in JSON.
FINISHED_KEPT = 256


class BackgroundRun:
    """One background response: the id of the request that runs it, and the events made so far."""

    def __init__(self, response_id: str, request_id: str) -> None:
        self.response_id = response_id
        self.request_id = request_id
        self.events: list[dict[str, Any]] = []
        self.finished = anyio.Event()
        self._changed = anyio.Event()  # set by the next add; replaced then

    def add(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._wake()

    def end(self) -> None:
        """No more events: readers waiting for the next one return (a run cancelled by a shutdown adds none)."""
        self.finished.set()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def follow(self, starting_after: int = -1) -> AsyncIterator[dict[str, Any]]:
        """The events numbered after ``starting_after``, then each as it comes, until the run has ended."""
        i = max(starting_after + 1, 0)
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self.finished.is_set():
                return
            await self._changed.wait()


class BackgroundRuns:
    """The runs by response id, each a task in ``tasks`` (the scheduler process's task group, so a shutdown
    cancels them, which aborts their requests)."""

    def __init__(self, tasks: TaskGroup, finished_kept: int = FINISHED_KEPT) -> None:
        self.tasks = tasks
        self.finished_kept = finished_kept
        self._live: dict[str, BackgroundRun] = {}
        self._finished: OrderedDict[str, BackgroundRun] = OrderedDict()

    def start(self, response_id: str, request_id: str, events: AsyncIterator[dict[str, Any]],
              failed: Callable[[BackgroundRun, Exception], dict[str, Any]]) -> BackgroundRun:
        """Runs ``events`` to its end in the background; if it raises, ``failed`` records the failure and
        returns the run's last event."""
        run = BackgroundRun(response_id, request_id)
        self._live[response_id] = run
        self.tasks.start_soon(self._run, run, events, failed)
        return run

    def get(self, response_id: str) -> BackgroundRun | None:
        """The run, while it goes on or while its events are kept."""
        return self._live.get(response_id) or self._finished.get(response_id)

    def running(self, response_id: str) -> BackgroundRun | None:
        return self._live.get(response_id)

    def forget(self, response_id: str) -> None:
        """Drops a finished run's events (its response was deleted)."""
        self._finished.pop(response_id, None)

    def events(self, response_id: str) -> BackgroundRun:
        run = self.get(response_id)
        if run is None:
            raise NotFound(f"the events of response {response_id!r} are no longer kept (those of the last "
                           f"{self.finished_kept} background responses are): GET it without stream for the whole "
                           "response")
        return run

    async def _run(self, run: BackgroundRun, events: AsyncIterator[dict[str, Any]],
                   failed: Callable[[BackgroundRun, Exception], dict[str, Any]]) -> None:
        try:
            async for event in events:
                run.add(event)
        except Exception as exc:  # a fault in one response must not end the scheduler's task group
            log.exception("background response %s failed", run.response_id)
            run.add(failed(run, exc))
        finally:
            run.end()
            del self._live[run.response_id]
            self._finished[run.response_id] = run
            while len(self._finished) > self.finished_kept:
                self._finished.popitem(last=False)
