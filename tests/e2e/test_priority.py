"""Request priority on a live mesh: given through the SDK, gRPC and HTTP, it decides who runs next."""

from __future__ import annotations

import anyio
import httpx
import pytest

from seawall import AsyncClient
from tests.e2e.conftest import random_prompts, start_mesh

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
async def test_a_more_important_request_runs_before_ones_that_queued_earlier(mode, tiny_model_dir, tmp_path,
                                                                             hf_greedy):
    # One sequence a step: while the first request runs, the others queue, and priority picks the next.
    m = start_mesh(tiny_model_dir, tmp_path / "logs", mode=mode, scheduler_args=["--max-num-seqs", "1"])
    try:
        prompts = random_prompts([12, 14, 16, 18], seed=41)
        done: list[str] = []
        got: dict[str, list[int]] = {}

        async with AsyncClient(m.grpc_address) as client, httpx.AsyncClient(base_url=m.http_url, timeout=60) as http:
            started = anyio.Event()

            async def first():
                got["first"] = []
                async for chunk in client.stream(prompts[0], max_tokens=300, temperature=0, ignore_eos=True):
                    got["first"].extend(chunk.token_ids)
                    started.set()
                done.append("first")

            async def sdk(name, prompt, priority):
                out = await client.generate(prompt, max_tokens=8, temperature=0, priority=priority)
                got[name] = out.token_ids
                done.append(name)

            async def over_http(name, prompt, priority):
                body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "priority": priority,
                        "return_token_ids": True}
                reply = await http.post("/v1/completions", json=body)
                got[name] = reply.json()["choices"][0]["token_ids"]
                done.append(name)

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await started.wait()
                tg.start_soon(over_http, "low", prompts[1], 5)
                await anyio.sleep(0.05)
                tg.start_soon(sdk, "normal", prompts[2], 0)
                await anyio.sleep(0.05)
                tg.start_soon(sdk, "urgent", prompts[3], -3)
                await anyio.sleep(0.05)
                assert "first" not in done  # all three queued behind it
        assert len(got["first"]) == 300
        if mode == "colocated":
            # The three wait as prompts, by priority. "first" keeps its slot while each of its steps is planned
            # after the last one's token: one planned ahead while that token is in flight may leave the slot to
            # the next in line (CI saw urgent and normal finish first that way), but never to a less important one.
            assert [name for name in done if name != "first"] == ["urgent", "normal", "low"]  # the reverse of arrival
        else:
            # They are prompts on the prefill worker only briefly; on the decode worker all four are decodes, one a
            # step, by priority. A step planned ahead can leave a slot to the next in line while a decode's token
            # is in flight, so only the urgent request's lead is certain: it arrived last and finishes long before
            # the 300-token request.
            assert done.index("urgent") < done.index("first")
        lengths = {"first": 300, "low": 8, "normal": 8, "urgent": 8}
        for i, name in enumerate(["first", "low", "normal", "urgent"]):
            assert got[name] == hf_greedy(prompts[i], lengths[name]), name
        bad = await httpx.AsyncClient(base_url=m.http_url).post("/v1/completions",
                                                                json={"prompt": "x", "priority": "high"})
        assert bad.status_code == 400 and "priority must be an integer" in bad.json()["error"]["message"]
    finally:
        m.stop()
