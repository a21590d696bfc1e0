"""A worker told to stop (SIGTERM: a rolling update, a scale-in) leaves without losing work, with real
processes: its running decodes move with their KV to the worker that stays and go on there exactly, or, with
no worker to take them, finish where they are before it exits; either way no request is recomputed."""

from __future__ import annotations

import re
import signal

import anyio
import pytest

from seawall import AsyncClient
from tests.e2e.conftest import random_prompts, start_mesh

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]


async def _worker_holding_requests(m, client, role: str) -> str | None:
    holding = {w.address for w in (await client.stats()).workers if w.num_running}
    return next((name for name, address in m.worker_addresses.items()
                 if name.startswith(role) and address in holding), None)


async def _stream_and_stop_a_worker(m, prompts, max_tokens: int, role: str, decoding: bool = True):
    """Streams every prompt greedily; once all are decoding (or at once, ``decoding`` false), SIGTERMs a
    ``role`` worker holding some. Returns (tokens, finish reasons, what became of the worker: its name, its exit
    code, whether it exited before the last stream ended), and the reply to a request sent after."""
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    finish: dict[int, str] = {}
    stopped: dict[str, object] = {}

    async with AsyncClient(m.grpc_address) as client:
        async def one(i):
            async for chunk in client.stream(prompts[i], max_tokens=max_tokens, temperature=0):
                got[i].extend(chunk.token_ids)
                finish[i] = chunk.finish_reason

        async def stopper():
            with anyio.fail_after(60):
                while (decoding and min(len(v) for v in got.values()) < 5) or not (
                        victim := await _worker_holding_requests(m, client, role)):
                    if len(finish) == len(prompts) and all(finish.values()):
                        pytest.fail("every request finished before a worker was seen holding one")
                    await anyio.sleep(0.01)
            proc = m.child(victim).proc
            proc.send_signal(signal.SIGTERM)
            stopped["name"] = victim
            stopped["code"] = await anyio.to_thread.run_sync(proc.wait, 120)
            stopped["early"] = not all(finish.get(i) for i in range(len(prompts)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(stopper)
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        with anyio.fail_after(10):
            while len((await client.stats()).workers) != len(m.worker_addresses) - 1:
                await anyio.sleep(0.05)
        # The mesh goes on with the workers left.
        after = await client.generate(prompts[0], max_tokens=8, temperature=0)
    return got, finish, stopped, after


def _exact_and_nothing_recomputed(m, prompts, max_tokens: int, got, after, hf_greedy) -> None:
    """Every stream, and the request sent after, as transformers generates it; no worker failed, no request
    was recomputed."""
    assert m.counter("seawall_worker_failures") == 0 and m.counter("seawall_requests_moved") == 0
    for i, prompt in enumerate(prompts):
        assert got[i] == hf_greedy(prompt, max_tokens), f"request {i}"
    assert after.token_ids == hf_greedy(prompts[0], 8)


def _drained(m, name: str) -> tuple[int, int]:
    """(moved, finished there) from the worker's log line once its drain ended."""
    found = re.search(r"drained: (\d+) requests moved to other workers, (\d+) finished here",
                      m.child(name).log_path.read_text())
    assert found, f"{name} did not log the end of a drain"
    return int(found[1]), int(found[2])


async def test_a_stopped_worker_moves_its_decodes_to_the_worker_that_stays_and_exits(
        tiny_model_dir, tmp_path, hf_greedy):
    m = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated", num_decode=2,
                   worker_args=["--drain-timeout-s", "120"])
    try:
        prompts = random_prompts([10, 40, 90, 130], seed=7)
        max_tokens = 500
        got, finish, stopped, after = await _stream_and_stop_a_worker(m, prompts, max_tokens, "decode")
        assert stopped["code"] == 0 and stopped["early"]  # it did not wait for its requests to end
        moved, _ = _drained(m, stopped["name"])
        assert moved >= 1
        assert m.counter("seawall_migrations") >= 1
        _exact_and_nothing_recomputed(m, prompts, max_tokens, got, after, hf_greedy)
        assert all(finish[i] in ("stop", "length") for i in range(len(prompts)))
    finally:
        m.stop()


async def test_a_stopped_worker_with_no_peer_of_its_kind_finishes_its_requests_then_exits(
        tiny_model_dir, tmp_path, hf_greedy):
    # The only decode worker: nothing can take its decodes, so they end there; then it leaves, and the prefill
    # worker decodes what comes next.
    m = start_mesh(tiny_model_dir, tmp_path / "logs", worker_args=["--drain-timeout-s", "120"])
    try:
        prompts = random_prompts([20, 60], seed=8)
        max_tokens = 300
        got, finish, stopped, after = await _stream_and_stop_a_worker(m, prompts, max_tokens, "decode")
        assert stopped["code"] == 0 and not stopped["early"]
        moved, finished = _drained(m, stopped["name"])
        assert moved == 0 and finished >= 1
        _exact_and_nothing_recomputed(m, prompts, max_tokens, got, after, hf_greedy)
    finally:
        m.stop()


async def test_a_stopped_prefill_worker_gives_its_queued_prompts_to_the_other_and_hands_off_the_rest(
        tiny_model_dir, tmp_path, hf_greedy):
    # Small chunks: the prompts take dozens of steps each, so the worker is stopped with one mid-prompt and others
    # queued behind it (one sequence at a time) for seconds: with 6 prompts of ~300 tokens in chunks of 32 a
    # loaded box's SIGTERM and DrainWorker once came after the queue had run dry. The queued ones start on the
    # other prefill worker; the one it runs finishes its prompt there and its KV goes to the decode worker
    # before the worker exits.
    m = start_mesh(tiny_model_dir, tmp_path / "logs", num_prefill=2,
                   scheduler_args=["--chunk-size", "16", "--max-num-seqs", "1"],
                   worker_args=["--drain-timeout-s", "120"])
    try:
        prompts = random_prompts([600, 620, 640, 660, 680, 700, 720, 740], seed=9)
        max_tokens = 40
        got, finish, stopped, after = await _stream_and_stop_a_worker(m, prompts, max_tokens, "prefill",
                                                                      decoding=False)
        assert stopped["code"] == 0
        moved, _ = _drained(m, stopped["name"])
        assert moved >= 1
        _exact_and_nothing_recomputed(m, prompts, max_tokens, got, after, hf_greedy)
    finally:
        m.stop()
