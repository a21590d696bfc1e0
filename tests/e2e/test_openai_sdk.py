"""The OpenAI-compatible HTTP API driven by the official ``openai`` client, as users' code drives it: its
request shapes, its response parsing (pydantic models, ``parse`` helpers) and its error classes."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from tests.e2e.conftest import random_prompts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class Verdict(BaseModel):
    """Short enough to finish well within max_tokens whatever the built-in model writes."""

    verdict: Literal["yes", "no", "unsure"]
    final: bool


@pytest.fixture(scope="module")
def client(default_mesh):
    with openai.OpenAI(base_url=f"{default_mesh.http_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_a_completion_of_token_ids_matches_transformers(client, model, hf_greedy):
    prompt = random_prompts([29], seed=11)[0]
    out = client.completions.create(model=model, prompt=prompt, max_tokens=7, temperature=0,
                                    extra_body={"return_token_ids": True})
    choice = out.choices[0]
    assert choice.token_ids == hf_greedy(prompt, 7) and choice.finish_reason == "length"
    assert out.usage.prompt_tokens == 29 and out.usage.completion_tokens == 7


def test_a_streamed_chat_with_usage_equals_the_unstreamed_one(client, model):
    messages = [{"role": "developer", "content": "Answer briefly."}, {"role": "user", "content": "Why bursts?"}]
    whole = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=10, temperature=0,
                                           user="u-1", metadata={"team": "a"}, store=False)
    stream = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_parse_returns_the_pydantic_model_of_the_response_format(client, model):
    out = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Is it raining?"}],
                                        response_format=Verdict, max_tokens=40, temperature=0)
    message = out.choices[0].message
    assert isinstance(message.parsed, Verdict) and out.choices[0].finish_reason == "stop"
    assert Verdict.model_validate_json(message.content) == message.parsed


def test_a_forced_pydantic_function_tool_comes_back_parsed(client, model):
    tool = openai.pydantic_function_tool(Verdict, name="record_verdict")
    out = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Decide."}],
                                        tools=[tool], tool_choice={"type": "function",
                                                                   "function": {"name": "record_verdict"}},
                                        max_tokens=40, temperature=0)
    choice = out.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "record_verdict"
    assert isinstance(call.function.parsed_arguments, Verdict)
    assert Verdict(**json.loads(call.function.arguments)) == call.function.parsed_arguments


@pytest.mark.anyio
async def test_the_async_client_streams_n_choices_of_a_completion(default_mesh, model):
    async with openai.AsyncOpenAI(base_url=f"{default_mesh.http_url}/v1", api_key="unused", max_retries=0) as c:
        stream = await c.completions.create(model=model, prompt="Burst", max_tokens=6, n=2, seed=3, stream=True)
        texts = ["", ""]
        async for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] += choice.text
        whole = await c.completions.create(model=model, prompt="Burst", max_tokens=6, n=2, seed=3)
    assert texts == [choice.text for choice in whole.choices]


def test_errors_arrive_as_the_clients_exception_classes(client, model):
    with pytest.raises(openai.NotFoundError, match="serves"):
        client.completions.create(model="not-this-one", prompt="hi", max_tokens=2)
    with pytest.raises(openai.NotFoundError, match="serves"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens must be"):
        client.completions.create(model=model, prompt="hi", max_tokens=-1)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], logprobs=True,
                                       top_logprobs=99)
    with pytest.raises(openai.BadRequestError, match="needs \"logprobs\": true"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], top_logprobs=2)
