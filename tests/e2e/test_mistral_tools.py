"""Mistral's tool calls through a live mesh (``--tool-call-parser mistral``): ``[TOOL_CALLS]`` is a control
token, so the chat path decodes such replies with their special tokens (a mesh that skipped them would see
plain text). The built-in model, with two special tokens renamed to Mistral's markers, is made to write a call
by a Lark grammar that names them by id."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_openai_api import WEATHER, _sse
from tests.renamed_tokens import copy_with_renamed_tokens

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOOL_CALLS, ARGS = 3, 4  # the built-in tokenizer's <|start_header_id|>, <|end_header_id|>


@pytest.fixture(scope="module")
def mistral_http(tiny_model_dir, tmp_path_factory):
    from tests.e2e.conftest import start_mesh

    model = copy_with_renamed_tokens(tiny_model_dir, tmp_path_factory.mktemp("mistral") / "model",
                                     {TOOL_CALLS: "[TOOL_CALLS]", ARGS: "[ARGS]"})
    mesh = start_mesh(model, tmp_path_factory.mktemp("mistral-logs"), mode="colocated",
                      scheduler_args=["--tool-call-parser", "mistral"])
    try:
        with httpx.Client(base_url=mesh.http_url, timeout=60) as client:
            yield client
    finally:
        mesh.stop()


def test_a_call_after_the_control_token_is_a_tool_call_with_a_nine_character_id(mistral_http):
    grammar = f'start: "Checking." <[{TOOL_CALLS}]> "weather" <[{ARGS}]> "{{\\"city\\": \\"Oslo\\"}}"'
    body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 60, "temperature": 0,
            "tools": [WEATHER], "structured_outputs": {"grammar": grammar}}
    choice = mistral_http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert len(call["id"]) == 9 and call["id"].isalnum()
    events = _sse(mistral_http.post("/v1/chat/completions", json={**body, "stream": True}))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    streamed = [c for d in deltas for c in d.get("tool_calls", [])]
    assert "".join(c["function"]["arguments"] for c in streamed) == '{"city": "Oslo"}'
    # Without tools the reply is decoded as the request asks: the control tokens are skipped.
    plain = mistral_http.post("/v1/chat/completions", json={k: v for k, v in body.items() if k != "tools"}).json()
    assert plain["choices"][0]["message"]["content"] == 'Checking.weather{"city": "Oslo"}'
