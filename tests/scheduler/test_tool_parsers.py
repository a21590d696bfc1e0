"""Tool calls in a model's own syntax: the parsers, and how a streamed reply holds back what may be a call."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.errors import InvalidArgument
from services.scheduler.chat_tools import AutoToolStream
from services.scheduler.tool_parsers import HermesParser, Llama3JsonParser, ValueScan, tool_parser, value_end
from services.scheduler.tracked import Delta


def names_and_args(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_hermes_reads_tool_call_blocks_after_optional_text():
    p = HermesParser()
    text = ('Checking both.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>{"name": "clock", "arguments": {}}</tool_call>')
    content, calls = p.split(text)
    # The text as written up to the first call, as a stream sends it (vLLM's hermes keeps it so too).
    assert content == "Checking both.\n" and names_and_args(calls) == [("weather", {"city": "Oslo"}), ("clock", {})]
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
        tool_parser("xlam")


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


def streamed_calls(parser, pieces, finish="stop", id_prefix="call_"):
    """Streams ``pieces`` through an AutoToolStream; returns the content, each call as the client joins it
    (id, name, arguments), the number of deltas that carried each call, and the finish reason."""
    stream = AutoToolStream(parser)
    out = [stream.delta(Delta(text=t)) for t in pieces[:-1]] + [stream.delta(Delta(text=pieces[-1],
                                                                                finish_reason=finish))]
    content = "".join(d.get("content") or "" for d, _ in out)
    calls: dict[int, dict] = {}
    pieces_per_call: dict[int, int] = {}
    for d, _ in out:
        for c in d.get("tool_calls", []):
            k = c["index"]
            if k not in calls:
                assert c["id"].startswith(id_prefix) and c["type"] == "function"
                calls[k] = {"id": c["id"], "name": c["function"]["name"], "arguments": ""}
            else:
                assert "id" not in c and "name" not in c["function"]  # the header goes out once
            calls[k]["arguments"] += c["function"]["arguments"]
            pieces_per_call[k] = pieces_per_call.get(k, 0) + 1
    return content, [calls[k] for k in sorted(calls)], pieces_per_call, out[-1][1]


HERMES_TWO_CALLS = ('Checking.<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo \\"Norway\\" {}", '
                    '"days": [1, {"x": "]"}]}}\n</tool_call>\n<tool_call>{"name": "clock", "arguments": {}}'
                    '</tool_call>')


def test_a_streamed_call_sends_its_name_once_then_its_arguments_as_they_are_written():
    text = HERMES_TWO_CALLS
    content, calls, pieces, finish = streamed_calls(HermesParser(), list(text))  # one character a step
    _, whole = HermesParser().split(text)
    assert content == "Checking." and finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [(w["function"]["name"], w["function"]["arguments"])
                                                            for w in whole]
    # the arguments as the model wrote them: the streamed pieces join to exactly the non-streamed string
    assert json.loads(calls[0]["arguments"]) == {"city": 'Oslo "Norway" {}', "days": [1, {"x": "]"}]}
    assert pieces[0] > 10 and pieces[1] >= 2  # piece by piece, not once complete
    llama = '<|python_tag|>{"name": "weather", "parameters": {"city": "Rome"}}; {"name": "clock", "parameters": {}}'
    content, calls, pieces, finish = streamed_calls(Llama3JsonParser(), list(llama))
    assert content == "" and finish == "tool_calls" and pieces[0] > 5
    assert [(c["name"], c["arguments"]) for c in calls] == [("weather", '{"city": "Rome"}'), ("clock", "{}")]


@given(cuts=st.lists(st.integers(0, len(HERMES_TWO_CALLS)), max_size=12))
def test_any_cut_of_a_streamed_reply_gives_the_whole_replys_calls(cuts):
    bounds = sorted({0, *cuts, len(HERMES_TWO_CALLS)})
    pieces = [HERMES_TWO_CALLS[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [""]
    content, calls, _, finish = streamed_calls(HermesParser(), pieces)
    text, whole = HermesParser().split(HERMES_TWO_CALLS)
    assert content.strip() == text and finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [(w["function"]["name"], w["function"]["arguments"])
                                                            for w in whole]


def test_a_call_cut_short_after_it_began_streaming_keeps_what_was_sent():
    content, calls, _, finish = streamed_calls(HermesParser(), ['<tool_call>{"name": "weather", "arguments": {"ci',
                                                               'ty": "Os'], finish="length")
    assert content == "" and finish == "length"
    assert [(c["name"], c["arguments"]) for c in calls] == [("weather", '{"city": "Os')]


def test_where_a_json_value_ends():
    assert value_end('{"a": "}", "b": [1, 2]} trailing') == len('{"a": "}", "b": [1, 2]}')
    assert value_end('"say \\"hi\\""}') == len('"say \\"hi\\""')
    assert value_end('[{"x": "]"}]') == len('[{"x": "]"}]')
    assert value_end('{"a": "\\\\"}') == len('{"a": "\\\\"}')  # an escaped backslash ends before the quote
    assert value_end('{"a": 1') is None and value_end("12}") is None and value_end("") is None
    # Resumed on a growing text, a scanner reads each character once and finds the same end.
    text = '{"s": "a \\"} [", "n": [1, {"x": "]"}]} and more'
    scan = ValueScan()
    for k in range(len(text) + 1):
        found = scan.end(text[:k])
        assert found == value_end(text[:k]), k
        assert scan.pos <= k
    assert found == len('{"s": "a \\"} [", "n": [1, {"x": "]"}]}')


PYTHONIC = ('''[weather(city="Oslo, \\"NO\\" (x)", days=2, where={"lat": 59.9, "tags": (1, 'a)')}), '''
            "clock()]")


def test_pythonic_reads_a_reply_that_is_a_list_of_calls_with_literal_arguments():
    p = tool_parser("pythonic")
    content, calls = p.split(PYTHONIC)
    assert content is None and names_and_args(calls) == [
        ("weather", {"city": 'Oslo, "NO" (x)', "days": 2, "where": {"lat": 59.9, "tags": [1, "a)"]}}), ("clock", {})]
    assert names_and_args(p.split("<|python_start|>[clock(tz='UTC')]<|python_end|>")[1]) == [("clock", {"tz": "UTC"})]
    for text in ("The weather is fine.", "[1, 2]", "[weather(city)]", "[weather(city=here)]", "[f(x={1, 2})]",
                 '[weather(city="Os'):
        assert p.split(text) == (text, [])  # not calls of literals, or cut short: the reply stays text
    assert p.start("  [weather(") == 2 and p.start("Hi [x()]") is None
    assert p.held("  ") == 2 and p.held("<|python") == len("<|python") and p.held("Hello") == 0


@given(st.lists(st.integers(0, len(PYTHONIC)), max_size=6).map(sorted))
def test_pythonic_calls_stream_as_prefixes_of_the_whole_and_join_to_it(cuts):
    pieces = [PYTHONIC[a:b] for a, b in zip([0, *cuts], [*cuts, len(PYTHONIC)], strict=True)]
    content, calls, _, finish = streamed_calls(tool_parser("pythonic"), [p for p in pieces if p] or [""])
    _, whole = tool_parser("pythonic").split(PYTHONIC)
    assert content == "" and finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [(w["function"]["name"], w["function"]["arguments"])
                                                            for w in whole]
    for cut in range(len(PYTHONIC) + 1):
        for (name, args), w in zip(tool_parser("pythonic").partial(PYTHONIC[:cut]), whole, strict=False):
            assert name == w["function"]["name"] and w["function"]["arguments"].startswith(args)


MISTRAL = {  # Mistral 7B v0.3 and Nemo write an array; tokenizers v11 on, NAME[ARGS]{...} per call
    "array": 'Checking.[TOOL_CALLS] [{"name": "weather", "arguments": {"city": "Oslo", "x": [1, "]"]}}, '
             '{"name": "clock", "arguments": {}}]',
    "v11": 'Checking.[TOOL_CALLS]weather[ARGS]{"city": "Oslo", "x": [1, "]"]}[TOOL_CALLS]clock[ARGS]{}'}


@pytest.mark.parametrize("form", list(MISTRAL))
def test_mistral_calls_in_either_form_with_the_nine_character_ids_its_templates_require(form):
    p, reply = tool_parser("mistral"), MISTRAL[form]
    content, calls = p.split(reply)
    assert content == "Checking." and names_and_args(calls) == [("weather", {"city": "Oslo", "x": [1, "]"]}),
                                                                ("clock", {})]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls) and p.special_tokens
    _, streamed, _, finish = streamed_calls(p, list(reply), id_prefix="")
    assert finish == "tool_calls" and [(c["name"], c["arguments"]) for c in streamed] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in calls]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in streamed)
    cut = reply[: reply.index("Oslo")]
    assert p.split(cut) == (cut, []) and p.split("Sunny.") == ("Sunny.", [])
    assert p.held("Checking.[TOOL_") == len("[TOOL_")


GRANITE = '<|tool_call|>[{"name": "weather", "arguments": {"city": "Oslo"}}, {"name": "clock", "arguments": {}}]'


def test_granite_reads_a_reply_that_is_an_array_of_calls_after_its_tag():
    p = tool_parser("granite")
    for reply in (GRANITE, GRANITE.removeprefix("<|tool_call|>"), GRANITE.replace("<|tool_call|>", "<tool_call>")):
        content, calls = p.split(reply)
        assert content is None and names_and_args(calls) == [("weather", {"city": "Oslo"}), ("clock", {})]
    assert p.split("Sunny.") == ("Sunny.", []) and p.split(GRANITE[:40]) == (GRANITE[:40], [])
    assert p.start("  <|tool_call|>[") == 2 and p.start("Hi") is None and p.held("<|tool") == len("<|tool")
    _, streamed, _, finish = streamed_calls(p, list(GRANITE))
    assert finish == "tool_calls" and [(c["name"], c["arguments"]) for c in streamed] == [
        ("weather", '{"city": "Oslo"}'), ("clock", "{}")]


def test_phi4_mini_reads_functools_and_an_array_of_calls():
    p = tool_parser("phi4_mini_json")
    reply = 'functools[{"name": "weather", "arguments": {"city": "Oslo"}}, {"name": "clock", "parameters": {}}]'
    content, calls = p.split(reply)
    assert content is None and names_and_args(calls) == [("weather", {"city": "Oslo"}), ("clock", {})]
    assert p.split("Sunny.") == ("Sunny.", []) and p.start(reply) == 0 and p.held("funct") == len("funct")
    _, streamed, _, finish = streamed_calls(p, list(reply))
    assert finish == "tool_calls" and [(c["name"], c["arguments"]) for c in streamed] == [
        ("weather", '{"city": "Oslo"}'), ("clock", "{}")]
