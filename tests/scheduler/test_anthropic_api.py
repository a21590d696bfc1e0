"""Anthropic's Messages API translated to the chat path and back, as plain data."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument, NotFound, ResourceExhausted, SeawallError, Unavailable
from services.scheduler.anthropic_api import ContentBlocks, error_body, parse_request, stop_reason, usage

WEATHER = {"name": "weather", "description": "Now",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _chat(**body):
    return parse_request({"max_tokens": 8, **body}).chat


def test_a_conversation_with_tool_use_becomes_the_chat_messages_that_run_it():
    chat = _chat(system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "rain"}]},
            {"type": "text", "text": "And tomorrow?"}]}])
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "rain"},
        {"role": "user", "content": "And tomorrow?"}]
    # An assistant turn of calls alone has no content; redacted thoughts carry nothing to render.
    (turn,) = _chat(messages=[{"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "x"},
        {"type": "tool_use", "id": "t", "name": "weather", "input": {}}]}])["messages"]
    assert turn["content"] is None and "reasoning_content" not in turn


def test_sampling_tools_and_formats_map_to_the_chat_fields():
    chat = _chat(model="m", temperature=0.5, top_p=0.9, top_k=4, stop_sequences=["END"], tools=[WEATHER],
                 tool_choice={"type": "any", "disable_parallel_tool_use": True}, metadata={"user_id": "u"},
                 messages=[{"role": "user", "content": "hi"}], session_id="s", cache_control={"type": "ephemeral"},
                 output_config={"effort": "max", "format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert {k: chat[k] for k in ("model", "temperature", "top_p", "top_k", "stop", "max_tokens", "session_id")} == {
        "model": "m", "temperature": 0.5, "top_p": 0.9, "top_k": 4, "stop": ["END"], "max_tokens": 8,
        "session_id": "s"}
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "weather", "parameters": WEATHER["input_schema"], "description": "Now"}}]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["reasoning_effort"] == "high"
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output",
                                                                              "schema": {"type": "object"}}}
    one = _chat(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
                tool_choice={"type": "tool", "name": "weather"})
    assert one["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert "parallel_tool_calls" not in one
    assert _chat(messages=[{"role": "user", "content": "hi"}], tool_choice={"type": "none"})["tool_choice"] == "none"
    older = _chat(messages=[{"role": "user", "content": "hi"}], output_format={"type": "json_schema", "schema": {}})
    assert older["response_format"]["json_schema"]["schema"] == {}


@pytest.mark.parametrize("thinking, enable, show", [
    ({"type": "enabled", "budget_tokens": 1024}, True, True), ({"type": "disabled"}, False, True),
    ({"type": "adaptive", "display": "omitted"}, True, False), ({"type": "between_tools"}, True, True)])
def test_thinking_turns_the_templates_thinking_on_or_off(thinking, enable, show):
    req = parse_request({"max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}], "thinking": thinking})
    assert req.chat["chat_template_kwargs"] == {"enable_thinking": enable} and req.show_thinking is show


@pytest.mark.parametrize("body, message", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens is required"),
    ({"max_tokens": 4, "messages": []}, "non-empty list"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "hi"}]}, "role \"user\" or \"assistant\""),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "text and tool_result blocks"),
    ({"max_tokens": 4, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}]},
     "needs a string id and name and an input object"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "any"}},
     "needs tools"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"}, "tool_choice must"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": "END"}, "stop_sequences"),
    ({"max_tokens": 4000, "messages": [{"role": "user", "content": "hi"}],
      "thinking": {"type": "enabled", "budget_tokens": 100}}, "budget_tokens must be an integer >= 1024"),
    ({"max_tokens": 2000, "messages": [{"role": "user", "content": "hi"}],
      "thinking": {"type": "enabled", "budget_tokens": 2000}}, "less than max_tokens"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "mcp_servers": []}, "MCP servers"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3},
     "unknown field\\(s\\) 'max_completion_tokens'"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "output_config": {"effort": "huge"}},
     "effort must be one of"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
      "output_config": {"format": {"type": "json_object"}}}, "output_config.format must be"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream must be"),
    # An empty user turn was a 500 (no message left to run); a falsy non-list tools was dropped unchecked.
    ({"max_tokens": 4, "messages": [{"role": "user", "content": []}]}, "messages\\[0\\].content is empty"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": {}}, "tools must be a list"),
])
def test_what_cannot_be_served_is_refused_saying_what_to_send(body, message):
    with pytest.raises(InvalidArgument, match=message):
        parse_request(body)


def test_a_final_assistant_text_is_a_prefill_the_reply_continues():
    chat = _chat(messages=[{"role": "user", "content": "Pick one"}, {"role": "assistant", "content": "The answer is"}])
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False
    after_call = _chat(messages=[{"role": "user", "content": "Go"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "weather", "input": {}}]}])
    assert "continue_final_message" not in after_call


def test_counting_tokens_needs_no_max_tokens():
    req = parse_request({"messages": [{"role": "user", "content": "hi"}]}, counting=True)
    assert "max_tokens" not in req.chat


def test_content_blocks_stream_as_anthropic_streams_them_and_add_up_to_the_reply():
    blocks = ContentBlocks()
    events = blocks.feed({"reasoning": "Hm", "content": ""})
    events += blocks.feed({"reasoning": ", tool.", "content": "Let me"})
    events += blocks.feed({"content": " check.", "tool_calls": [
        {"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": '{"ci'}}]})
    events += blocks.feed({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}},
                                          {"index": 1, "id": "call_2", "function": {"name": "weather"}}]})
    events += blocks.close()
    assert [(e["type"], e.get("index")) for e in events] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0),
        ("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
        ("content_block_delta", 1), ("content_block_stop", 1), ("content_block_start", 2),
        ("content_block_delta", 2), ("content_block_delta", 2), ("content_block_stop", 2),
        ("content_block_start", 3), ("content_block_stop", 3)]
    assert events[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[8]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "weather", "input": {}}
    assert events[9]["delta"] == {"type": "input_json_delta", "partial_json": '{"ci'}
    assert blocks.blocks == [
        {"type": "thinking", "thinking": "Hm, tool.", "signature": ""},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": "call_2", "name": "weather", "input": {}}]


def test_a_tool_call_cut_short_by_max_tokens_ends_its_stream_with_an_empty_input():
    # Its arguments are no JSON object: reading them as one used to break the stream after message_start.
    blocks = ContentBlocks()
    events = blocks.feed({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "weather",
                                                                                "arguments": '{"city": "Os'}}]})
    events += blocks.close()
    assert [e["type"] for e in events] == ["content_block_start", "content_block_delta", "content_block_stop"]
    assert blocks.blocks == [{"type": "tool_use", "id": "call_1", "name": "weather", "input": {}}]


def test_an_empty_reply_has_no_blocks():
    blocks = ContentBlocks()
    assert blocks.feed({"content": "", "reasoning": None}) + blocks.close() == [] and blocks.blocks == []


def test_stop_reasons_usage_and_errors_in_anthropics_terms():
    assert stop_reason("tool_calls", None) == {"stop_reason": "tool_use", "stop_sequence": None}
    assert stop_reason("length", None)["stop_reason"] == "max_tokens"
    assert stop_reason("stop", "END") == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert stop_reason("stop", None)["stop_reason"] == "end_turn"
    assert usage(100, 64, 7) == {"input_tokens": 36, "cache_creation_input_tokens": 0,
                                 "cache_read_input_tokens": 64, "output_tokens": 7}
    kinds = [error_body(e)["error"]["type"] for e in (InvalidArgument("a"), NotFound("b"), ResourceExhausted("c"),
                                                      Unavailable("d"), SeawallError("e"))]
    assert kinds == ["invalid_request_error", "not_found_error", "rate_limit_error", "overloaded_error", "api_error"]
    assert error_body(InvalidArgument("bad"))["error"]["message"] == "bad"
