"""Chat messages and forced tool calls, as plain data: validation, the constraint, reading the calls back."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidArgument
from services.scheduler.chat_tools import chat_messages, open_final_message, tool_calling

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "clock"}}  # no parameters: any object


def test_text_parts_are_joined_and_tool_turns_pass_through():
    messages = chat_messages([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Oslo?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ])
    assert messages[1]["content"] == "Weather in\nOslo?"
    assert messages[2]["tool_calls"][0]["id"] == "call_1" and messages[3]["tool_call_id"] == "call_1"


@pytest.mark.parametrize("messages, fragment", [
    ([], "non-empty list"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content[0]: only text parts"),
    ([{"role": "user"}], "messages[0] must have string content"),
    ([{"role": "robot", "content": "hi"}], "messages[0].role must be one of"),
    ([{"role": "tool", "content": "42"}], "needs the tool_call_id"),
    ([{"role": "user", "content": "hi", "tool_calls": []}], "tool_calls must be a list, on an assistant message"),
    ([{"role": "user", "content": 5}], "content must be a string or a list of text parts"),
])
def test_bad_messages_are_named(messages, fragment):
    with pytest.raises(InvalidArgument) as exc:
        chat_messages(messages)
    assert fragment in str(exc.value)


# A template that trims what it writes (Llama 3's) and one that writes it as sent.
TRIMS = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content | trim }}<|end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
AS_SENT = TRIMS.replace(" | trim", "")


@pytest.mark.parametrize("template", [TRIMS, AS_SENT], ids=["trims", "as-sent"])
@pytest.mark.parametrize("text", ["The answer is", "The answer is ", "  indented", "two\nlines\n", "Hi"])
def test_the_final_message_is_opened_where_transformers_opens_it(tiny_model_dir, template, text):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": text}]
    closed = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)
    want = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, continue_final_message=True)
    assert open_final_message(closed, messages[-1]) == want


def test_a_final_message_with_nothing_to_continue_is_refused():
    with pytest.raises(InvalidArgument, match="needs a final message with text"):
        open_final_message("<|user|>\n<|end|>", {"role": "user", "content": "  "})
    with pytest.raises(InvalidArgument, match="does not write the final message's text as sent"):
        open_final_message("<|user|>\nHI<|end|>", {"role": "user", "content": "hi"})


def test_auto_with_a_parser_reads_the_models_own_calls():
    from services.scheduler.tool_parsers import HermesParser

    calling = tool_calling({"tools": [WEATHER]}, HermesParser())
    assert calling.structured_output is None and isinstance(calling.parser, HermesParser)
    message, finish = calling.message('Sure.<tool_call>{"name": "weather", "arguments": {"city": "Lima"}}</tool_call>',
                                      "stop")
    assert finish == "tool_calls" and message["content"] == "Sure."
    assert message["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city": "Lima"}'}
    assert calling.message("No tools needed.", "stop") == ({"role": "assistant", "content": "No tools needed."},
                                                           "stop")


def test_no_forced_call_means_text():
    assert tool_calling({}) is None
    assert tool_calling({"tools": [WEATHER], "tool_choice": "none"}) is None
    assert tool_calling({"tool_choice": "auto"}) is None


def test_a_named_function_constrains_the_output_to_its_arguments():
    calling = tool_calling({"tools": [WEATHER, CLOCK],
                            "tool_choice": {"type": "function", "function": {"name": "weather"}}})
    assert calling.structured_output == ("json", json.dumps(WEATHER["function"]["parameters"]))
    (call,) = calling.calls('{"city": "Oslo"}')
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    # Cut by max_tokens: the call as far as it was written, as its stream sent it (and as vLLM answers); nothing
    # written (a thought took every token), no call.
    (cut,) = calling.calls('{"city": "Os')
    assert cut["function"] == {"name": "weather", "arguments": '{"city": "Os'}
    assert calling.calls("") is None
    message, finish = calling.message('{"city": "Os', "length")
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Os' and finish == "length"


def test_required_constrains_the_output_to_calls_of_the_given_functions():
    calling = tool_calling({"tools": [WEATHER, CLOCK], "tool_choice": "required"})
    kind, schema = calling.structured_output
    variants = json.loads(schema)["items"]["anyOf"]
    assert kind == "json" and json.loads(schema)["minItems"] == 1
    assert [v["properties"]["name"]["enum"] for v in variants] == [["weather"], ["clock"]]
    assert variants[1]["properties"]["parameters"] == {"type": "object"}
    calls = calling.calls('[{"name": "clock", "parameters": {}}, {"name": "weather", "parameters": {"city": "Rome"}}]')
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("clock", {}), ("weather", {"city": "Rome"})]
    assert len({c["id"] for c in calls}) == 2
    assert "maxItems" not in json.loads(schema)
    one = tool_calling({"tools": [WEATHER, CLOCK], "tool_choice": "required", "parallel_tool_calls": False})
    assert json.loads(one.structured_output[1])["maxItems"] == 1


@pytest.mark.parametrize("body, fragment", [
    ({"tools": [WEATHER]}, 'tool_choice "auto" (the default with tools) needs a parser'),
    ({"tools": [WEATHER], "tool_choice": "auto"}, "send tool_choice \"required\""),
    ({"tool_choice": "required"}, "needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "stocks"}}},
     "names function 'stocks', which is not in tools (weather)"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, 'tool_choice must be "none", "auto", "required"'),
    ({"tools": [{"type": "retrieval"}], "tool_choice": "required"}, "tools[0] must be"),
    ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "defined twice"),
    ({"tools": {"weather": {}}, "tool_choice": "required"}, "tools must be a list"),
])
def test_tool_requests_that_cannot_be_served_say_what_to_send(body, fragment):
    with pytest.raises(InvalidArgument) as exc:
        tool_calling(body)
    assert fragment in str(exc.value)


def test_a_named_call_streams_its_arguments_and_required_calls_come_once_complete():
    from services.scheduler.chat_tools import ToolCallStream
    from services.scheduler.tracked import Delta

    named = ToolCallStream(tool_calling({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                                             "function": {"name": "weather"}}}))
    first, _ = named.delta(Delta(text='{"city": '))
    second, finish = named.delta(Delta(text='"Oslo"}', finish_reason="stop"))
    assert first["role"] == "assistant" and first["tool_calls"][0]["function"] == {"name": "weather",
                                                                                    "arguments": '{"city": '}
    assert first["tool_calls"][0]["id"].startswith("call_") and "id" not in second["tool_calls"][0]
    assert second == {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]} and finish == "tool_calls"

    # Pieces without arguments (a thought the reasoning parser took, text held back) add no empty call deltas:
    # the call begins with its first arguments.
    thinking = ToolCallStream(tool_calling({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                                                "function": {"name": "weather"}}}))
    assert thinking.delta(Delta(text="")) == ({"role": "assistant"}, None)
    assert thinking.delta(Delta(text="")) == ({}, None)
    begun, _ = thinking.delta(Delta(text="{"))
    assert begun["tool_calls"][0]["function"] == {"name": "weather", "arguments": "{"} and "role" not in begun
    assert thinking.delta(Delta(text="", finish_reason="length")) == ({}, "length")

    required = ToolCallStream(tool_calling({"tools": [WEATHER, CLOCK], "tool_choice": "required"}))
    assert required.delta(Delta(text='[{"name": "clock", ')) == ({"role": "assistant"}, None)
    done, finish = required.delta(Delta(text='"parameters": {}}]', finish_reason="stop"))
    assert finish == "tool_calls" and done["tool_calls"][0]["function"] == {"name": "clock", "arguments": "{}"}
    cut = ToolCallStream(tool_calling({"tools": [CLOCK], "tool_choice": "required"}))
    assert cut.delta(Delta(text='[{"na', finish_reason="length")) == ({"role": "assistant", "content": '[{"na'},
                                                                      "length")
