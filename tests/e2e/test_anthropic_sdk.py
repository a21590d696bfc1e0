"""Anthropic's Messages API (``/v1/messages``) driven by the official ``anthropic`` client, as agentic clients
drive it: its request shapes, its stream accumulation and its error classes; each reply checked against the
chat completion of the same conversation."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.e2e.test_openai_api import hermes_http  # noqa: F401 - a fixture: a mesh with tool and reasoning parsers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WEATHER = {"name": "weather", "description": "The weather in a city now",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}},
                            "required": ["city"], "additionalProperties": False}}
# This client's types no longer name temperature (newer Claude models fix it); the API still takes it.
GREEDY = {"temperature": 0}
WEATHER_CHAT = {"type": "function", "function": {"name": "weather", "description": WEATHER["description"],
                                                 "parameters": WEATHER["input_schema"]}}


@pytest.fixture(scope="module")
def client(default_mesh):
    with anthropic.Anthropic(base_url=default_mesh.http_url, api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def chat(default_mesh):
    with openai.OpenAI(base_url=f"{default_mesh.http_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def model(chat):
    return chat.models.list().data[0].id


def _chat_text(chat, model, messages, max_tokens, **kwargs) -> str:
    out = chat.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0, **kwargs)
    return out.choices[0].message.content


def test_a_message_is_the_chat_reply_to_the_same_conversation(client, chat, model):
    out = client.messages.create(model=model, max_tokens=9, system="Answer briefly.", extra_body=GREEDY,
                                 messages=[{"role": "user", "content": "Why bursts?"}], metadata={"user_id": "u-1"})
    (block,) = out.content
    want = chat.chat.completions.create(model=model, max_tokens=9, temperature=0, messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Why bursts?"}])
    assert block.type == "text" and block.text == want.choices[0].message.content
    assert out.stop_reason == "max_tokens" and out.stop_sequence is None and out.model == model
    assert out.role == "assistant" and out.id.startswith("msg_")
    assert out.usage.output_tokens == 9
    assert out.usage.input_tokens + out.usage.cache_read_input_tokens == want.usage.prompt_tokens


def test_the_stream_helper_builds_the_same_message(client, model):
    kwargs = dict(model=model, max_tokens=8, extra_body=GREEDY, messages=[{"role": "user", "content": "Stream me"}])
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == whole.content[0].text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 8


def test_a_stop_sequence_ends_the_reply_before_it_and_is_named(client, model):
    messages = [{"role": "user", "content": "Say something long"}]
    text = client.messages.create(model=model, max_tokens=16, extra_body=GREEDY, messages=messages).content[0].text
    stop = text[6:9]
    out = client.messages.create(model=model, max_tokens=16, extra_body=GREEDY, messages=messages, stop_sequences=[stop])
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == stop
    assert out.content[0].text == text[:text.index(stop)]


def test_a_prefill_is_continued_as_the_chat_api_continues_a_final_message(client, chat, model):
    messages = [{"role": "user", "content": "Pick one"}, {"role": "assistant", "content": "The answer is"}]
    out = client.messages.create(model=model, max_tokens=6, extra_body=GREEDY, messages=messages)
    assert out.content[0].text == _chat_text(chat, model, messages, 6, extra_body={
        "continue_final_message": True, "add_generation_prompt": False})


def test_a_forced_tool_call_and_its_result_continue_the_conversation(client, chat, model):
    kwargs = dict(model=model, max_tokens=40, extra_body=GREEDY, tools=[WEATHER],
                  tool_choice={"type": "tool", "name": "weather"}, messages=[{"role": "user", "content": "Weather?"}])
    out = client.messages.create(**kwargs)
    (call,) = out.content
    assert call.type == "tool_use" and call.name == "weather" and call.input["city"] in ("Oslo", "Rome")
    assert out.stop_reason == "tool_use"
    with client.messages.stream(**kwargs) as stream:
        pieces = [e.delta.partial_json for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert len(pieces) > 1 and json.loads("".join(pieces)) == call.input == final.content[0].input
    # Tools with the default choice ("auto") need the model's tool-call parser, which this mesh has none of.
    reply = client.messages.create(model=model, max_tokens=5, extra_body=GREEDY, tools=[WEATHER],
                                   tool_choice={"type": "none"}, messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": "weather", "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]}])
    assert reply.content[0].text == _chat_text(chat, model, [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {
            "name": "weather", "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}], 5, tools=[WEATHER_CHAT], tool_choice="none")


def test_output_config_holds_the_reply_to_its_schema(client, model):
    schema = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["verdict"], "additionalProperties": False}
    out = client.messages.create(model=model, max_tokens=30, extra_body=GREEDY,
                                 messages=[{"role": "user", "content": "Is it raining?"}],
                                 output_config={"format": {"type": "json_schema", "schema": schema}})
    assert out.stop_reason == "end_turn" and json.loads(out.content[0].text)["verdict"] in ("yes", "no")


def test_count_tokens_is_the_prompt_a_message_is_sent_as(client, model, default_mesh):
    messages = [{"role": "user", "content": "Count me, please."}]
    counted = client.messages.count_tokens(model=model, system="Be brief.", messages=messages)
    ids = httpx.post(f"{default_mesh.http_url}/tokenize", json={
        "model": model, "messages": [{"role": "system", "content": "Be brief."}, *messages]}).json()["tokens"]
    assert counted.input_tokens == len(ids) > 5


def test_errors_arrive_as_the_clients_exception_classes(client, model):
    with pytest.raises(anthropic.NotFoundError, match="serves") as err:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="text and tool_result blocks") as err:
        client.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    assert err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="max_tokens must be"):
        client.messages.create(model=model, max_tokens=-1, messages=[{"role": "user", "content": "hi"}])
    # Found only while it runs (only end tokens allowed, held back by min_tokens): streamed, after the headers.
    with pytest.raises(anthropic.APIStatusError, match="no token satisfies allowed_token_ids"), \
            client.messages.stream(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                                   extra_body={"allowed_token_ids": [1, 5], "min_tokens": 2}) as stream:
        list(stream)


def test_thinking_text_and_tool_calls_come_back_as_their_blocks(hermes_http):  # noqa: F811
    """Through a mesh that reads Hermes tool calls and Qwen3 thinking, a structured output makes the built-in
    model write what such a model would: the reply is a thinking block, a text block and a tool_use block."""
    reply = ('<think>\nThe user wants Oslo.\n</think>\n\nLet me check.'
             '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>')
    kwargs = dict(model="ignored", max_tokens=100, tools=[WEATHER], messages=[{"role": "user", "content": "Oslo?"}],
                  extra_body={**GREEDY, "structured_outputs": {"choice": [reply]}})
    with anthropic.Anthropic(base_url=str(hermes_http.base_url), api_key="unused", max_retries=0) as client:
        kwargs["model"] = client.models.list().data[0].id
        out = client.messages.create(**kwargs)
        with client.messages.stream(**kwargs) as stream:
            thinking = [e.delta.thinking for e in stream if e.type == "content_block_delta"
                        and e.delta.type == "thinking_delta"]
            final = stream.get_final_message()
        hidden = client.messages.create(**kwargs, thinking={"type": "adaptive", "display": "omitted"})
    assert [b.type for b in out.content] == ["thinking", "text", "tool_use"] and out.stop_reason == "tool_use"
    assert out.content[0].thinking == "\nThe user wants Oslo.\n" and out.content[1].text == "\n\nLet me check."
    assert out.content[2].name == "weather" and out.content[2].input == {"city": "Oslo"}
    assert len(thinking) > 1 and "".join(thinking) == out.content[0].thinking
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == out.content[2].input and final.stop_reason == "tool_use"
    assert [b.type for b in hidden.content] == ["text", "tool_use"]
