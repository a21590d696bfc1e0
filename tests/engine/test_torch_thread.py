import asyncio
import threading

import anyio
import pytest
import torch

from services.engine.torch_thread import InlineTorch, TorchThread


@pytest.fixture
def restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_all_work_runs_on_one_thread_with_the_requested_torch_threads(restore_torch_threads):
    tt = TorchThread(2)
    try:
        assert torch.get_num_threads() == 1  # the caller never starts an OpenMP team of its own
        idents = {tt.call(threading.get_ident) for _ in range(3)}

        async def main():
            return {await tt.run(threading.get_ident) for _ in range(3)}, await tt.run(torch.get_num_threads)

        more, threads = anyio.run(main)
        assert len(idents | more) == 1 and threading.get_ident() not in idents
        assert threads == 2
        assert tt.call(lambda a, b: a + b, 2, 3) == 5
    finally:
        tt.close()


def test_default_keeps_the_callers_thread_count(restore_torch_threads):
    torch.set_num_threads(2)
    tt = TorchThread()
    try:
        assert tt.num_threads == 2 and tt.call(torch.get_num_threads) == 2
    finally:
        tt.close()


def test_errors_reach_the_caller(restore_torch_threads):
    tt = TorchThread(1)
    try:
        with pytest.raises(ZeroDivisionError):
            tt.call(lambda: 1 / 0)

        async def main():
            with pytest.raises(KeyError):
                await tt.run({}.__getitem__, "x")

        anyio.run(main)
    finally:
        tt.close()


def test_work_queued_in_order_runs_in_that_order_even_if_awaited_out_of_order(restore_torch_threads):
    tt = TorchThread(1)
    ran = []

    async def main():
        # Each call queues its work before it first yields: the tasks start in order, the awaits come reversed.
        tasks = [asyncio.ensure_future(tt.run_in_order(ran.append, i)) for i in range(5)]
        for task in reversed(tasks):
            await task

    try:
        asyncio.run(main())
        assert ran == [0, 1, 2, 3, 4]
    finally:
        tt.close()


def test_inline_work_runs_on_the_callers_thread_with_the_requested_torch_threads(restore_torch_threads):
    torch.set_num_threads(1)
    inline = InlineTorch(2)
    assert inline.num_threads == 2 and torch.get_num_threads() == 2  # this thread is the torch thread now
    assert inline.call(threading.get_ident) == threading.get_ident()

    async def main():
        with pytest.raises(ZeroDivisionError):
            await inline.run_in_order(lambda: 1 / 0)
        return await inline.run(threading.get_ident), await inline.run_in_order(lambda a, b: a * b, 3, 4)

    assert anyio.run(main) == (threading.get_ident(), 12)
    inline.close()
