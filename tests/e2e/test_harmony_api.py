"""gpt-oss's harmony format through the chat and Responses APIs of a live mesh (``--reasoning-parser harmony
--tool-call-parser harmony``). The built-in model, with four of its special tokens renamed to harmony's
markers, is made to write what gpt-oss would by a Lark grammar that names those special tokens: so the reply
holds real special tokens, which the API must decode (a mesh that skipped them would lose every header)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.test_openai_api import WEATHER, _sse
from tests.renamed_tokens import copy_with_renamed_tokens

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# The built-in tokenizer's <|pad|>, <|start_header_id|>, <|end_header_id|>, <|begin_of_text|>.
END, CHANNEL, MESSAGE, START = 2, 3, 4, 0
THINK = f'<[{CHANNEL}]> "analysis" <[{MESSAGE}]> "The user wants Oslo." <[{END}]>'


def _grammar(*parts: str) -> dict:
    return {"grammar": "start: " + " ".join(parts)}


@pytest.fixture(scope="module")
def harmony_model(tiny_model_dir, tmp_path_factory):
    model = copy_with_renamed_tokens(tiny_model_dir, tmp_path_factory.mktemp("harmony") / "model", {
        END: "<|end|>", CHANNEL: "<|channel|>", MESSAGE: "<|message|>", START: "<|start|>"})
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.update(pad_token="<|end|>", chat_template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                                                     "{% endfor %}assistant:")
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def _harmony_mesh(model, logs, *flags):
    from tests.e2e.conftest import start_mesh

    mesh = start_mesh(model, logs, mode="colocated", scheduler_args=[
        "--reasoning-parser", "harmony", "--tool-call-parser", "harmony", *flags])
    try:
        with httpx.Client(base_url=mesh.http_url, timeout=60) as client:
            yield client
    finally:
        mesh.stop()


@pytest.fixture(scope="module")
def harmony_http(harmony_model, tmp_path_factory):
    """Structured outputs constrain the whole reply: the tests make the model write harmony with them."""
    yield from _harmony_mesh(harmony_model, tmp_path_factory.mktemp("harmony-logs"),
                             "--structured-output-in-reasoning")


def test_the_analysis_channel_is_the_thought_and_final_the_answer(harmony_http):
    body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 60, "temperature": 0,
            "structured_outputs": _grammar(THINK, f'<[{CHANNEL}]> "final" <[{MESSAGE}]> "Sunny."')}
    choice = harmony_http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Sunny.",
                                 "reasoning_content": "The user wants Oslo."}
    assert choice["finish_reason"] == "stop"
    events = _sse(harmony_http.post("/v1/chat/completions", json={**body, "stream": True}))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user wants Oslo."
    assert "".join(d.get("content") or "" for d in deltas) == "Sunny."
    # usage counts the thought's tokens, through the <|end|> that closes it: 1 + "analysis" + 1 + text + 1
    analysis = len(harmony_http.post("/tokenize", json={"prompt": "analysis"}).json()["tokens"])
    text = len(harmony_http.post("/tokenize", json={"prompt": "The user wants Oslo."}).json()["tokens"])
    usage = harmony_http.post("/v1/chat/completions", json=body).json()["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 3 + analysis + text}


def test_a_message_to_a_function_is_a_tool_call(harmony_http):
    call = f'<[{CHANNEL}]> "commentary to=functions.weather" <[{MESSAGE}]> "{{\\"city\\": \\"Oslo\\", \\"days\\": 2}}"'
    body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 80, "temperature": 0,
            "tools": [WEATHER], "structured_outputs": _grammar(THINK, call)}
    choice = harmony_http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == "The user wants Oslo."
    (got,) = choice["message"]["tool_calls"]
    assert got["function"] == {"name": "weather", "arguments": '{"city": "Oslo", "days": 2}'}
    events = _sse(harmony_http.post("/v1/chat/completions", json={**body, "stream": True}))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    streamed = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [c["function"]["name"] for c in streamed if "id" in c] == ["weather"]
    assert "".join(c["function"]["arguments"] for c in streamed) == got["function"]["arguments"]
    assert not "".join(d.get("content") or "" for d in deltas)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    response = harmony_http.post("/v1/responses", json={
        "input": "Weather in Oslo?", "max_output_tokens": 80, "temperature": 0,
        "tools": [{"type": "function", **WEATHER["function"]}], "structured_outputs": _grammar(THINK, call)}).json()
    assert [item["type"] for item in response["output"]] == ["reasoning", "function_call"], response


def test_a_structured_output_constrains_the_final_message_after_the_analysis(harmony_model, tmp_path):
    """Without --structured-output-in-reasoning the schema applies in the final channel: the grammar lets the
    analysis messages through and then holds the final message to the schema (logit_bias nudges the model to
    the final channel; tests/engine/test_grammar.py walks thoughts through the same grammar)."""
    for client in _harmony_mesh(harmony_model, tmp_path / "logs"):
        (final,) = client.post("/tokenize", json={"prompt": "final"}).json()["tokens"]
        schema = {"type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"],
                  "additionalProperties": False}
        body = {"messages": [{"role": "user", "content": "Pick."}], "max_tokens": 60, "temperature": 0,
                "logit_bias": {str(END): 100, str(final): 100},
                "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}}}
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert choice["finish_reason"] == "stop" and json.loads(choice["message"]["content"]) in ({"a": 1}, {"a": 2})
        assert choice["message"].get("reasoning_content") is None  # the thought it ended at once
