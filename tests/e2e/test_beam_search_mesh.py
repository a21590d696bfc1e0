"""Beam search through the live mesh (disaggregated: each step's one-token requests run on the prefill worker,
their shared prefix from its cache): the OpenAI API's ``use_beam_search`` (completions and chat, streamed or
not), the SDK's ``beam_search`` over gRPC, each equal to transformers' ``generate(num_beams)``; bad options
refused saying what to change; and every block free afterwards."""

from __future__ import annotations

import functools

import anyio
import httpx
import openai
import pytest

from seawall import AsyncClient, Client
from services.common.beam_search import BeamParams
from services.common.errors import InvalidArgument
from tests.beam_oracle import assert_beams_match, hf_beams
from tests.e2e.conftest import random_prompts

pytestmark = [pytest.mark.slow, pytest.mark.oracle, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def client(default_mesh):
    with openai.OpenAI(base_url=f"{default_mesh.http_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def eos(hf_model):
    ids = hf_model.generation_config.eos_token_id
    return tuple(ids if isinstance(ids, list) else [ids])


def test_completions_return_each_prompt_s_beams_as_transformers_ranks_them(client, hf_model, eos):
    prompts = random_prompts([19, 40], seed=21)
    out = client.completions.create(model="", prompt=prompts, max_tokens=10, n=3,
                                    extra_body={"use_beam_search": True, "length_penalty": 0.7,
                                                "return_token_ids": True})
    assert [c.index for c in out.choices] == list(range(6))
    for i, prompt in enumerate(prompts):
        expected = hf_beams(hf_model, prompt, BeamParams(3, 10, 0.7, False, eos))
        assert [c.token_ids for c in out.choices[3 * i: 3 * i + 3]] == [tokens for tokens, _ in expected]
    assert out.usage.prompt_tokens == 59
    assert out.usage.completion_tokens == sum(len(c.token_ids) for c in out.choices)


def test_a_streamed_chat_beam_search_sends_each_beam_whole(client, default_mesh):
    messages = [{"role": "user", "content": "Name a bay."}]
    body = {"model": "", "messages": messages, "max_tokens": 6, "n": 2, "use_beam_search": True,
            "early_stopping": True}
    whole = client.chat.completions.create(**{k: v for k, v in body.items() if k not in ("use_beam_search",
                                                                                         "early_stopping")},
                                           extra_body={"use_beam_search": True, "early_stopping": True})
    chunks = list(client.chat.completions.create(model="", messages=messages, max_tokens=6, n=2, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"use_beam_search": True, "early_stopping": True}))
    streamed = [c.choices[0] for c in chunks if c.choices]
    assert [(c.index, c.delta.content, c.finish_reason) for c in streamed] == [
        (c.index, c.message.content, c.finish_reason) for c in whole.choices]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_the_sdk_s_beam_search_equals_transformers_with_scores(default_mesh, hf_model, eos):
    prompt = random_prompts([33], seed=5)[0]
    with Client(default_mesh.grpc_address) as sdk:
        got = sdk.beam_search(prompt, 4, max_tokens=8, length_penalty=2.0, early_stopping="never")
    assert_beams_match([(h.token_ids, h.score) for h in got], hf_beams(hf_model, prompt, BeamParams(4, 8, 2.0,
                                                                                                    "never", eos)))
    assert all(h.finish_reason in ("stop", "length") for h in got)


def test_options_a_beam_search_cannot_honour_are_refused_saying_so(client, default_mesh):
    with pytest.raises(openai.BadRequestError, match="top_p cannot be used with beam search"):
        client.completions.create(model="", prompt="a", n=2, top_p=0.5, extra_body={"use_beam_search": True})
    with pytest.raises(openai.BadRequestError, match="logprobs cannot be used with beam search"):
        client.completions.create(model="", prompt="a", n=2, logprobs=1, extra_body={"use_beam_search": True})
    with pytest.raises(openai.BadRequestError, match="early_stopping"):
        client.completions.create(model="", prompt="a", n=2, extra_body={"use_beam_search": True,
                                                                          "early_stopping": "soon"})
    with pytest.raises(openai.BadRequestError, match="tools cannot be used with use_beam_search"):
        client.chat.completions.create(model="", messages=[{"role": "user", "content": "x"}], n=2,
                                       tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
                                       tool_choice="required", extra_body={"use_beam_search": True})
    with pytest.raises(openai.BadRequestError, match="n <= 18"):
        client.completions.create(model="", prompt="a", n=19, extra_body={"use_beam_search": True})
    with Client(default_mesh.grpc_address) as sdk, pytest.raises(InvalidArgument, match="min_tokens cannot be used"):
        sdk.beam_search("a", 2, min_tokens=3)


@pytest.mark.anyio
async def test_a_client_that_leaves_mid_search_stops_it_and_leaves_no_block_held(default_mesh):
    body = {"model": "", "prompt": random_prompts([300], seed=4)[0], "max_tokens": 1000, "n": 4,
            "use_beam_search": True, "ignore_eos": True}

    def looked_up(stats) -> int:  # grows with every step's requests
        return sum(w.num_prefix_queried_blocks for w in stats.workers)

    async with httpx.AsyncClient(timeout=60) as http, AsyncClient(default_mesh.grpc_address) as sdk:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(http.post, f"{default_mesh.http_url}/v1/completions", json=body))
            before = looked_up(await sdk.stats())
            with anyio.fail_after(20):
                while looked_up(await sdk.stats()) < before + 10 * 18:  # ten steps of four beams in
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        # The search stops: a second without a step queued (a step takes milliseconds), well before its end.
        with anyio.fail_after(30):
            last = -1
            while (now := looked_up(await sdk.stats())) != last:
                last = now
                await anyio.sleep(1.0)
        assert last - before < 1000 * 4 * 18 // 4  # a whole search looks up 18+ blocks per beam and step
        stats = await sdk.stats()
        assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)


def test_steps_copy_the_beams_tails_and_metrics_count_them(client, default_mesh):
    def tail_tokens() -> float:
        text = httpx.get(f"{default_mesh.http_url}/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("seawall_prefix_cache_tail_tokens_total"))

    before = tail_tokens()
    client.completions.create(model="", prompt=random_prompts([37], seed=9)[0], max_tokens=5, n=2,
                              extra_body={"use_beam_search": True, "ignore_eos": True})
    assert tail_tokens() > before  # each step after the first copied its beams' partly filled blocks
