"""SamplingParams validation, the OpenAI body mapping and token-level stop checks."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re

import pytest

from services.common import sampling_params as sp_module
from services.common.errors import InvalidArgument
from services.common.sampling_params import (
    FinishReason,
    SamplingParams,
    check_stop,
    from_openai_completion,
    generation_defaults,
    with_defaults,
)

# (field, bad value, text the message must contain besides the field name and the value)
BAD_VALUES = [
    ("max_tokens", 0, ">= 1"),
    ("max_tokens", 2.5, "integer"),
    ("max_tokens", True, "integer"),
    ("temperature", -0.1, ">= 0"),
    ("temperature", "hot", "must be a number"),
    ("temperature", float("nan"), "finite"),
    ("top_k", -2, ">= 1"),
    ("top_k", 1.5, "integer"),
    ("top_p", 0.0, "(0, 1]"),
    ("top_p", 1.5, "(0, 1]"),
    ("min_p", -0.1, "[0.0, 1.0]"),
    ("min_p", 1.1, "[0.0, 1.0]"),
    ("seed", -1, "[0, "),
    ("seed", 2**63, "[0, "),
    ("seed", "42", "integer"),
    ("repetition_penalty", 0.0, "> 0"),
    ("repetition_penalty", -1.0, "> 0"),
    ("presence_penalty", 2.5, "[-2.0, 2.0]"),
    ("presence_penalty", -2.5, "[-2.0, 2.0]"),
    ("frequency_penalty", 3, "[-2.0, 2.0]"),
    ("frequency_penalty", None, "must be a number"),
    ("stop", ["x"], "tuple"),
    ("stop", ("",), "non-empty"),
    ("stop", (3,), "non-empty strings"),
    ("stop_token_ids", [1], "tuple"),
    ("stop_token_ids", (-1,), ">= 0"),
    ("stop_token_ids", ("a",), "integer"),
    ("ignore_eos", 1, "true or false"),
    ("min_tokens", -1, ">= 0"),
    ("min_tokens", 17, "<= max_tokens (16)"),
    ("logprobs", 21, "[0, 20]"),
    ("logprobs", -1, "[0, 20]"),
    ("prompt_logprobs", 21, "[0, 20]"),
    ("prompt_logprobs", True, "integer"),
    ("include_stop_str_in_output", "yes", "true or false"),
    ("logit_bias", {5: 1.0}, "tuple of (token id, bias) pairs"),
    ("logit_bias", ((5, 100.5),), "[-100.0, 100.0]"),
    ("logit_bias", ((-1, 1.0),), ">= 0"),
    ("logit_bias", ((7, 1.0), (3, 1.0)), "unique and sorted"),
    ("allowed_token_ids", [1, 2], "tuple"),
    ("allowed_token_ids", (-3,), ">= 0"),
    ("bad_words", ["word"], "list of at most 1024 words"),
    ("bad_words", (" \n", "ok"), "strings with more than blanks"),
    ("structured_output", ("yaml", "a: 1"), "one of json, regex, choice, grammar"),
    ("structured_output", ("json", "{not json"), "not valid JSON"),
    ("structured_output", ("json", "[1, 2]"), "JSON schema object"),
    ("free_thought", "always", "free_thought must be one of"),
    ("free_thought", "required", "needs one"),
    ("structured_output", ("choice", "[]"), "non-empty list of non-empty strings"),
    ("structured_output", ("regex", ""), "non-empty spec"),
    ("structured_output", "json", "(kind, spec) pair"),
    ("skip_special_tokens", "no", "true or false"),
    ("pooling", "yes", "true or false"),
]


def test_an_embedding_request_samples_nothing():
    assert SamplingParams(max_tokens=1, pooling=True).pooling
    for extra in ({}, {"logprobs": 2}, {"prompt_logprobs": 0}, {"allowed_token_ids": (5,)}):
        with pytest.raises(InvalidArgument, match="an embedding request .* takes max_tokens 1"):
            SamplingParams(**{"max_tokens": 1 if extra else 4, "pooling": True, **extra})


@pytest.mark.parametrize(("field", "value", "accepted"), BAD_VALUES)
def test_validation_names_field_value_and_accepted(field, value, accepted):
    with pytest.raises(InvalidArgument) as exc:
        SamplingParams(**{field: value})
    msg = str(exc.value)
    assert field in msg
    assert accepted in msg
    shown = value[0] if isinstance(value, tuple) else value  # tuples are checked element by element
    if field == "structured_output" and isinstance(value, tuple):  # the message names the bad part
        shown = value[0] if "one of" in accepted else value[1]
    elif isinstance(shown, tuple):  # a logit_bias pair: the message names the bad part of it
        shown = shown[1] if "[-100.0, 100.0]" in accepted else shown[0]
    assert f"{shown!r}" in msg


def test_every_field_has_a_bad_value_case_and_a_comment():
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    assert fields == {case[0] for case in BAD_VALUES}
    # Each field is documented by a comment line right above it.
    source = inspect.getsource(SamplingParams).splitlines()
    for i, line in enumerate(source):
        m = re.match(r"\s+(\w+): .* = ", line)
        if m and m.group(1) in fields:
            assert source[i - 1].strip().startswith("#"), f"{m.group(1)} has no comment line"


def test_defaults_and_valid_edges():
    p = SamplingParams()
    assert p.max_tokens == 16 and p.temperature == 1.0 and not p.is_greedy and not p.has_penalties
    SamplingParams(top_k=-1, top_p=1.0, min_p=1.0, seed=2**63 - 1, logprobs=20, min_tokens=16)
    SamplingParams(temperature=0, presence_penalty=-2, frequency_penalty=2, logprobs=0)
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=1e-6).is_greedy
    assert not SamplingParams(temperature=1e-3).is_greedy
    assert SamplingParams(repetition_penalty=1.1).has_penalties


def test_sampling_params_module_imports_no_torch():
    tree = ast.parse(inspect.getsource(sp_module))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert imported.isdisjoint({"torch", "grpc", "asyncio", "numpy"})


# --- from_openai ----------------------------------------------------------------------------------------


def test_from_openai_maps_every_field():
    body = {
        "model": "m", "prompt": "hi", "stream": True, "user": "u", "return_token_ids": True, "echo": False,
        "n": 1, "best_of": 1, "max_tokens": 5, "temperature": 0, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "seed": 7, "stop": ["a", "bc"], "stop_token_ids": [2, 3], "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "repetition_penalty": 1.2, "logprobs": 3, "ignore_eos": True,
        "min_tokens": 2, "prompt_logprobs": 1, "logit_bias": {"50": 5, "7": -100.0}, "allowed_token_ids": [7, 50, 9],
        "skip_special_tokens": False, "metadata": {"team": "a"}, "store": False, "service_tier": "auto",
        "prompt_cache_key": "k", "safety_identifier": "s",
    }
    p = SamplingParams.from_openai(body)
    assert p == SamplingParams(
        max_tokens=5, temperature=0.0, top_p=0.9, top_k=40, min_p=0.05, seed=7, stop=("a", "bc"),
        stop_token_ids=(2, 3), presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2,
        logprobs=3, ignore_eos=True, min_tokens=2, prompt_logprobs=1, logit_bias=((7, -100.0), (50, 5.0)),
        allowed_token_ids=(7, 50, 9), skip_special_tokens=False,
    )
    assert p.constrains_tokens and not SamplingParams().constrains_tokens
    assert isinstance(p.temperature, float)


def test_from_openai_stop_string_and_nulls_mean_default():
    assert SamplingParams.from_openai({"stop": "###"}).stop == ("###",)
    assert SamplingParams.from_openai({"stop": None, "seed": None, "logprobs": None}) == SamplingParams()
    assert SamplingParams.from_openai({}) == SamplingParams()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
        ({"max_tokens": "10"}, "max_tokens must be an integer, got '10'"),
        ({"max_tokens": 10.0}, "max_tokens must be an integer, got 10.0"),
        ({"top_p": [0.5]}, "top_p must be a number, got [0.5]"),
        ({"seed": 1.5}, "seed must be an integer, got 1.5"),
        ({"stop": 5}, "stop must be a string or a list of strings, got 5"),
        ({"stop": ["a", 1]}, "stop must be a string or a list of strings, got ['a', 1]"),
        ({"stop": [""]}, "stop must contain only non-empty strings, got ''"),
        ({"stop_token_ids": 3}, "stop_token_ids must be a list of integers, got 3"),
        ({"stop_token_ids": ["x"]}, "stop_token_ids must be an integer, got 'x'"),
        ({"logprobs": True}, "logprobs must be an integer in [0, 20] (top-n per token), got True"),
        ({"ignore_eos": "false"}, "ignore_eos must be true or false, got 'false'"),
        ({"n": 2}, "n must be 1 (only one completion per request is supported), got 2"),
        ({"best_of": 3}, "best_of must be 1 (only one completion per request is supported), got 3"),
        ({"echo": True}, "echo must be false (echoing the prompt is not supported), got True"),
        ({"logit_bias": {"abc": 1}}, "logit_bias keys must be token ids (integers >= 0), got 'abc'"),
        ({"logit_bias": {"-2": 1}}, "logit_bias keys must be token ids (integers >= 0), got '-2'"),
        ({"logit_bias": {"5": 101}}, "logit_bias[5] must be in [-100.0, 100.0], got 101.0"),
        ({"logit_bias": {"5": "up"}}, "logit_bias[5] must be a number, got 'up'"),
        ({"logit_bias": {"5": 1, "05": 2}}, "logit_bias names token id 5 twice"),
        ({"logit_bias": [5, 1]}, "logit_bias must be an object mapping token ids to biases"),
        ({"allowed_token_ids": 3}, "allowed_token_ids must be a list of integers, got 3"),
        ({"suffix": "x"}, "suffix is not supported"),
        ({"temprature": 0.5}, "unknown field 'temprature'; accepted fields: "),
    ],
)
def test_from_openai_rejects_clearly(body, expected):
    with pytest.raises(InvalidArgument) as exc:
        SamplingParams.from_openai(body)
    assert expected in str(exc.value)


def test_structured_output_in_every_spelling_the_apis_use():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    text = json.dumps(schema)
    cases = [
        ({"response_format": {"type": "json_object"}}, ("json", '{"type": "object"}')),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}, ("json", text)),
        ({"response_format": {"type": "text"}}, None),
        ({"structured_outputs": {"json": schema}}, ("json", text)),
        ({"structured_outputs": {"regex": "[0-9]+"}}, ("regex", "[0-9]+")),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, ("choice", '["yes", "no"]')),
        ({"structured_outputs": {"grammar": 'start: "a"'}}, ("grammar", 'start: "a"')),
        ({"guided_json": text}, ("json", text)),
        ({"guided_choice": ["a"], "response_format": {"type": "text"}}, ("choice", '["a"]')),
    ]
    for body, want in cases:
        assert SamplingParams.from_openai(body).structured_output == want, body
    assert SamplingParams.from_openai({"guided_regex": "a+"}).constrains_tokens


@pytest.mark.parametrize(("body", "expected"), [
    ({"response_format": {"type": "xml"}}, "response_format type must be text, json_object or json_schema"),
    ({"response_format": {"type": "json_schema"}}, 'needs "json_schema": {"name": ..., "schema": {...}}'),
    ({"response_format": "json"}, "response_format must be an object"),
    ({"structured_outputs": {"yaml": "x"}}, "unknown key(s) yaml"),
    ({"structured_outputs": "x"}, "structured_outputs must be an object"),
    ({"guided_choice": "yes"}, "guided_choice must be a list of strings, got 'yes'"),
    ({"guided_json": 5}, "guided_json must be a JSON schema (object or JSON text), got 5"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "give one structured output, not several"),
    ({"guided_regex": "a", "min_tokens": 2}, "min_tokens must be 0 with structured output"),
])
def test_structured_output_mistakes_are_named(body, expected):
    with pytest.raises(InvalidArgument) as exc:
        SamplingParams.from_openai(body)
    assert expected in str(exc.value)


def test_token_ids_to_bias_or_allow_must_be_in_the_vocabulary():
    SamplingParams(logit_bias=((99, 1.0),), allowed_token_ids=(0, 99)).check_vocab(100)
    with pytest.raises(InvalidArgument, match=r"logit_bias names token id 100, outside the vocabulary \[0, 100\)"):
        SamplingParams(logit_bias=((100, 1.0),)).check_vocab(100)
    with pytest.raises(InvalidArgument, match=r"allowed_token_ids has token id 4096, outside"):
        SamplingParams(allowed_token_ids=(1, 4096)).check_vocab(4096)


def test_from_openai_rejects_non_object():
    with pytest.raises(InvalidArgument, match="JSON object, got list"):
        SamplingParams.from_openai([])  # type: ignore[arg-type]


# --- check_stop -------------------------------------------------------------------------------------------

EOS = (2, 9)


@pytest.mark.parametrize(
    ("params", "output", "expected"),
    [
        (SamplingParams(), [], None),
        (SamplingParams(), [5], None),
        (SamplingParams(), [5, 2], FinishReason.STOP),
        (SamplingParams(), [5, 9], FinishReason.STOP),
        (SamplingParams(), [2, 5], None),  # only the last token counts
        (SamplingParams(ignore_eos=True), [5, 2], None),
        (SamplingParams(ignore_eos=True, stop_token_ids=(2,)), [5, 2], FinishReason.STOP),
        (SamplingParams(stop_token_ids=(7,)), [7], FinishReason.STOP),
        (SamplingParams(max_tokens=2), [5, 6], FinishReason.LENGTH),
        (SamplingParams(max_tokens=2), [5, 2], FinishReason.STOP),  # stop wins over length
        (SamplingParams(max_tokens=2, ignore_eos=True), [5, 2], FinishReason.LENGTH),
        (SamplingParams(min_tokens=3), [5, 2], None),
        (SamplingParams(min_tokens=3, stop_token_ids=(7,)), [5, 7], None),
        (SamplingParams(min_tokens=3), [5, 6, 2], FinishReason.STOP),
        (SamplingParams(max_tokens=3, min_tokens=3), [5, 6, 7], FinishReason.LENGTH),
    ],
)
def test_check_stop(params, output, expected):
    assert check_stop(params, output, EOS) == expected


def test_finish_reason_strings():
    assert (FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT) == ("stop", "length", "abort")


def test_a_completion_body_hands_n_and_echo_to_the_api_layer_and_echo_scores_the_prompt():
    params, n, echo = from_openai_completion({"prompt": "x", "n": 3, "echo": True, "logprobs": 2, "seed": 4})
    assert (n, echo, params.logprobs, params.prompt_logprobs, params.seed) == (3, True, 2, 2, 4)
    assert [params.for_choice(j).seed for j in range(3)] == [4, 5, 6]
    plain, n, echo = from_openai_completion({"prompt": "x", "echo": True})
    assert (n, echo, plain.prompt_logprobs) == (1, True, None)  # echo without logprobs scores nothing
    with pytest.raises(InvalidArgument, match="echo must be true or false"):
        from_openai_completion({"echo": "yes"})


def test_a_models_generation_config_gives_the_fields_a_request_leaves_out():
    defaults = generation_defaults({"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                    "repetition_penalty": 1.05, "max_new_tokens": 512, "eos_token_id": [1, 2],
                                    "min_p": None})
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05,
                        "max_tokens": 512}
    assert with_defaults({"prompt": "Hi", "temperature": 0, "top_p": None}, defaults) == {
        "prompt": "Hi", "temperature": 0, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05, "max_tokens": 512}
    beams = {"prompt": "Hi", "use_beam_search": True, "n": 2}
    assert with_defaults(beams, defaults) is beams  # a beam search samples nothing
    with pytest.raises(InvalidArgument, match="generation_config.json: top_p must be"):
        generation_defaults({"top_p": 1.5})
