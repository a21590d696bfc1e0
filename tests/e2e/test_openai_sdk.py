"""The OpenAI-compatible HTTP API driven by the official ``openai`` client, as users' code drives it: its
request shapes, its response parsing (pydantic models, ``parse`` helpers) and its error classes."""

from __future__ import annotations

import json
import time
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from seawall import Client
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


def test_a_model_is_retrieved_by_its_id_and_an_unknown_one_is_not_found(client, model):
    card = client.models.retrieve(model)
    assert card.id == model and card.object == "model" and card.max_model_len > 0
    with pytest.raises(openai.NotFoundError, match=f"serves '{model}'"):
        client.models.retrieve("org/not-here")


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
    # Found only while it runs (only end tokens allowed, held back by min_tokens): streamed, after the headers.
    stuck = {"allowed_token_ids": [1, 5], "min_tokens": 2}
    with pytest.raises(openai.BadRequestError, match="no token satisfies allowed_token_ids"):
        client.completions.create(model=model, prompt="hi", max_tokens=4, extra_body=stuck)
    stream = client.completions.create(model=model, prompt="hi", max_tokens=4, stream=True, extra_body=stuck)
    with pytest.raises(openai.APIError, match="no token satisfies allowed_token_ids"):
        list(stream)


# --- the Responses API -----------------------------------------------------------------------------------


WEATHER = {"type": "function", "name": "weather", "description": "The weather in a city now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}


def test_a_response_is_the_chat_reply_to_the_same_messages(client, model):
    out = client.responses.create(model=model, instructions="Answer briefly.", input="Why bursts?",
                                  max_output_tokens=9, temperature=0, metadata={"run": "1"})
    chat = client.chat.completions.create(model=model, messages=[{"role": "system", "content": "Answer briefly."},
                                                                 {"role": "user", "content": "Why bursts?"}],
                                          max_tokens=9, temperature=0)
    assert out.output_text == chat.choices[0].message.content
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.input_tokens == chat.usage.prompt_tokens and out.usage.output_tokens == 9
    assert out.metadata == {"run": "1"} and out.instructions == "Answer briefly." and out.model == model


def test_streamed_events_build_the_same_response(client, model):
    whole = client.responses.create(model=model, input="Stream me", max_output_tokens=7, temperature=0,
                                    include=["message.output_text.logprobs"], top_logprobs=2)
    events = list(client.responses.create(model=model, input="Stream me", max_output_tokens=7, temperature=0,
                                          include=["message.output_text.logprobs"], top_logprobs=2, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == whole.output_text == events[-1].response.output_text
    logprobs = [lp for e in deltas for lp in e.logprobs]
    assert [lp.token for lp in logprobs] == [lp.token for lp in whole.output[0].content[0].logprobs]
    assert len(logprobs) == 7 and all(len(lp.top_logprobs) == 2 for lp in logprobs)


def test_previous_response_id_continues_the_conversation_from_its_cached_prefix(client, model):
    first = client.responses.create(model=model, input="Tell me about traffic bursts " * 8, max_output_tokens=5,
                                    temperature=0)
    second = client.responses.create(model=model, previous_response_id=first.id, input="And then?",
                                     max_output_tokens=6, temperature=0)
    chat = client.chat.completions.create(model=model, max_tokens=6, temperature=0, messages=[
        {"role": "user", "content": "Tell me about traffic bursts " * 8},
        {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "And then?"}])
    assert second.output_text == chat.choices[0].message.content
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens >= 48  # the first turn's prompt blocks


def test_parse_and_the_stream_helper_return_the_text_formats_model(client, model):
    parsed = client.responses.parse(model=model, input="Is it raining?", text_format=Verdict, max_output_tokens=40,
                                    temperature=0)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Verdict)
    with client.responses.stream(model=model, input="Is it raining?", text_format=Verdict, max_output_tokens=40,
                                 temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed" and final.output_parsed == parsed.output_parsed


def test_a_forced_function_call_and_its_output_continue_the_conversation(client, model):
    call_out = client.responses.create(model=model, input="Weather?", tools=[WEATHER], max_output_tokens=40,
                                       tool_choice={"type": "function", "name": "weather"}, temperature=0)
    (call,) = call_out.output
    assert call.type == "function_call" and call.name == "weather" and call.status == "completed"
    assert json.loads(call.arguments)["city"] in ("Oslo", "Rome") and call_out.status == "completed"
    streamed = list(client.responses.create(model=model, input="Weather?", tools=[WEATHER], max_output_tokens=40,
                                            tool_choice={"type": "function", "name": "weather"}, temperature=0,
                                            stream=True))
    pieces = [e.delta for e in streamed if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1 and "".join(pieces) == call.arguments
    reply = client.responses.create(model=model, previous_response_id=call_out.id, max_output_tokens=5,
                                    temperature=0, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                           "output": "sunny"}])
    chat = client.chat.completions.create(model=model, max_tokens=5, temperature=0, messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": "weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}])
    assert reply.output_text == chat.choices[0].message.content


def test_stored_responses_are_retrieved_and_deleted_and_unstored_ones_are_not_kept(client, model):
    kept = client.responses.create(model=model, input="Keep me", max_output_tokens=3, temperature=0)
    assert client.responses.retrieve(kept.id).output_text == kept.output_text
    (item,) = client.responses.input_items.list(kept.id).data
    assert item.type == "message" and item.role == "user" and item.content[0].text == "Keep me"
    turn = client.responses.create(model=model, input=[{"role": "user", "content": "One"}, {
        "role": "user", "content": [{"type": "input_text", "text": "Two"}]}], max_output_tokens=2,
        previous_response_id=kept.id)
    pages = client.responses.input_items.list(turn.id, limit=1, order="asc")
    assert [i.content[0].text for i in pages] == ["One", "Two"]  # the SDK follows has_more / after
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.input_items.list(kept.id)
    gone = client.responses.create(model=model, input="Forget me", max_output_tokens=3, store=False)
    with pytest.raises(openai.NotFoundError, match="store false"):
        client.responses.create(model=model, input="More", previous_response_id=gone.id)


def _poll(client, response_id, until=("completed", "incomplete", "failed", "cancelled"), timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while (response := client.responses.retrieve(response_id)).status not in until:
        assert time.monotonic() < deadline, f"still {response.status} after {timeout_s} s"
        time.sleep(0.02)
    return response


def test_a_background_response_is_queued_then_polled_to_the_same_reply(client, model):
    whole = client.responses.create(model=model, input="Poll me", max_output_tokens=9, temperature=0)
    queued = client.responses.create(model=model, input="Poll me", max_output_tokens=9, temperature=0, background=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    done = _poll(client, queued.id)
    assert done.status == whole.status and done.output_text == whole.output_text and done.background is True
    assert done.usage.output_tokens == whole.usage.output_tokens
    reply = client.responses.create(model=model, input="And?", previous_response_id=queued.id, max_output_tokens=2)
    assert reply.status in ("completed", "incomplete")


def test_a_background_stream_left_early_goes_on_and_is_taken_up_where_it_was_left(client, model):
    stream = client.responses.create(model=model, input="Resume me", max_output_tokens=40, temperature=0,
                                     background=True, stream=True, extra_body={"ignore_eos": True})
    seen = []
    for event in stream:
        seen.append(event)
        if len(seen) == 6:
            break
    stream.close()  # the client goes away; the response goes on
    rid = seen[0].response.id
    assert [e.type for e in seen[:3]] == ["response.created", "response.queued", "response.in_progress"]
    assert seen[0].response.status == "queued" and seen[2].response.status == "in_progress"
    rest = list(client.responses.retrieve(rid, stream=True, starting_after=seen[-1].sequence_number))
    events = seen + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert rest[-1].type == "response.incomplete" and rest[-1].response.usage.output_tokens == 40
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == rest[-1].response.output_text == client.responses.retrieve(rid).output_text
    replay = list(client.responses.retrieve(rid, stream=True))  # after it ended, from the start
    assert [e.sequence_number for e in replay] == list(range(len(events)))


def test_a_background_response_is_cancelled_with_the_output_it_had_and_its_blocks_freed(client, model,
                                                                                        default_mesh):
    running = client.responses.create(model=model, input="Cancel me", max_output_tokens=3000, background=True,
                                      extra_body={"ignore_eos": True})
    with pytest.raises(openai.BadRequestError, match="still (queued|in_progress): cancel it first"):
        client.responses.delete(running.id)
    with pytest.raises(openai.BadRequestError, match="still (queued|in_progress): continue it once it has ended"):
        client.responses.create(model=model, input="More", previous_response_id=running.id)
    _poll(client, running.id, until=("in_progress",))
    cancelled = client.responses.cancel(running.id)
    assert cancelled.status == "cancelled" and 0 < cancelled.usage.output_tokens < 3000
    assert cancelled.output_text and cancelled.output[0].status == "incomplete"
    assert client.responses.cancel(running.id).status == "cancelled"  # again: the same response
    assert client.responses.retrieve(running.id).status == "cancelled"
    with Client(default_mesh.grpc_address) as grpc_client:
        deadline = time.monotonic() + 10
        while (stats := grpc_client.stats()).num_running or any(w.num_device_blocks_used for w in stats.workers):
            assert time.monotonic() < deadline, f"blocks still in use: {stats}"
            time.sleep(0.05)
    ended = client.responses.create(model=model, input="Done", max_output_tokens=2, background=True)
    _poll(client, ended.id)
    with pytest.raises(openai.BadRequestError, match="has already ended .* nothing to cancel"):
        client.responses.cancel(ended.id)
    plain = client.responses.create(model=model, input="Plain", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="not created with background: true; only background"):
        client.responses.cancel(plain.id)
    with pytest.raises(openai.BadRequestError, match="cannot be streamed again"):
        list(client.responses.retrieve(plain.id, stream=True))
    with pytest.raises(openai.BadRequestError, match="a background response is stored"):
        client.responses.create(model=model, input="x", background=True, store=False)


def test_responses_api_errors_say_what_to_send(client, model):
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        client.responses.create(model=model, input="x", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="takes input"):
        client.responses.create(model=model, input="x", extra_body={"messages": []})
    with pytest.raises(openai.NotFoundError, match="serves"):
        client.responses.create(model="gpt-5", input="x")
