"""Malformed bodies against every endpoint of the HTTP API (OpenAI's and Anthropic's): each gets an answer below 500, in time, and the mesh
keeps serving. Every field of a valid body is replaced, one at a time, by each of a set of values of the wrong
type or out of range (huge integers, NaN, empty lists...); then random bodies get one to three such changes.

Found this way (seventeenth session), each a single request: ``top_k`` 2**63 queued, then stopped the
scheduler converting its plan; ``n`` 2**40 hung it building choices; ``temperature`` 1e308 reached the workers
as inf and failed each one's step in turn (the mesh answered 503: no workers); ``metadata`` Infinity ran, then
failed to serialize as a 500. Eighteenth session: ``chat_template_kwargs`` naming a variable the server sets
(``bos_token``) was a 500. ``SEAWALL_FUZZ_REQUESTS`` / ``SEAWALL_FUZZ_SEED`` run longer or other seeds."""

from __future__ import annotations

import json
import os
import random

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ODD = [None, -1, 0, 1, 2**63, -2**63, 2**40, 10**30, 1e308, float("nan"), float("inf"), "", "x", [], {}, [None],
       [[1]], {"a": 1}, True, 3.5, "\u0000", [1, 2**40], ["a", 1], [-5], [{}]]

BODIES = {
    "/v1/completions": {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "n": 1, "logprobs": 1, "stop": ["x"],
                        "seed": 1, "top_p": 1.0, "top_k": 5, "echo": False, "logit_bias": {"5": 1},
                        "return_token_ids": True, "min_tokens": 0, "stream": False,
                        "stream_options": {"include_usage": True}, "priority": 0, "prompt_logprobs": 1,
                        "structured_outputs": {"regex": "a+"}, "allowed_token_ids": [5, 6], "bad_words": ["the"],
                        "cache_salt": "t", "model": None},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0,
                             "logprobs": True, "top_logprobs": 2, "n": 1, "stream": False,
                             "tools": [{"type": "function", "function": {
                                 "name": "f", "parameters": {"type": "object", "properties": {}}}}],
                             "tool_choice": "required", "response_format": {"type": "json_object"},
                             "reasoning_effort": "low", "session_id": "s", "continue_final_message": False,
                             "add_generation_prompt": True, "chat_template_kwargs": {"bos_token": "<s>"},
                             "cache_salt": "t", "model": None},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 3, "instructions": "be brief", "store": True,
                      "background": False, "tools": [{"type": "function", "name": "f", "parameters": {}}],
                      "text": {"format": {"type": "text"}}, "include": [], "previous_response_id": None,
                      "reasoning": {"effort": "low"}, "stream": False, "metadata": {"a": "b"}},
    "/v1/messages": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 3,
                     "system": "be brief", "temperature": 0, "stop_sequences": ["x"], "stream": False,
                     "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
                     "tool_choice": {"type": "any"}, "thinking": {"type": "disabled"},
                     "output_config": {"effort": "low"}, "metadata": {"user_id": "u"}, "top_k": 5, "model": None},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "Hi"}], "system": "be brief"},
    "/tokenize": {"prompt": "Hello", "add_special_tokens": True},
    "/detokenize": {"tokens": [5, 6, 7]},
}


def _mutated(body: dict, rng: random.Random) -> dict:
    out = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        if not out:
            break
        key = rng.choice(list(out))
        r = rng.random()
        if r < 0.6:
            out[key] = rng.choice(ODD)
        elif r < 0.8:
            del out[key]
        elif isinstance(out[key], dict) and out[key]:
            out[key][rng.choice(list(out[key]))] = rng.choice(ODD)
        elif isinstance(out[key], list) and out[key] and isinstance(out[key][0], dict) and out[key][0]:
            out[key][0][rng.choice(list(out[key][0]))] = rng.choice(ODD)
    return out


def _cases(rng: random.Random, extra: int) -> list[tuple[str, dict]]:
    """Every field of every body set to every odd value, one at a time; then ``extra`` random mutations."""
    cases = [(path, {**body, key: odd}) for path, body in BODIES.items() for key in body for odd in ODD]
    paths = list(BODIES)
    return cases + [(path, _mutated(BODIES[path], rng)) for path in (rng.choice(paths) for _ in range(extra))]


def test_malformed_bodies_get_answers_below_500_and_the_mesh_keeps_serving(default_mesh):
    rng = random.Random(int(os.environ.get("SEAWALL_FUZZ_SEED", "17")))
    failures = []
    with httpx.Client(base_url=default_mesh.http_url, timeout=30,
                      limits=httpx.Limits(keepalive_expiry=2.0)) as http:
        for path, body in _cases(rng, int(os.environ.get("SEAWALL_FUZZ_REQUESTS", "150"))):
            text = json.dumps(body)  # NaN and Infinity as Python's json writes them
            try:
                status = http.post(path, content=text, headers={"content-type": "application/json"}).status_code
            except httpx.TransportError as exc:
                status = type(exc).__name__
            if not isinstance(status, int) or status >= 500:
                failures.append((path, text, status))
                assert http.get("/health").status_code == 200, f"the mesh stopped serving after {failures[-1]}"
        assert http.get("/health").status_code == 200
    assert not failures
