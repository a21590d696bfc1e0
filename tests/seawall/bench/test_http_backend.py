"""The load generator's HTTP backend keeps every request of a burst in flight at once: a connection pool
with a cap would hold requests back on the client, and their wait would count as the server's TTFT."""

from __future__ import annotations

import socket

import anyio
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from seawall.bench.runner import HttpBackend
from seawall.bench.workload import BenchRequest

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]
BURST = 150  # more than httpx's default pool of 100 connections


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _server() -> tuple[uvicorn.Server, socket.socket, dict]:
    """Streams each completion's one token only once ``BURST`` requests are open at the same time."""
    state = {"open": 0, "most": 0, "all_in": anyio.Event()}

    async def completions(request: Request) -> StreamingResponse:
        state["open"] += 1
        state["most"] = max(state["most"], state["open"])
        if state["open"] == BURST:
            state["all_in"].set()

        async def events():
            with anyio.move_on_after(10):
                await state["all_in"].wait()
            yield 'data: {"choices": [{"token_ids": [7], "finish_reason": "length"}]}\n\n'
            yield "data: [DONE]\n\n"
            state["open"] -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off")), sock, state


async def test_a_burst_larger_than_a_connection_pool_is_in_flight_at_once():
    server, sock, state = _server()
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:
            await anyio.sleep(0.01)
        backend = HttpBackend(f"http://127.0.0.1:{sock.getsockname()[1]}/v1")
        finished = []

        async def one(i: int) -> None:
            async for piece in backend.stream(BenchRequest(i, 0.0, (1, 2, 3), 1), "t"):
                if piece.finish_reason:
                    finished.append(i)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as requests:
                for i in range(BURST):
                    requests.start_soon(one, i)
        await backend.close()
        server.should_exit = True
    assert len(finished) == BURST and state["most"] == BURST
