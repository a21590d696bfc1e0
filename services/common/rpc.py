"""Awaiting a gRPC client call inside anyio task groups and cancel scopes.

grpc.aio ends a unary call that was cancelled by raising a fresh, blank ``asyncio.CancelledError`` in the
awaiting task, in two cases that anyio cannot handle:

* the call was cancelled locally (its channel closed) though nothing cancelled the task: in a task group a
  stray CancelledError cancels the whole group. When the scheduler dropped a failed worker and closed its
  channel while a KV pull to it was pending, the mesh's task group was cancelled, no worker was driven any
  more, and every later request failed with "This task group is not active" (bench/soak.py, a worker killed
  mid-run);
* the task was cancelled by a cancel scope (``fail_after``/``move_on_after`` around the call): gRPC swaps
  anyio's CancelledError, which carries the scope's message, for a blank one, so the scope does not know it
  as its own and lets it escape as a stray cancellation too.

``rpc`` turns the first into the failed call it is and, in the second, lets the scope cancel the task again at
a checkpoint, with a CancelledError it knows. ``rpc_stream`` does the same for each read of a streaming
call's responses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from typing import NoReturn, TypeVar

import anyio.lowlevel
import grpc

T = TypeVar("T")


async def rpc(call: Awaitable[T]) -> T:
    """``await call``; ``AioRpcError`` (CANCELLED) where gRPC cancelled the call under a task nobody
    cancelled. A task being cancelled still unwinds with a cancellation its scope recognises."""
    try:
        return await call
    except asyncio.CancelledError as exc:
        await _cancelled(exc)


async def rpc_stream(call: AsyncIterable[T]) -> AsyncIterator[T]:
    """``async for`` over a streaming call's responses, each read handled as ``rpc`` handles a call (inline:
    a stream reads once per token, so no coroutine per read)."""
    responses = call.__aiter__()
    while True:
        try:
            response = await responses.__anext__()
        except StopAsyncIteration:
            return
        except asyncio.CancelledError as exc:
            await _cancelled(exc)
        yield response


async def _cancelled(exc: asyncio.CancelledError) -> NoReturn:
    """``exc`` came from a gRPC call: re-raised where the task is being cancelled (after a checkpoint, where a
    cancel scope delivers its own cancellation), else the failed call it stands for."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        await anyio.lowlevel.checkpoint()
        raise exc
    raise grpc.aio.AioRpcError(grpc.StatusCode.CANCELLED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                               details="the call was cancelled locally: its channel was closed") from None
