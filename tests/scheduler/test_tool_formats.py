"""The tool-call syntaxes of Qwen3-Coder, GLM-4.5, MiniMax-M2, DeepSeek-V3 / V3.1, Kimi K2 and Gemma 4
(services/scheduler/tool_formats.py), as plain data: whole replies split into text and calls, and every cut of a reply giving
calls whose arguments are prefixes of the whole reply's (what the stream sends joins to what it returns)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.tool_parsers import tool_parser
from tests.scheduler.test_tool_parsers import streamed_calls

WEATHER = {"city": "Oslo", "days": 2, "metric": True, "where": {"lat": 59.9}}
CLOCK: dict = {}

REPLIES = {
    "qwen3_coder": (
        "Checking.\n<tool_call>\n<function=weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n"
        "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=where>\n{\"lat\": 59.9}\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=clock>\n</function>\n</tool_call>"),
    "seed_oss": (
        "Checking.\n<seed:tool_call>\n<function=weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n"
        "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=where>\n{\"lat\": 59.9}\n</parameter>\n"
        "</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=clock>\n</function>\n</seed:tool_call>"),
    "glm45": (
        "Checking.\n<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>2</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n<arg_key>where</arg_key>\n"
        "<arg_value>{\"lat\": 59.9}</arg_value>\n</tool_call><tool_call>clock\n</tool_call>"),
    "minimax_m2": (
        "Checking.\n<minimax:tool_call>\n<invoke name=\"weather\">\n<parameter name=\"city\">Oslo</parameter>\n"
        "<parameter name=\"days\">2</parameter>\n<parameter name=\"metric\">true</parameter>\n"
        "<parameter name=\"where\">{\"lat\": 59.9}</parameter>\n</invoke>\n<invoke name=\"clock\">\n</invoke>\n"
        "</minimax:tool_call>"),
    "deepseek_v3": (
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>weather\n```json\n"
        + json.dumps(WEATHER) + "\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>clock\n```json\n"
        "{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "deepseek_v31": (
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>weather<｜tool▁sep｜>" + json.dumps(WEATHER)
        + "<｜tool▁call▁end｜><｜tool▁call▁begin｜>clock<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "kimi_k2": (
        "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.weather:3<|tool_call_argument_begin|>"
        + json.dumps(WEATHER) + "<|tool_call_end|><|tool_call_begin|>functions.clock:4<|tool_call_argument_begin|>"
        "{}<|tool_call_end|><|tool_calls_section_end|>"),
    "gemma4": (
        'Checking.<|tool_call>call:weather{city:<|"|>Oslo<|"|>,days:2,metric:true,where:{lat:59.9}}<tool_call|>'
        "<|tool_call>call:clock{}<tool_call|>"),
}


@pytest.mark.parametrize("name", list(REPLIES))
def test_replies_split_into_text_and_calls_with_typed_arguments(name):
    parser = tool_parser(name)
    content, calls = parser.split(REPLIES[name])
    # The text as written up to the first call (a newline before it too), what a stream of the reply sends.
    ids = "functions." if name == "kimi_k2" else "call_"  # Kimi's calls keep the ids it wrote
    streamed = streamed_calls(tool_parser(name), list(REPLIES[name]), id_prefix=ids)[0]
    assert content.rstrip("\n") == "Checking." and content == streamed
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("weather", WEATHER), ("clock", CLOCK)]
    assert parser.split("Sunny.") == ("Sunny.", [])
    assert parser.start(REPLIES[name]) == len("Checking.") + (name in ("qwen3_coder", "seed_oss", "glm45", "minimax_m2"))
    head = parser.OPEN[:4]
    assert parser.held("Checking." + head) == len(head) and parser.held("Checking.") == 0


@pytest.mark.parametrize("name", list(REPLIES))
def test_every_cut_of_a_reply_streams_prefixes_of_its_calls(name):
    parser, reply = tool_parser(name), REPLIES[name]
    final = [(c["function"]["name"], c["function"]["arguments"]) for c in parser.split(reply)[1]]
    seen = 0
    for cut in range(len(reply) + 1):
        partial = parser.partial(reply[:cut])
        assert len(partial) >= seen  # a call, once begun, stays
        seen = len(partial)
        for (got_name, got_args), (want_name, want_args) in zip(partial, final, strict=False):
            assert got_name == want_name and want_args.startswith(got_args), (cut, got_args)
    assert parser.partial(reply) == final


@pytest.mark.parametrize("name", list(REPLIES))
def test_a_call_cut_short_stays_text(name):
    parser, reply = tool_parser(name), REPLIES[name]
    cut = reply[: reply.index("Oslo") + 2]
    assert parser.split(cut) == (cut, [])


def test_kimi_k2_calls_keep_the_ids_the_model_wrote_whole_and_streamed():
    """Kimi K2's chat template writes each call's id back into later turns, where the model expects its own
    ``functions.NAME:INDEX``: the ids go to the client as written."""
    reply = REPLIES["kimi_k2"]
    _, calls = tool_parser("kimi_k2").split(reply)
    assert [c["id"] for c in calls] == ["functions.weather:3", "functions.clock:4"]
    content, streamed, _, finish = streamed_calls(tool_parser("kimi_k2"), list(reply), id_prefix="functions.")
    assert content == "Checking." and finish == "tool_calls"
    assert [(c["id"], c["name"], c["arguments"]) for c in streamed] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]


XML_FORMATS = ["qwen3_coder", "seed_oss", "glm45", "minimax_m2"]
TYPED = {"weather": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": ["integer", "null"]}, "metric": {"enum": ["true", "false"]},
    "where": {"anyOf": [{"type": "object"}, {"type": "string"}]}}}}


@pytest.mark.parametrize("name", XML_FORMATS)
def test_raw_argument_values_are_typed_by_the_tools_schema_where_it_declares_them(name):
    """A value whose JSON reading is not of the declared type stays the text written when the type admits a
    string; values of undeclared parameters, and every value without a schema, are read as JSON."""
    reply = REPLIES[name].replace("Oslo", "0047").replace(">2<", ">007<").replace("\n2\n", "\n007\n")
    parser = tool_parser(name).for_tools(TYPED)
    _, calls = parser.split(reply)
    weather = json.loads(calls[0]["function"]["arguments"])
    # "0047" is not JSON, "007" neither (a leading zero): both stay text; "true" matches a string enum;
    # {"lat": 59.9} is an object, which the declared anyOf admits.
    assert weather == {"city": "0047", "days": "007", "metric": "true", "where": {"lat": 59.9}}
    numeric = REPLIES[name].replace("Oslo", "1234")
    typed = json.loads(tool_parser(name).for_tools(TYPED).split(numeric)[1][0]["function"]["arguments"])
    untyped = json.loads(tool_parser(name).split(numeric)[1][0]["function"]["arguments"])
    assert typed["city"] == "1234" and untyped["city"] == 1234  # a string parameter keeps its digits as text
    assert typed["days"] == untyped["days"] == 2 and typed["metric"] == "true" and untyped["metric"] is True
    for cut in range(len(reply) + 1):  # streamed typed: prefixes of the typed whole
        for (_, got), want in zip(parser.partial(reply[:cut]), calls, strict=False):
            assert want["function"]["arguments"].startswith(got)
    shared = tool_parser(name)  # the server's parser: typing is per request and leaves it as it was
    shared.for_tools(TYPED)
    assert json.loads(shared.split(numeric)[1][0]["function"]["arguments"])["city"] == 1234


GEMMA4 = ('Let me look.\n<|tool_call>call:get_weather{location:<|"|>Paris, FR: {"old"} [town]\nline 2<|"|>,days:3,'
          'units:{temp:<|"|>C<|"|>,wind:null},tags:[<|"|>a,b<|"|>,2,-1.5e3,[],{}],ok:false}<tool_call|>'
          '<|tool_call>call:maps.route-v2{ from : <|"|>Orsay<|"|> , to:<|"|>Lyon<|"|> }<tool_call|>')
GEMMA4_CALLS = [
    ("get_weather", {"location": 'Paris, FR: {"old"} [town]\nline 2', "days": 3,
                     "units": {"temp": "C", "wind": None}, "tags": ["a,b", 2, -1500.0, [], {}], "ok": False}),
    ("maps.route-v2", {"from": "Orsay", "to": "Lyon"})]


def test_gemma4_reads_its_notation_as_json_arguments_after_optional_text():
    """Strings sit between two <|"|> verbatim (commas, colons, braces, quotes and newlines included), keys are
    bare, the rest is as JSON writes it; the arguments are the JSON text of those values."""
    parser = tool_parser("gemma4")
    content, calls = parser.split(GEMMA4)
    assert content == "Let me look.\n" and parser.special_tokens
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == GEMMA4_CALLS
    assert all(c["function"]["arguments"] == json.dumps(json.loads(c["function"]["arguments"]), ensure_ascii=False)
               for c in calls)
    example = ('<|tool_call>call:get_weather{location:<|"|>Paris, FR<|"|>,days:3,units:{temp:<|"|>C<|"|>},'
               'tags:[<|"|>a<|"|>,2]}<tool_call|>')
    content, calls = parser.split(example)
    assert content is None and [c["function"] for c in calls] == [{
        "name": "get_weather", "arguments": '{"location": "Paris, FR", "days": 3, "units": {"temp": "C"}, '
                                            '"tags": ["a", 2]}'}]
    # A stop token may eat the last block's <tool_call|>: a whole object is still the call.
    assert [c["function"]["arguments"] for c in parser.split("<|tool_call>call:clock{tz:<|\"|>UTC<|\"|>}")[1]] == [
        '{"tz": "UTC"}']
    assert parser.start(GEMMA4) == len("Let me look.\n") and parser.held('Look.<|tool_c') == len("<|tool_c")


@pytest.mark.parametrize("reply", [
    '<|tool_call>call:f{city:Oslo}<tool_call|>',  # a bare word: strings are quoted
    '<|tool_call>call:f{city:"Oslo"}<tool_call|>',  # ... with <|"|>, not JSON's quotes
    '<|tool_call>call:f{n:NaN}<tool_call|>',
    '<|tool_call>call:f{n:1,}<tool_call|>',
    '<|tool_call>call:f{n 1}<tool_call|>',
    '<|tool_call>call:f{n:[1 2]}<tool_call|>',
    '<|tool_call>call:f{s:<|"|>open}<tool_call|>',  # a string never closed
    '<|tool_call>call:f{n:1} and more<tool_call|>',
    '<|tool_call>call:f{n:1',  # the object never closed
    '<|tool_call>f{n:1}<tool_call|>',
    '<|tool_call>call:f{}<tool_call|><|tool_call>not a call<tool_call|>',  # one bad block spoils the reply
    '<|tool_call>call:f{n:1}<tool_call|><|tool_call>call:g{n:',  # cut short by max_tokens
])
def test_a_gemma4_block_that_is_not_a_whole_call_leaves_the_reply_text(reply):
    assert tool_parser("gemma4").split(reply) == (reply, [])


def test_gemma4_arguments_stream_as_they_are_read_and_join_to_the_whole():
    """Every cut of a reply gives prefixes of the whole calls' arguments: a string goes out character by
    character (short of what could begin its closing quote), a number once something follows it."""
    parser = tool_parser("gemma4")
    whole = [(c["function"]["name"], c["function"]["arguments"]) for c in parser.split(GEMMA4)[1]]
    for cut in range(len(GEMMA4) + 1):
        for (name, args), (want_name, want_args) in zip(parser.partial(GEMMA4[:cut]), whole, strict=False):
            assert name == want_name and want_args.startswith(args), (cut, args)
    at = GEMMA4.index("Paris")
    assert parser.partial(GEMMA4[: at + 3]) == [("get_weather", '{"location": "Par')]
    assert parser.partial(GEMMA4[: at + 3] + "<|") == [("get_weather", '{"location": "Par')]  # maybe its quote
    days = GEMMA4.index("days:3") + len("days:3")
    assert parser.partial(GEMMA4[:days])[0][1].endswith('"days": ')  # 3 may go on to 30
    assert parser.partial(GEMMA4[: days + 1])[0][1].endswith('"days": 3, ')
    content, calls, pieces, finish = streamed_calls(parser, list(GEMMA4))  # one character a step
    assert content == "Let me look.\n" and finish == "tool_calls" and pieces[0] > 20
    assert [(c["name"], c["arguments"]) for c in calls] == whole


@given(st.lists(st.integers(0, len(GEMMA4)), max_size=10))
def test_a_gemma4_reply_cut_anywhere_streams_the_whole_replys_text_and_calls(cuts):
    """Cuts fall inside the markers and the string quotes too: what could begin one is held back."""
    bounds = sorted({0, *cuts, len(GEMMA4)})
    pieces = [GEMMA4[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    content, calls, _, finish = streamed_calls(tool_parser("gemma4"), pieces)
    assert content == "Let me look.\n" and finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == GEMMA4_CALLS
