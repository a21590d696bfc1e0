"""GenerateBatch through the live mesh: several requests in one call, their outputs interleaved in one stream.

Outputs are token-identical to transformers and to one call per request; a bad request refuses the whole
batch before anything is queued; a caller that goes away aborts every request of its batch.
"""

from __future__ import annotations

import anyio
import grpc
import pytest

from seawall import AsyncClient
from seawall.client import CHANNEL_OPTIONS, build_request
from seawall.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.errors import InvalidArgument, ResourceExhausted
from tests.e2e.conftest import random_prompts, start_mesh
from tests.e2e.test_failures import _wait_all_blocks_free

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

LENS = [1, 16, 17, 90, 200]


async def test_a_batch_matches_transformers_and_one_call_per_request(default_mesh, hf_greedy):
    prompts = random_prompts(LENS, seed=5)
    async with AsyncClient(default_mesh.grpc_address) as client:
        batch = await client.generate_batch(prompts, max_tokens=9, temperature=0)
        singles = [await client.generate(p, max_tokens=9, temperature=0) for p in prompts]
        for i, (prompt, out, single) in enumerate(zip(prompts, batch, singles, strict=True)):
            assert out.token_ids == hf_greedy(prompt, 9) == single.token_ids, f"prompt {i}"
            assert out.text == single.text and out.finish_reason in ("stop", "length")
            assert out.prompt_tokens == len(prompt)
        await _wait_all_blocks_free(client)


async def test_streamed_and_final_only_requests_share_one_batch_stream(default_mesh, hf_greedy):
    prompts = random_prompts([30, 60, 120], seed=6)
    requests = [build_request(p, f"mixed-{i}", {"max_tokens": 12, "temperature": 0, "ignore_eos": True},
                              final_only=i == 1) for i, p in enumerate(prompts)]
    tokens: list[list[int]] = [[] for _ in prompts]
    outputs: list[int] = [0] * len(prompts)
    async with grpc.aio.insecure_channel(default_mesh.grpc_address, options=CHANNEL_OPTIONS) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        async for reply in stub.GenerateBatch(scheduler_pb2.GenerateBatchRequest(requests=requests)):
            for out in reply.outputs:
                assert out.response.request_id == f"mixed-{out.index}"
                tokens[out.index].extend(out.response.token_ids)
                outputs[out.index] += 1
    for i, prompt in enumerate(prompts):
        with_eos = hf_greedy(prompt, 12)
        assert tokens[i][: len(with_eos)] == with_eos, f"prompt {i}"
        assert len(tokens[i]) == 12
    assert outputs[1] == 1  # final_only: the whole output in one entry
    assert outputs[0] > 1 and outputs[2] > 1  # streamed: an entry per step that produced tokens


async def test_one_bad_request_refuses_the_whole_batch_and_queues_nothing(default_mesh):
    good = random_prompts([40], seed=7)[0]
    async with AsyncClient(default_mesh.grpc_address) as client:
        before = (await client.stats()).num_finished
        with pytest.raises(InvalidArgument, match=r"requests\[2\]: prompt token id 5000000 is outside"):
            await client.generate_batch([good, good, [5_000_000]], max_tokens=4)
        with pytest.raises(InvalidArgument, match=r"requests\[1\]: set the prompt"):
            async with grpc.aio.insecure_channel(default_mesh.grpc_address) as channel:
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                call = stub.GenerateBatch(scheduler_pb2.GenerateBatchRequest(requests=[
                    build_request(good, None, {}), scheduler_pb2.GenerateRequest()]))
                try:
                    await call.read()
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                    raise InvalidArgument(exc.details()) from None
        with pytest.raises(InvalidArgument, match="'twice' appears more than once in the batch"):
            async with grpc.aio.insecure_channel(default_mesh.grpc_address) as channel:
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                call = stub.GenerateBatch(scheduler_pb2.GenerateBatchRequest(
                    requests=[build_request(good, "twice", {}), build_request(good, "twice", {})]))
                try:
                    await call.read()
                except grpc.aio.AioRpcError as exc:
                    raise InvalidArgument(exc.details()) from None
        stats = await _wait_all_blocks_free(client)
        assert stats.num_finished == before  # nothing of the refused batches ran


async def test_a_caller_that_goes_away_aborts_every_request_of_its_batch(default_mesh):
    prompts = random_prompts([100, 200, 300], seed=8)
    async with AsyncClient(default_mesh.grpc_address) as client:
        with anyio.move_on_after(0.5):
            await client.generate_batch(prompts, max_tokens=3000, ignore_eos=True)
            pytest.fail("three 3000-token requests finished in 0.5 s")
        await _wait_all_blocks_free(client)


async def test_a_batch_larger_than_the_queue_is_refused_whole(tiny_model_dir, tmp_path):
    m = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated", http=False,
                   scheduler_args=["--max-queue-len", "3", "--max-num-seqs", "1"])
    try:
        prompts = random_prompts([20] * 4, seed=9)
        async with AsyncClient(m.grpc_address) as client:
            with pytest.raises(InvalidArgument, match=r"a batch of 4 requests can never fit the queue \(3 places"):
                await client.generate_batch(prompts, max_tokens=4)
            # One long request runs (one sequence a step) and one waits behind it: two places are left.
            busy = [build_request(prompts[0], "long", {"max_tokens": 3000, "ignore_eos": True}),
                    build_request(prompts[1], "behind", {"max_tokens": 4})]
            async with grpc.aio.insecure_channel(m.grpc_address, options=CHANNEL_OPTIONS) as channel:
                call = scheduler_pb2_grpc.SchedulerStub(channel).GenerateBatch(
                    scheduler_pb2.GenerateBatchRequest(requests=busy))
                await call.read()  # the long one is running
                with pytest.raises(ResourceExhausted, match=r"a batch of 3 requests does not fit the queue \(2 of 3"):
                    await client.generate_batch(prompts[:3], max_tokens=4)
                call.cancel()
            await _wait_all_blocks_free(client)
            done = await client.generate_batch(prompts[:3], max_tokens=4, ignore_eos=True)
            assert [len(c.token_ids) for c in done] == [4, 4, 4]
    finally:
        m.stop()
