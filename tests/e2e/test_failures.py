"""Behaviour at the edges, with real processes: aborts and disconnects free every block, a killed decode or
prefill worker's requests finish exactly on the workers left, overload is refused with RESOURCE_EXHAUSTED."""

from __future__ import annotations

import signal

import anyio
import httpx
import pytest

from seawall import AsyncClient
from seawall.v1 import worker_pb2
from services.common.errors import ResourceExhausted, Unavailable
from tests.e2e.conftest import generate_all, greedy_misses, random_prompts, start_mesh
from tests.lora_adapters import peft_greedy

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]


async def _wait_all_blocks_free(client: AsyncClient, timeout_s: float = 10.0):
    with anyio.fail_after(timeout_s):
        while True:
            stats = await client.stats()
            if stats.num_running == 0 and all(w.num_device_blocks_used == 0 and w.num_host_blocks_used == 0
                                              for w in stats.workers):
                return stats
            await anyio.sleep(0.05)


async def test_abort_ends_the_stream_and_frees_every_block(default_mesh):
    async with AsyncClient(default_mesh.grpc_address) as client:
        chunks = []
        async for chunk in client.stream(random_prompts([200])[0], request_id="to-abort", max_tokens=2000,
                                         temperature=0, ignore_eos=True):
            chunks.append(chunk)
            if len(chunks) == 3:
                assert await client.abort("to-abort")
        assert chunks[-1].finish_reason == "abort"
        assert not await client.abort("to-abort")  # no longer live
        await _wait_all_blocks_free(client)


async def test_a_client_that_goes_away_frees_every_block(default_mesh):
    async with AsyncClient(default_mesh.grpc_address) as client:
        n = 0
        async for _ in client.stream(random_prompts([300])[0], max_tokens=2000, ignore_eos=True):
            n += 1
            if n == 3:
                break  # leaving the loop cancels the call
        await _wait_all_blocks_free(client)


async def test_a_non_streaming_caller_that_gives_up_frees_every_block(default_mesh):
    # generate() asks for one final response (final_only): the server holds no stream to write to, so the
    # abort on a cancelled call must come from waiting for the end, not from a failed write.
    async with AsyncClient(default_mesh.grpc_address) as client:
        with anyio.move_on_after(0.5):
            await client.generate(random_prompts([300])[0], max_tokens=3000, ignore_eos=True)
            pytest.fail("a 3000-token request finished in 0.5 s")
        await _wait_all_blocks_free(client)


@pytest.mark.parametrize("n", [1, 3])  # n > 1: one mesh request per choice, every one aborted
async def test_an_http_client_that_disconnects_mid_stream_frees_every_block(default_mesh, n):
    # 3900 tokens take over 10 s here: blocks free within 5 s only if the disconnect aborted every choice.
    body = {"prompt": random_prompts([150])[0], "max_tokens": 3900, "ignore_eos": True, "stream": True, "n": n}
    async with httpx.AsyncClient(base_url=default_mesh.http_url, timeout=30) as http:
        async with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            lines = 0
            async for line in response.aiter_lines():
                lines += bool(line.startswith("data:"))
                if lines == 3 * n:
                    break
    async with AsyncClient(default_mesh.grpc_address) as client:
        await _wait_all_blocks_free(client, timeout_s=5.0)


async def test_an_http_stream_given_up_while_it_queues_leaves_the_queue(tiny_model_dir, tmp_path):
    # A stream's headers wait for its first token (they carry x-queue-time), so no response is under way to
    # notice the client leaving: the wait for that token must. One sequence at a time: the stream queues
    # behind a 3900-token request (over 10 s here) and must be gone from the queue while that one still runs.
    m = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated",
                   scheduler_args=["--max-num-seqs", "1"])
    try:
        prompt = random_prompts([20])[0]
        async with AsyncClient(m.grpc_address) as client:
            async def hog():
                async for _ in client.stream(prompt, request_id="hog", max_tokens=3900, ignore_eos=True):
                    pass

            async with anyio.create_task_group() as tg:
                tg.start_soon(hog)
                with anyio.fail_after(30):
                    while (await client.stats()).num_running != 1:
                        await anyio.sleep(0.02)
                body = {"prompt": prompt, "max_tokens": 10, "stream": True}
                async with httpx.AsyncClient(base_url=m.http_url, timeout=1.0) as http:
                    with pytest.raises(httpx.ReadTimeout):  # no headers: it queues
                        async with http.stream("POST", "/v1/completions", json=body):
                            pass
                with anyio.fail_after(5):
                    while (stats := await client.stats()).num_waiting:
                        await anyio.sleep(0.05)
                assert stats.num_running == 1 and await client.abort("hog")  # gone while the hog still ran
            await _wait_all_blocks_free(client)
    finally:
        m.stop()


async def test_a_scheduler_told_to_stop_finishes_the_streams_it_holds_and_refuses_new_ones(tiny_model_dir, tmp_path):
    # A rolling restart's SIGTERM: the stream in flight ends whole, new requests are refused with UNAVAILABLE
    # (another replica's to take), health says so, and the scheduler exits cleanly once the stream is done.
    m = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated", scheduler_args=["--drain-timeout-s", "120"])
    try:
        prompt = random_prompts([20])[0]
        scheduler = m.child("scheduler").proc
        got, finish, streaming = [], [], anyio.Event()
        async with AsyncClient(m.grpc_address) as client:
            async def long():
                async for chunk in client.stream(prompt, max_tokens=1500, ignore_eos=True):
                    got.extend(chunk.token_ids)
                    finish.append(chunk.finish_reason)
                    streaming.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(long)
                await streaming.wait()
                scheduler.send_signal(signal.SIGTERM)
                with anyio.fail_after(30):  # a request sent as the signal lands may still be taken
                    while True:
                        try:
                            await client.generate(prompt, max_tokens=1)
                        except Unavailable as exc:
                            assert "shutting down" in str(exc)
                            break
                        await anyio.sleep(0.05)
                async with httpx.AsyncClient(base_url=m.http_url, timeout=10) as http:
                    health = await http.get("/health")
                    refused = await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
                assert health.status_code == 503 and health.json()["status"] == "draining"
                assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
                assert len(got) < 1500  # all of that while the stream still ran
        assert len(got) == 1500 and finish[-1] == "length"
        assert await anyio.to_thread.run_sync(scheduler.wait, 60) == 0
    finally:
        m.stop()


@pytest.mark.parametrize("n", [1, 3])
async def test_an_http_client_that_gives_up_on_a_non_streaming_completion_frees_every_block(default_mesh, n):
    # 3900 tokens take over 10 s here: blocks free within 5 s only if the disconnect aborted the request.
    body = {"prompt": random_prompts([150])[0], "max_tokens": 3900, "ignore_eos": True, "n": n}
    async with httpx.AsyncClient(base_url=default_mesh.http_url, timeout=0.5) as http:
        with pytest.raises(httpx.ReadTimeout):  # the client closes the connection; the server is mid-request
            await http.post("/v1/completions", json=body)
    async with AsyncClient(default_mesh.grpc_address) as client:
        await _wait_all_blocks_free(client, timeout_s=5.0)


async def test_killing_the_decode_worker_mid_stream_still_completes_every_request_exactly(
        tiny_model_dir, tmp_path, hf_greedy, lora_dirs):
    # Planning every step ahead: the dead worker takes sampled tokens that never arrive with it. Half the
    # requests run a LoRA adapter, which the worker they move to loads.
    m = start_mesh(tiny_model_dir, tmp_path / "logs", num_decode=2,
                   scheduler_args=["--chunk-size", "64", "--step-pipelining", "all",
                                   "--lora-modules", f"alpha={lora_dirs['alpha']}"])
    try:
        prompts = random_prompts([10, 40, 90, 130], seed=5)
        models = ["", "alpha", "", "alpha"]
        max_tokens = 200  # ~0.6 s of decoding (80 once left a killer waiting 60 s: likely all done between polls)
        got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
        finish: dict[int, str] = {}
        killed = anyio.Event()

        async with AsyncClient(m.grpc_address) as client:
            async def one(i):
                async for chunk in client.stream(prompts[i], max_tokens=max_tokens, temperature=0,
                                                 model=models[i]):
                    got[i].extend(chunk.token_ids)
                    finish[i] = chunk.finish_reason

            async def decode_worker_holding_requests() -> str | None:
                holding = {w.address for w in (await client.stats()).workers
                           if w.role == worker_pb2.WORKER_ROLE_DECODE and w.num_running}
                return next((name for name, address in m.worker_addresses.items() if address in holding), None)

            async def killer():
                # Every request decoding, then a decode worker holding some killed (one that had finished its
                # share, or had none yet, would leave nothing to move: a busy box saw both).
                with anyio.fail_after(60):
                    while min(len(v) for v in got.values()) < 5 or not (victim := await decode_worker_holding_requests()):
                        if len(finish) == len(prompts) and all(finish.values()):
                            pytest.fail("every request finished before a decode worker was seen holding one")
                        await anyio.sleep(0.01)
                m.kill(victim)
                killed.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(killer)
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            with anyio.fail_after(10):  # the dead worker is dropped even if none of the requests was on it then
                while len((stats := await client.stats()).workers) != 2:
                    await anyio.sleep(0.05)
        assert killed.is_set()
        assert [w.address for w in stats.workers if w.role == worker_pb2.WORKER_ROLE_DECODE] != []
        assert m.counter("seawall_worker_failures", role="decode") == 1
        assert m.counter("seawall_requests_moved") >= 1
        for i, prompt in enumerate(prompts):
            want = (peft_greedy(tiny_model_dir, lora_dirs["alpha"], [prompt], max_tokens)[0] if models[i]
                    else hf_greedy(prompt, max_tokens))
            assert got[i] == want, f"request {i}"
            assert finish[i] in ("stop", "length")
    finally:
        m.stop()


@pytest.mark.parametrize("num_prefill", [2, 1])
async def test_killing_a_prefill_worker_mid_prompt_still_completes_every_request_exactly(
        num_prefill, tiny_model_dir, tmp_path, hf_greedy):
    # Small chunks keep the long prompts prefilling while the worker dies; with one prefill worker the decode
    # worker is the only one left and computes the prompts itself.
    m = start_mesh(tiny_model_dir, tmp_path / "logs", num_prefill=num_prefill,
                   scheduler_args=["--chunk-size", "16"])
    try:
        prompts = random_prompts([1500, 1800, 2100, 40], seed=7)
        max_tokens = 24
        got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
        killed_at: list[int] = []

        async with AsyncClient(m.grpc_address) as client:
            async def one(i):
                async for chunk in client.stream(prompts[i], max_tokens=max_tokens, temperature=0):
                    got[i].extend(chunk.token_ids)

            async def killer():
                with anyio.fail_after(60):
                    # A prefill worker computes a long prompt, some of its blocks in and many to go: that one
                    # dies. Over the short prompt's 3 blocks and under 60, each long prompt on it (94 blocks and
                    # more) has 34 chunks or more left: a busy box's delay between these stats and the kill must
                    # not let it finish and hand off, nor its polls skip the window (a block a chunk).
                    while True:
                        stats = await client.stats()
                        busy = {w.address for w in stats.workers if w.role == worker_pb2.WORKER_ROLE_PREFILL
                                and w.num_running and 3 < w.num_device_blocks_used < 60}
                        if busy and any(len(v) == 0 for v in got.values()):
                            break
                        await anyio.sleep(0.005)
                killed_at.append(sum(len(v) == 0 for v in got.values()))
                m.kill(next(name for name, address in m.worker_addresses.items() if address in busy))

            async with anyio.create_task_group() as tg:
                tg.start_soon(killer)
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            stats = await _wait_all_blocks_free(client)
        assert killed_at and killed_at[0] > 0  # some prompt had not produced its first token yet
        assert len(stats.workers) == num_prefill  # the killed one dropped
        assert m.counter("seawall_worker_failures", role="prefill") == 1
        assert m.counter("seawall_requests_moved") >= 1  # the prompt it was computing
        for i, prompt in enumerate(prompts):
            assert got[i] == hf_greedy(prompt, max_tokens), f"request {i}"
    finally:
        m.stop()


async def test_a_worker_that_dies_while_idle_is_dropped_and_the_mesh_keeps_serving(tiny_model_dir, tmp_path):
    m = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated", num_decode=2, http=False)
    try:
        async with AsyncClient(m.grpc_address) as client:
            assert len((await client.stats()).workers) == 2
            m.kill("decode-1")
            with anyio.fail_after(10):  # noticed without a request to send it
                while len((await client.stats()).workers) != 1:
                    await anyio.sleep(0.05)
            out = await client.generate(random_prompts([20])[0], max_tokens=4, temperature=0, ignore_eos=True)
            assert len(out.token_ids) == 4
    finally:
        m.stop()


async def test_a_restarted_scheduler_gets_its_workers_back_and_serves_as_before(tiny_model_dir, tmp_path):
    """The scheduler crashes and comes back on its address (a redeployed container): the live workers register
    with it again on their own, drop what they held for the old one, and the disaggregated path (prompt on the
    prefill worker, KV over NIXL, decode on the decode worker) gives the same greedy tokens as before."""
    m = start_mesh(tiny_model_dir, tmp_path / "logs", http=False)
    prompts = random_prompts([40, 70])
    try:
        async with AsyncClient(m.grpc_address) as client:
            before = [o.token_ids for o in await generate_all(client, prompts, max_tokens=8, temperature=0,
                                                              ignore_eos=True)]
        m.kill("scheduler")
        m.respawn("scheduler", m.grpc_address)
        async with AsyncClient(m.grpc_address) as client:
            with anyio.fail_after(30):
                while len((await client.stats()).workers) != 2:
                    await anyio.sleep(0.1)
            after = [o.token_ids for o in await generate_all(client, prompts, max_tokens=8, temperature=0,
                                                             ignore_eos=True)]
            assert after == before
            roles = {w.role for w in (await client.stats()).workers}
            assert roles == {worker_pb2.WORKER_ROLE_PREFILL, worker_pb2.WORKER_ROLE_DECODE}
            await _wait_all_blocks_free(client)
    finally:
        m.stop()


async def test_more_than_the_queue_holds_is_refused_with_resource_exhausted(tiny_model_dir, tmp_path):
    m = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated",
                   scheduler_args=["--max-num-seqs", "1", "--max-queue-len", "2"])
    try:
        prompt = random_prompts([20])[0]
        async with AsyncClient(m.grpc_address) as client:
            refused = 0
            streams = []
            for _ in range(6):
                streams.append(client.stream(prompt, max_tokens=100, ignore_eos=True))
            results = []

            async def consume(s):
                try:
                    async for _ in s:
                        pass
                    results.append("ok")
                except ResourceExhausted as exc:
                    results.append(str(exc))

            # All at once: sent 50 ms apart, a busy box's scheduler finished the first before the last came.
            async with anyio.create_task_group() as tg:
                for s in streams:
                    tg.start_soon(consume, s)
            refused = [r for r in results if r != "ok"]
            assert refused and all("queued" in r for r in refused) and "ok" in results
            async with httpx.AsyncClient(base_url=m.http_url, timeout=60) as http:
                calls = [http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 100, "ignore_eos": True})
                         for _ in range(5)]
                codes = []

                async def post(c):
                    r = await c
                    codes.append((r.status_code, r.headers.get("retry-after")))

                async with anyio.create_task_group() as tg:
                    for c in calls:
                        tg.start_soon(post, c)
            assert (429, "1") in codes and any(code == 200 for code, _ in codes)
    finally:
        m.stop()


async def test_with_the_decode_worker_gone_the_prefill_worker_decodes_then_hands_off_when_one_returns(
        tiny_model_dir, tmp_path, hf_model):
    # Multi-step decoding: a result of the prefill worker holds several tokens of a request, and the first
    # one after a decode worker is back hands the request off (once).
    m = start_mesh(tiny_model_dir, tmp_path / "logs",
                   scheduler_args=["--chunk-size", "64", "--decode-steps", "4"], http=False)
    try:
        prompts = random_prompts([20, 100], seed=6)
        # Long enough to outlast a worker's restart (~3 s here) while the prefill worker decodes alone: 2000 was not
        # once the engine got faster (both requests finished first). 100 + 3900 tokens fit the 4096 context.
        max_tokens = 3900
        got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
        finish: dict[int, str] = {}
        phases: list[str] = []

        async with AsyncClient(m.grpc_address) as client:
            async def one(i):
                async for chunk in client.stream(prompts[i], max_tokens=max_tokens, temperature=0):
                    got[i].extend(chunk.token_ids)
                    finish[i] = chunk.finish_reason

            async def decoding_on(role: int) -> bool:
                stats = await client.stats()
                return any(w.role == role and w.num_running > 0 for w in stats.workers)

            async def chaos():
                with anyio.fail_after(120):
                    while min(len(v) for v in got.values()) < 5:  # every request is decoding on decode-1
                        await anyio.sleep(0.01)
                    m.kill("decode-1")
                    while not await decoding_on(1):  # recomputed, decoding on prefill-0 (role 1)
                        await anyio.sleep(0.01)
                    phases.append("decoding on prefill-0")
                    await anyio.to_thread.run_sync(m.respawn, "decode-1")
                    while not await decoding_on(2):  # handed off to the new decode worker (role 2)
                        await anyio.sleep(0.01)
                    phases.append("handed off")

            async with anyio.create_task_group() as tg:
                tg.start_soon(chaos)
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            stats = await client.stats()
        assert phases == ["decoding on prefill-0", "handed off"]
        for i, prompt in enumerate(prompts):
            # 3900 tokens each: checked in one teacher-forced pass (~0.4 s) rather than generated (~17 s).
            assert len(got[i]) == max_tokens and greedy_misses(hf_model, prompt, got[i]) == [], f"request {i}"
            assert finish[i] == "length"
        assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)
    finally:
        m.stop()
