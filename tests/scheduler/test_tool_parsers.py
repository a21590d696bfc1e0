"""Tool calls in a model's own syntax: the parsers, and how a streamed reply holds back what may be a call."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidArgument
from services.scheduler.chat_tools import AutoToolStream
from services.scheduler.tool_parsers import HermesParser, Llama3JsonParser, tool_parser
from services.scheduler.tracked import Delta


def names_and_args(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_hermes_reads_tool_call_blocks_after_optional_text():
    p = HermesParser()
    text = ('Checking both.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>{"name": "clock", "arguments": {}}</tool_call>')
    content, calls = p.split(text)
    assert content == "Checking both." and names_and_args(calls) == [("weather", {"city": "Oslo"}), ("clock", {})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    _, unterminated = p.split('<tool_call>{"name": "clock", "arguments": {}}')  # the stop token ate </tool_call>
    assert names_and_args(unterminated) == [("clock", {})]
    assert p.split("Just text.") == ("Just text.", [])
    assert p.split('<tool_call>{"name": "clo') == ('<tool_call>{"name": "clo', [])  # cut short: stays text
    assert p.split('<tool_call>["not", "a call"]</tool_call>')[1] == []
    assert p.start("abc<tool_call>{") == 3 and p.start("abc<tool") is None
    assert p.held("abc<tool") == len("<tool") and p.held("abc") == 0 and p.held("abc<") == 1


def test_llama3_json_reads_a_reply_that_is_calls():
    p = Llama3JsonParser()
    content, calls = p.split('<|python_tag|>{"name": "weather", "parameters": {"city": "Rome"}}; '
                             '{"name": "clock", "parameters": {}}')
    assert content is None and names_and_args(calls) == [("weather", {"city": "Rome"}), ("clock", {})]
    assert p.split("The weather is fine.") == ("The weather is fine.", [])
    assert p.split('{"name": "weather", "parameters": {"ci') == ('{"name": "weather", "parameters": {"ci', [])
    assert p.start('  {"name"') == 2 and p.start("Hello {") is None
    assert p.held("  ") == 2 and p.held("<|python") == len("<|python") and p.held("Hello") == 0


def test_parser_names():
    assert tool_parser(None) is None and isinstance(tool_parser("hermes"), HermesParser)
    with pytest.raises(InvalidArgument, match="--tool-call-parser must be one of hermes, llama3_json"):
        tool_parser("mistral")


def test_a_streamed_auto_reply_sends_text_holds_back_a_possible_call_and_sends_calls_at_the_end():
    stream = AutoToolStream(HermesParser())
    pieces = ["Let me ", "check.<too", 'l_call>{"name": "clock", ', '"arguments": {}}</tool_call>']
    out = [stream.delta(Delta(text=t)) for t in pieces[:-1]]
    out.append(stream.delta(Delta(text=pieces[-1], finish_reason="stop")))
    assert out[0] == ({"role": "assistant", "content": "Let me "}, None)
    assert out[1] == ({"content": "check."}, None)  # "<too" held back: it may begin a call
    assert out[2] == ({}, None)
    delta, finish = out[3]
    assert finish == "tool_calls" and names_and_args(delta["tool_calls"]) == [("clock", {})]
    assert delta["tool_calls"][0]["index"] == 0
    # A reply that ends on what looked like the start of a call sends it as text after all.
    plain = AutoToolStream(HermesParser())
    assert plain.delta(Delta(text="a <tool")) == ({"role": "assistant", "content": "a "}, None)
    assert plain.delta(Delta(text="s>", finish_reason="stop")) == ({"content": "<tools>"}, "stop")
    # A call cut short by max_tokens goes out as the text it got to.
    cut = AutoToolStream(HermesParser())
    cut.delta(Delta(text='<tool_call>{"name"'))
    assert cut.delta(Delta(text=": ", finish_reason="length")) == ({"content": '<tool_call>{"name": '}, "length")
