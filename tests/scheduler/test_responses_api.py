"""The Responses API's translation to the chat path and back, as plain data."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument, NotFound
from services.scheduler.responses_api import (
    OutputItems,
    ResponseStore,
    StoredResponse,
    input_items,
    input_messages,
    list_page,
    output_messages,
    parse_request,
    status_of,
)

WEATHER = {"type": "function", "name": "weather", "description": "Now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _stored(rid: str, messages=(), session="", status="completed") -> StoredResponse:
    return StoredResponse({"id": rid, "object": "response", "status": status}, list(messages), session)


def test_input_items_become_chat_messages_and_calls_join_the_assistant_turn():
    assert input_messages("Hi") == [{"role": "user", "content": "Hi"}]
    messages = input_messages([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in"},
                                                        {"type": "input_text", "text": "Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city": "Bergen"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
    ])
    assert messages == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in\nOslo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Bergen"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]
    alone = input_messages([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    assert alone == [{"role": "assistant", "content": None,
                      "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]


@pytest.mark.parametrize("items, fragment", [
    ([], "non-empty list"),
    (7, "non-empty list"),
    (["hi"], "input[0] must be an object"),
    ([{"role": "robot", "content": "x"}], "input[0].role must be one of"),
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}], "input[0].content[0]: only text"),
    ([{"role": "user", "content": 3}], "input[0].content must be"),
    ([{"role": "user", "content": "x"}, {"type": "function_call", "name": "f", "arguments": "{}"}],
     "input[1] (function_call) needs a string 'call_id'"),
    ([{"type": "web_search_call", "id": "w"}], "items of type 'web_search_call' are not supported"),
    ([{"type": "function_call_output", "call_id": "c", "output": 5}], "input[0].output must be"),
])
def test_bad_input_items_are_refused_naming_the_item(items, fragment):
    with pytest.raises(InvalidArgument, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        input_messages(items)


def test_a_request_becomes_the_chat_request_that_runs_it():
    req = parse_request({
        "model": "m", "input": "Weather?", "instructions": "Be brief.", "max_output_tokens": 30, "temperature": 0,
        "top_p": 0.5, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "weather"},
        "parallel_tool_calls": False, "metadata": {"k": "v"}, "user": "u", "store": False, "top_k": 4, "stream": True,
    }, None, "resp_0")
    assert req.chat == {
        "model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}],
        "max_completion_tokens": 30, "temperature": 0, "top_p": 0.5, "parallel_tool_calls": False, "top_k": 4,
        "tools": [{"type": "function", "function": {"name": "weather", "description": "Now",
                                                    "parameters": WEATHER["parameters"]}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
    }
    assert req.messages == [{"role": "user", "content": "Weather?"}]  # instructions are not the conversation
    assert not req.store and not req.logprobs and req.session_id == ""  # store false: nothing to continue
    assert req.echoed["instructions"] == "Be brief." and req.echoed["metadata"] == {"k": "v"}
    assert req.echoed["tools"] == [WEATHER] and req.echoed["text"] == {"format": {"type": "text"}}


def test_text_format_and_logprobs_map_to_their_chat_fields():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = parse_request({"input": "x", "text": {"format": {"type": "json_schema", "name": "A", "schema": schema,
                                                           "strict": True}},
                         "include": ["message.output_text.logprobs"], "top_logprobs": 3}, None, "resp_0")
    assert req.chat["response_format"] == {"type": "json_schema",
                                           "json_schema": {"name": "A", "schema": schema, "strict": True}}
    assert req.chat["logprobs"] is True and req.chat["top_logprobs"] == 3 and req.logprobs
    assert parse_request({"input": "x", "text": {"format": {"type": "json_object"}}}, None, "resp_0").chat["response_format"] \
        == {"type": "json_object"}
    assert "response_format" not in parse_request({"input": "x", "text": {"format": {"type": "text"}}}, None, "resp_0").chat


def test_a_continuation_starts_from_the_stored_conversation_and_shares_its_session():
    first = parse_request({"input": "Hi"}, None, "resp_1")
    assert first.session_id == "resp_1"  # a stored conversation is a session named after its first response
    stored = _stored("resp_1", first.messages + [{"role": "assistant", "content": "Hello"}], first.session_id)
    req = parse_request({"input": "More", "instructions": "New rules", "previous_response_id": "resp_1"}, stored,
                        "resp_2")
    assert req.chat["messages"] == [{"role": "system", "content": "New rules"}, {"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}]
    assert req.session_id == "resp_1"
    second = _stored("resp_2", req.messages, req.session_id)
    assert parse_request({"input": "Again", "previous_response_id": "resp_2"}, second, "resp_3").session_id == "resp_1"
    assert parse_request({"input": "x", "session_id": "mine"}, None, "resp_4").session_id == "mine"
    assert parse_request({"input": "x", "store": False}, None, "resp_5").session_id == ""  # nothing to continue


def test_a_background_request_is_stored_and_says_so_and_a_running_one_cannot_be_continued_yet():
    req = parse_request({"input": "x", "background": True}, None, "resp_1")
    assert req.background and req.store and req.echoed["background"] is True
    assert parse_request({"input": "x"}, None, "resp_2").echoed["background"] is False
    for status in ("queued", "in_progress"):
        with pytest.raises(InvalidArgument, match=f"'resp_1' is still {status}: continue it once it has ended"):
            parse_request({"input": "y", "previous_response_id": "resp_1"}, _stored("resp_1", status=status), "resp_3")
    cancelled = _stored("resp_1", [{"role": "user", "content": "x"}], status="cancelled")
    assert parse_request({"input": "y", "previous_response_id": "resp_1"}, cancelled, "resp_3").messages[0] == {
        "role": "user", "content": "x"}


@pytest.mark.parametrize("body, fragment", [
    ({"messages": []}, "the Responses API takes input"),
    ({"input": "x", "max_tokens": 3}, "takes max_output_tokens"),
    ({"input": "x", "response_format": {}}, "takes text.format"),
    ({"input": "x", "background": True, "store": False}, "a background response is stored"),
    ({"input": "x", "background": "yes"}, "background must be true or false"),
    ({"input": "x", "truncation": "auto"}, "truncation \"auto\" is not supported"),
    ({"input": "x", "reasoning": {"effort": "high", "summary": "bullet points"}}, "reasoning.summary must be"),
    ({"input": "x", "reasoning": "high"}, "reasoning must be"),
    ({"input": "x", "conversation": "conv_1"}, "'conversation'"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include may list only"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs needs include"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "only function tools"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "allowed_tools"}}, "tool_choice must be"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "A"}}}, "needs \"schema\""),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format type must be"),
    ({"input": "x", "instructions": ["a"]}, "instructions must be a string"),
    ({"input": "x", "store": "yes"}, "store must be true or false"),
    # Accepted unchecked, these came back as sent in the response object.
    ({"input": "x", "tools": {}}, "tools must be a list"),
    ({"input": "x", "text": 5}, "text must be an object"),
    ({"input": "x", "metadata": 5}, "metadata must be an object of string values"),
    ({"input": "x", "metadata": {"n": 1}}, "metadata must be an object of string values"),
    ({"input": "x", "user": 5}, "user must be a string"),
    ({"input": "x", "parallel_tool_calls": "no"}, "parallel_tool_calls must be true or false"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "only reasoning items"),
])
def test_what_cannot_be_served_is_refused_saying_what_to_send(body, fragment):
    with pytest.raises(InvalidArgument, match=fragment.replace("(", r"\(")):
        parse_request(body, None, "resp_0")


def test_output_items_stream_text_then_calls_and_end_with_done_events():
    items = OutputItems()
    lp = [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}]
    events = items.feed({"role": "assistant", "content": "Hi"}, lp)
    events += items.feed({"content": ""})  # nothing to send
    events += items.feed({"content": " there"})
    events += items.feed({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                          "function": {"name": "weather", "arguments": '{"ci'}}]})
    events += items.feed({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]})
    events += items.close("completed")
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done"]
    message, call = items.items
    assert message["status"] == "completed" and message["content"] == [
        {"type": "output_text", "text": "Hi there", "annotations": [], "logprobs": lp}]
    assert events[0]["item"]["content"] == [] and events[2]["logprobs"] == lp and events[3]["logprobs"] == []
    assert call == {"type": "function_call", "id": call["id"], "call_id": "call_1", "name": "weather",
                    "arguments": '{"city": "Oslo"}', "status": "completed"}
    assert {e["output_index"] for e in events[7:]} == {1} and events[-2]["arguments"] == '{"city": "Oslo"}'
    assert output_messages(items.items) == [{"role": "assistant", "content": "Hi there", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}]


def test_each_call_is_done_before_the_next_one_is_added():
    items = OutputItems()
    events = items.feed({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]})
    events += items.feed({"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "g", "arguments": "{"}}]})
    events += items.close("incomplete")
    assert [(e["type"], e["output_index"]) for e in events] == [
        ("response.output_item.added", 0), ("response.function_call_arguments.delta", 0),
        ("response.function_call_arguments.done", 0), ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.done", 1), ("response.output_item.done", 1)]
    assert [i["status"] for i in items.items] == ["completed", "incomplete"]  # only the last one was cut


def test_a_reply_of_nothing_is_an_empty_message_and_a_cut_one_is_incomplete():
    items = OutputItems()
    assert [e["type"] for e in items.close("incomplete")][0] == "response.output_item.added"
    assert items.items[0]["status"] == "incomplete" and items.items[0]["content"][0]["text"] == ""
    assert status_of("length") == ("incomplete", {"reason": "max_output_tokens"})
    assert status_of("stop") == status_of("tool_calls") == ("completed", None)
    assert status_of("error")[0] == "failed" and status_of("abort")[0] == "cancelled"


def test_the_store_keeps_the_most_recently_used_and_says_why_one_is_missing():
    store = ResponseStore(capacity=2)
    for rid in ("a", "b"):
        store.put(_stored(rid))
    store.get("a")  # now the most recent
    store.put(_stored("c"))
    assert store.get("a").response["id"] == "a" and store.get("c")
    with pytest.raises(NotFound, match="keeps the last 2"):
        store.get("b")
    store.delete("a")
    with pytest.raises(NotFound):
        store.get("a")
    with pytest.raises(NotFound):
        store.get(["not", "an", "id"])


def test_thinking_is_a_reasoning_item_before_the_answer():
    items = OutputItems()
    events = items.feed({"reasoning": "Plan", "content": ""})
    events += items.feed({"reasoning": " more", "content": "Answer"})
    events += items.close("completed")
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done"]
    thought, message = items.items
    assert thought["type"] == "reasoning" and thought["status"] == "completed"
    assert thought["content"] == [{"type": "reasoning_text", "text": "Plan more"}] and events[0]["item"]["content"] == []
    assert message["content"][0]["text"] == "Answer" and events[5]["output_index"] == 1
    assert output_messages(items.items) == [{"role": "assistant", "content": "Answer"}]  # thinking is not replayed


def test_input_items_keep_their_ids_and_get_new_ones_with_text_as_parts():
    (only,) = input_items("Hi")
    assert only["id"].startswith("msg_") and only["type"] == "message" and only["role"] == "user"
    assert only["content"] == [{"type": "input_text", "text": "Hi"}]
    items = input_items([{"role": "assistant", "content": "Hello"},
                         {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
                         {"id": "mine", "type": "function_call_output", "call_id": "c1", "output": "sunny"}])
    assert items[0]["content"] == [{"type": "output_text", "text": "Hello"}]
    assert items[1]["id"].startswith("fc_") and items[1]["name"] == "weather"
    assert items[2]["id"] == "mine" and items[2]["output"] == "sunny"
    assert parse_request({"input": "Hi"}, None, "resp_1").input_items[0]["content"][0]["text"] == "Hi"


def test_a_list_page_is_newest_first_by_default_and_continues_after_an_id():
    items = [{"id": f"i{k}"} for k in range(5)]
    page = list_page(items, {"limit": "2"})
    assert [i["id"] for i in page["data"]] == ["i4", "i3"] and page["has_more"]
    assert (page["first_id"], page["last_id"]) == ("i4", "i3")
    rest = list_page(items, {"limit": "2", "after": "i3"})
    assert [i["id"] for i in rest["data"]] == ["i2", "i1"] and rest["has_more"]
    last = list_page(items, {"order": "asc", "after": "i2"})
    assert [i["id"] for i in last["data"]] == ["i3", "i4"] and not last["has_more"]
    assert list_page([], {}) == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    for query, fragment in [({"limit": "0"}, "limit must be an integer from 1 to 100"),
                            ({"limit": "x"}, "limit must be"), ({"order": "up"}, "order must be"),
                            ({"after": "nope"}, "after names no input item")]:
        with pytest.raises(InvalidArgument, match=fragment):
            list_page(items, query)


def test_reasoning_effort_goes_to_the_chat_request_and_a_summary_is_accepted():
    req = parse_request({"input": "x", "reasoning": {"effort": "low", "summary": "auto"}}, None, "resp_1")
    assert req.chat["reasoning_effort"] == "low"
    assert "reasoning_effort" not in parse_request({"input": "x", "reasoning": {"summary": "auto"}}, None,
                                                   "resp_2").chat
