"""The OpenAI-compatible HTTP API of a live mesh, exercised with plain HTTP."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import grpc
import httpx
import pytest
import torch
from tokenizers import Tokenizer

from seawall import Client
from seawall.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from services.common.errors import InvalidArgument
from services.common.version import VERSION
from tests.e2e.conftest import random_prompts, start_mesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def http(default_mesh):
    with httpx.Client(base_url=default_mesh.http_url, timeout=60) as client:
        yield client


def _sse(response: httpx.Response) -> list[dict]:
    events = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_models_and_health(http):
    models = http.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["workers"] == 2
    assert http.get("/version").json() == {"version": VERSION}


def test_completion_with_token_ids_matches_transformers_and_the_grpc_api(http, default_mesh, hf_greedy):
    prompt = random_prompts([37], seed=3)[0]
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 9, "temperature": 0, "return_token_ids": True}
    reply = http.post("/v1/completions", json=body).json()
    choice = reply["choices"][0]
    assert reply["object"] == "text_completion" and choice["token_ids"] == hf_greedy(prompt, 9)
    assert reply["usage"]["prompt_tokens"] == 37 and reply["usage"]["completion_tokens"] == len(choice["token_ids"])
    with Client(default_mesh.grpc_address) as client:
        out = client.generate(prompt, max_tokens=9, temperature=0)
    assert out.token_ids == choice["token_ids"] and out.text == choice["text"]


@pytest.mark.parametrize("path, body, streamed_too", [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "n": 2}, True),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, True),
    # Their streams open with events sent before the first step (response.created, message_start).
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 2}, False),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, False),
])
def test_a_reply_says_how_long_its_request_queued(http, path, body, streamed_too):
    # test_priority.py checks that the header orders requests as they ran.
    reply = http.post(path, json=body)
    assert reply.status_code == 200 and float(reply.headers["x-queue-time"]) >= 0
    streamed = http.post(path, json={**body, "stream": True})
    assert streamed.status_code == 200 and ("x-queue-time" in streamed.headers) == streamed_too
    if streamed_too:
        assert float(streamed.headers["x-queue-time"]) >= 0 and streamed.text.endswith("data: [DONE]\n\n")


def test_a_stream_of_choices_run_one_after_another_streams_the_first_while_the_next_waits(tiny_model_dir, tmp_path):
    # The headers (x-queue-time) wait for a first token, not for every choice's: with one sequence at a time,
    # waiting for all would hold choice 0's tokens back until it finished and send them as one event.
    m = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated", scheduler_args=["--max-num-seqs", "1"])
    try:
        body = {"prompt": random_prompts([20])[0], "max_tokens": 200, "ignore_eos": True, "stream": True, "n": 2}
        reply = httpx.post(f"{m.http_url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200 and float(reply.headers["x-queue-time"]) >= 0
        order = [e["choices"][0]["index"] for e in _sse(reply)]
        assert order == sorted(order) and order.count(0) >= 10 and order.count(1) >= 10
    finally:
        m.stop()


def test_continuous_usage_stats_put_each_choice_s_usage_so_far_in_every_chunk(http):
    options = {"include_usage": True, "continuous_usage_stats": True}  # vLLM's
    body = {"prompt": random_prompts([12], seed=21)[0], "max_tokens": 6, "ignore_eos": True, "n": 2, "stream": True,
            "stream_options": options, "return_token_ids": True}
    events = _sse(http.post("/v1/completions", json=body))
    for i in (0, 1):
        got = 0
        for e in (e for e in events if e["choices"] and e["choices"][0]["index"] == i):
            got += len(e["choices"][0]["token_ids"])
            assert e["usage"] == {"prompt_tokens": 12, "completion_tokens": got, "total_tokens": 12 + got}
        assert got == 6
    assert not events[-1]["choices"] and events[-1]["usage"]["completion_tokens"] == 12  # include_usage's total
    plain = _sse(http.post("/v1/completions", json={**body, "stream_options": {"include_usage": True}}))
    assert all("usage" not in e for e in plain if e["choices"])
    bad = http.post("/v1/completions", json={**body, "stream_options": {**options, "continuous_usage_stats": 1}})
    assert bad.status_code == 400 and "continuous_usage_stats must be true or false" in bad.text


def test_streamed_completion_of_a_text_prompt_equals_the_unstreamed_one(http):
    body = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    response = http.post("/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse(response)
    chunks = [e["choices"][0] for e in events if e["choices"]]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [t for c in chunks for t in c["token_ids"]] == whole["token_ids"]
    assert chunks[-1]["finish_reason"] == whole["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 12


def test_chat_completion_applies_the_chat_template(http, default_mesh):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    reply = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6, "temperature": 0,
                                                    "return_token_ids": True}).json()
    message = reply["choices"][0]["message"]
    assert reply["object"] == "chat.completion" and message["role"] == "assistant"
    template = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n")
    with Client(default_mesh.grpc_address) as client:
        direct = client.generate(template, max_tokens=6, temperature=0)
    assert reply["choices"][0]["token_ids"] == direct.token_ids and message["content"] == direct.text
    streamed = _sse(http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6, "temperature": 0,
                                                            "stream": True}))
    assert streamed[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in streamed) == message["content"]


def test_a_list_of_prompts_with_n_choices_each_matches_transformers_choice_by_choice(http, hf_greedy):
    prompts = random_prompts([12, 40], seed=4)
    body = {"prompt": prompts, "n": 2, "max_tokens": 7, "temperature": 0, "return_token_ids": True}
    reply = http.post("/v1/completions", json=body).json()
    choices = reply["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for c in choices:  # choice i * n + j is the j-th of prompt i
        assert c["token_ids"] == hf_greedy(prompts[c["index"] // 2], 7)
    assert reply["usage"]["prompt_tokens"] == 52  # each prompt once, though two choices ran it
    assert reply["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)
    events = _sse(http.post("/v1/completions", json={**body, "stream": True}))
    streamed: dict[int, list[int]] = {}
    for e in events:
        assert len(e["choices"]) == 1  # one choice per event, as OpenAI streams them
        streamed.setdefault(e["choices"][0]["index"], []).extend(e["choices"][0]["token_ids"])
    assert streamed == {c["index"]: c["token_ids"] for c in choices}
    mixed = http.post("/v1/completions", json={"prompt": ["The quick brown fox", prompts[0]], "max_tokens": 3,
                                               "temperature": 0, "return_token_ids": True}).json()
    assert mixed["choices"][1]["token_ids"] == hf_greedy(prompts[0], 3)


def test_completion_logprobs_match_transformers_and_stream_in_pieces(http, hf_model):
    prompt = random_prompts([25], seed=12)[0]
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3, "return_token_ids": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    ids, lp = choice["token_ids"], choice["logprobs"]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float(), -1)
    for k, token in enumerate(ids):
        top = torch.topk(ref[k], 3)
        assert [tid for tid, _ in lp["top_logprobs_ids"][k]] == top.indices.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in lp["top_logprobs_ids"][k]]), top.values,
                                   atol=1e-4, rtol=0)
        assert abs(lp["token_logprobs"][k] - ref[k, token].item()) < 1e-4
    assert len(lp["tokens"]) == len(ids) and lp["text_offset"][0] == 0
    assert all(len(top) <= 3 for top in lp["top_logprobs"])  # {text: logprob}; two ids may share a text
    streamed = [e["choices"][0]["logprobs"] for e in _sse(http.post("/v1/completions", json={**body, "stream": True}))]
    for key in ("tokens", "text_offset"):
        assert [x for piece in streamed for x in piece[key]] == lp[key], key
    # The second run hits the prefix cache: other chunks, the same values up to float rounding.
    again = [x for piece in streamed for x in piece["token_logprobs"]]
    torch.testing.assert_close(torch.tensor(again), torch.tensor(lp["token_logprobs"]), atol=1e-4, rtol=0)
    assert http.post("/v1/completions", json={**body, "logprobs": None}).json()["choices"][0]["logprobs"] is None


def test_echo_with_logprobs_scores_the_prompt_as_transformers_does(http, default_mesh, hf_model, tiny_model_dir):
    prompt = random_prompts([150], seed=13)[0]  # three 64-token chunks on the prefill worker
    body = {"prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 2, "echo": True, "return_token_ids": True}
    echoed = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).decode(prompt, skip_special_tokens=False)
    for _ in range(2):  # the second time the prompt's blocks are cached: a scored prompt must not use them
        choice = http.post("/v1/completions", json=body).json()["choices"][0]
        ids, lp = choice["token_ids"], choice["logprobs"]
        assert choice["text"].startswith(echoed) and len(lp["tokens"]) == len(prompt) + len(ids)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing scores the first token
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(torch.tensor([prompt + ids])).logits[0].float(), -1)
        everything = prompt + ids
        got = torch.tensor(lp["token_logprobs"][1:])
        want = ref[torch.arange(len(everything) - 1), torch.tensor(everything[1:])]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        for pos in (1, 64, 65, 149):  # chunk edges too
            assert [tid for tid, _ in lp["top_logprobs_ids"][pos]] == torch.topk(ref[pos - 1], 2).indices.tolist()
    events = _sse(http.post("/v1/completions", json={**body, "stream": True}))
    assert "".join(e["choices"][0]["text"] for e in events) == choice["text"]
    assert [t for e in events for t in e["choices"][0]["logprobs"]["tokens"]] == lp["tokens"]
    plain = http.post("/v1/completions", json={"prompt": "Hello there", "echo": True, "max_tokens": 2}).json()
    assert plain["choices"][0]["text"].startswith("Hello there") and plain["choices"][0]["logprobs"] is None
    with Client(default_mesh.grpc_address) as client:
        out = client.generate(prompt, max_tokens=2, temperature=0, prompt_logprobs=1)
    assert [t.token_id for t in out.prompt_logprobs] == prompt[1:]
    torch.testing.assert_close(torch.tensor([t.logprob for t in out.prompt_logprobs]), want[: len(prompt) - 1],
                               atol=1e-4, rtol=0)


def test_prompt_logprobs_come_back_as_vllm_returns_them(http, hf_model):
    prompt = random_prompts([70], seed=14)[0]
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    scores = choice["prompt_logprobs"]
    assert len(scores) == len(prompt) and scores[0] is None and choice["logprobs"] is None
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0].float(), -1)
    for pos in range(1, len(prompt)):
        entry = scores[pos]
        assert abs(entry[str(prompt[pos])]["logprob"] - ref[pos - 1, prompt[pos]].item()) < 1e-4
        top = torch.topk(ref[pos - 1], 2).indices.tolist()
        assert all(str(t) in entry for t in top) and len(entry) <= 3
        assert entry[str(top[0])]["rank"] == 1
    first = _sse(http.post("/v1/completions", json={**body, "stream": True}))[0]["choices"][0]
    assert first["prompt_logprobs"] == scores  # with the choice's first chunk


def test_the_sdk_returns_the_same_logprobs_as_the_http_api(http, default_mesh):
    prompt = random_prompts([25], seed=12)[0]
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3, "return_token_ids": True}
    lp = http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    with Client(default_mesh.grpc_address) as client:
        whole = client.generate(prompt, max_tokens=6, temperature=0, logprobs=3)
        batch = client.generate_batch([prompt], max_tokens=6, temperature=0, logprobs=3)[0]
        streamed = [t for c in client.stream(prompt, max_tokens=6, temperature=0, logprobs=3) for t in c.logprobs]
    for got in (whole.logprobs, batch.logprobs, streamed):
        assert [t.token_id for t in got] == whole.token_ids
        assert [[tid for tid, _ in t.top_logprobs] for t in got] == [[tid for tid, _ in top]
                                                                     for top in lp["top_logprobs_ids"]]
        torch.testing.assert_close(torch.tensor([t.logprob for t in got]), torch.tensor(lp["token_logprobs"]),
                                   atol=1e-4, rtol=0)
    assert all(t.rank == 1 for t in whole.logprobs)  # greedy: every sampled token is the most likely


def test_chat_logprobs_are_token_objects(http):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0, "logprobs": True,
            "top_logprobs": 2, "return_token_ids": True}
    choice = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == len(choice["token_ids"])
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode()) and len(entry["top_logprobs"]) == 2
        assert entry["logprob"] == entry["top_logprobs"][0]["logprob"]  # greedy: the sampled token is the top one
    bad = http.post("/v1/chat/completions", json={**body, "top_logprobs": "two"})
    assert bad.status_code == 400 and "top_logprobs must be an integer" in bad.json()["error"]["message"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Hello", "logprobs": 2}),
    ("/v1/completions", {"prompt": "Hello", "logprobs": 2, "echo": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 2}),
])
def test_logprobs_name_tokens_by_id_when_asked_as_vllm_does(http, path, body):
    body = {**body, "max_tokens": 5, "temperature": 0, "return_token_ids": True}
    plain = http.post(path, json=body).json()["choices"][0]
    named = http.post(path, json={**body, "return_tokens_as_token_ids": True}).json()["choices"][0]
    assert named["token_ids"] == plain["token_ids"]
    if path == "/v1/completions":
        lp, ref = named["logprobs"], plain["logprobs"]
        shown = [int(t.removeprefix("token_id:")) for t in lp["tokens"]]
        assert shown[len(shown) - len(named["token_ids"]):] == named["token_ids"]
        assert lp["text_offset"] == ref["text_offset"] and lp["token_logprobs"] == ref["token_logprobs"]
        assert [list(top) if top else top for top in lp["top_logprobs"]] == [
            [f"token_id:{tid}" for tid, _ in ids] if ids else ids for ids in ref["top_logprobs_ids"]]
        events = _sse(http.post(path, json={**body, "return_tokens_as_token_ids": True, "stream": True}))
        for key in ("tokens", "text_offset"):
            assert [x for e in events for x in e["choices"][0]["logprobs"][key]] == lp[key], key
    else:
        content = named["logprobs"]["content"]
        assert [e["token"] for e in content] == [f"token_id:{t}" for t in named["token_ids"]]
        assert [e["bytes"] for e in content] == [e["bytes"] for e in plain["logprobs"]["content"]]
        assert all(top["token"].startswith("token_id:") for e in content for top in e["top_logprobs"])
    bad = http.post(path, json={**body, "return_tokens_as_token_ids": "yes"})
    assert bad.status_code == 400 and "return_tokens_as_token_ids" in bad.json()["error"]["message"]


def test_chat_with_n_seeded_choices_gives_different_reproducible_answers(http):
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "n": 3, "max_tokens": 8,
            "temperature": 1.0, "seed": 11}
    first = http.post("/v1/chat/completions", json=body).json()["choices"]
    again = http.post("/v1/chat/completions", json=body).json()["choices"]
    texts = [c["message"]["content"] for c in first]
    assert [c["index"] for c in first] == [0, 1, 2] and len(set(texts)) == 3  # seeds 11, 12, 13
    assert [c["message"]["content"] for c in again] == texts
    streamed = _sse(http.post("/v1/chat/completions", json={**body, "stream": True}))
    roles = [e["choices"][0]["delta"].get("role") for e in streamed]
    assert roles.count("assistant") == 3  # the first chunk of each choice names the role
    by_choice = ["".join(e["choices"][0]["delta"].get("content", "") for e in streamed
                         if e["choices"][0]["index"] == i) for i in range(3)]
    assert by_choice == texts


def test_logit_bias_and_allowed_token_ids_steer_greedy_output_as_transformers_does(http, default_mesh, hf_model):
    from transformers import LogitsProcessor, LogitsProcessorList

    class OnlyAllowed(LogitsProcessor):  # vLLM's allowed_token_ids, which transformers does not have
        def __init__(self, allowed):
            self.allowed = torch.tensor(allowed)

        def __call__(self, input_ids, scores):
            keep = torch.full_like(scores, float("-inf"))
            keep[:, self.allowed] = 0
            return scores + keep

    eos = hf_model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])

    def hf(prompt, **kwargs):
        with torch.no_grad():
            ids = hf_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0,
                                    **kwargs)[0, len(prompt):].tolist()
        return ids[: next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))]  # up to EOS, as the mesh

    prompt = random_prompts([29], seed=21)[0]
    first = hf(prompt)[0]
    # Ban the token greedy decoding would pick first, favour another; and, separately, allow only a few.
    bias = {first: -100.0, 123: 4.0}
    allowed = [5, 77, 123, 900, 2048]
    want_bias = hf(prompt, sequence_bias=[[[t], b] for t, b in bias.items()])
    want_allowed = hf(prompt, logits_processor=LogitsProcessorList([OnlyAllowed(allowed)]))
    assert first not in want_bias and set(want_allowed) <= set(allowed)
    base = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    got = http.post("/v1/completions", json={**base, "logit_bias": {str(t): b for t, b in bias.items()}}).json()
    assert got["choices"][0]["token_ids"] == want_bias
    got = http.post("/v1/completions", json={**base, "allowed_token_ids": allowed}).json()
    assert got["choices"][0]["token_ids"] == want_allowed
    # Streamed, in a chat, and through the SDK (gRPC) the same constraints hold.
    events = _sse(http.post("/v1/completions", json={**base, "stream": True, "allowed_token_ids": allowed}))
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == want_allowed
    chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
                                                   "temperature": 0.8, "seed": 3, "allowed_token_ids": allowed,
                                                   "return_token_ids": True}).json()
    assert set(chat["choices"][0]["token_ids"]) <= set(allowed)
    with Client(default_mesh.grpc_address) as client:
        out = client.generate(prompt, max_tokens=8, temperature=0, logit_bias=bias)
        assert out.token_ids == want_bias
        sampled = client.generate(prompt, max_tokens=8, temperature=1.0, seed=1, allowed_token_ids=allowed)
        assert set(sampled.token_ids) <= set(allowed)


def test_bad_words_keep_words_out_of_greedy_output_as_transformers_bans_their_tokens(http, default_mesh, hf_model,
                                                                                    tiny_model_dir):
    from services.engine.bad_words import bad_words_token_ids

    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    prompt = random_prompts([29], seed=21)[0]

    def hf(words=()):
        bad = {"bad_words_ids": [list(w) for w in bad_words_token_ids(tokenizer, words)]} if words else {}
        with torch.no_grad():
            return hf_model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0,
                                     **bad)[0, len(prompt):].tolist()

    def mesh(words):
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                "bad_words": words}
        return http.post("/v1/completions", json=body).json()["choices"][0]["token_ids"]

    # The first word the model would write, and then a two-token word it writes next (banned only after its
    # first token, which is still written).
    first = tokenizer.decode(hf()[:1]).strip()
    out = hf([first])
    pair = tokenizer.decode(out[:2])
    assert tokenizer.encode(pair, add_special_tokens=False).ids == out[:2] and pair == pair.strip()
    assert out[0] != hf()[0] and mesh([first]) == out
    both = hf([first, pair])
    assert both[0] == out[0] and both[1] != out[1] and mesh([first, pair]) == both
    with Client(default_mesh.grpc_address) as client:
        assert client.generate(prompt, max_tokens=12, temperature=0, ignore_eos=True, bad_words=[first, pair]
                               ).token_ids == both


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["ok", "color", "n"], "additionalProperties": False}


def test_structured_output_matches_transformers_under_the_same_grammar(http, default_mesh, hf_model, tiny_model_dir):
    """The default mesh is disaggregated: the prefill worker's matcher picks the first token, the decode worker's
    catches up on it and goes on."""
    from transformers import LogitsProcessor, LogitsProcessorList

    from services.engine.checkpoint import load_checkpoint_meta
    from services.engine.grammar import GrammarCompiler

    checkpoint = load_checkpoint_meta(tiny_model_dir)
    compiler = GrammarCompiler(checkpoint.tokenizer, checkpoint.config.vocab_size, checkpoint.eos_token_ids)

    class Grammar(LogitsProcessor):  # the same llguidance grammar in front of transformers' greedy search
        def __init__(self, structured, prompt_len):
            self.matcher, self.prompt_len = compiler.matcher(structured), prompt_len

        def __call__(self, input_ids, scores):
            (mask,) = compiler.masks([self.matcher], [input_ids[0, self.prompt_len:].tolist()])
            t = torch.arange(scores.shape[1])
            return scores.masked_fill(((mask[0][t // 32] >> (t % 32)) & 1) == 0, float("-inf"))

    def hf(prompt, structured):
        with torch.no_grad():
            ids = hf_model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False, pad_token_id=0,
                                    logits_processor=LogitsProcessorList([Grammar(structured, len(prompt))]))
        return ids[0, len(prompt):].tolist()

    schema_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    for prompt in random_prompts([23, 61], seed=31):
        want = hf(prompt, ("json", json.dumps(SCHEMA)))
        body = {"prompt": prompt, "max_tokens": 60, "temperature": 0, "response_format": schema_format,
                "return_token_ids": True}
        choice = http.post("/v1/completions", json=body).json()["choices"][0]
        assert choice["token_ids"] == want and choice["finish_reason"] == "stop"
        value = json.loads(choice["text"])  # valid JSON of the schema, checked without llguidance
        assert set(value) == {"ok", "color", "n"} and isinstance(value["ok"], bool)
        assert value["color"] in ("red", "green", "blue") and 0 <= value["n"] <= 999
        streamed = _sse(http.post("/v1/completions", json={**body, "stream": True}))
        assert [t for e in streamed for t in e["choices"][0]["token_ids"]] == want
    # vLLM's spellings, a chat, sampling and the SDK.
    prompt = random_prompts([17], seed=32)[0]
    regex = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 30, "temperature": 0.9, "seed": 4,
                                               "guided_regex": "[0-9]{3}-[a-z]{2,4}"}).json()["choices"][0]
    assert re.fullmatch("[0-9]{3}-[a-z]{2,4}", regex["text"]) and regex["finish_reason"] == "stop"
    chat = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Pick one"}], "max_tokens": 20, "temperature": 1.0, "seed": 5,
        "n": 3, "structured_outputs": {"choice": ["alpha", "beta gamma", "delta"]}}).json()
    assert {c["message"]["content"] for c in chat["choices"]} <= {"alpha", "beta gamma", "delta"}
    with Client(default_mesh.grpc_address) as client:
        out = client.generate(prompt, max_tokens=60, temperature=0, structured_output=("json", json.dumps(SCHEMA)))
    assert out.token_ids == hf(prompt, ("json", json.dumps(SCHEMA)))


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Rome", "Lima"]}, "days": {"type": "integer",
                                     "minimum": 1, "maximum": 7}}, "required": ["city", "days"],
    "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {
    "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"], "additionalProperties": False}}}


def test_forced_tool_calls_come_back_as_tool_calls_streamed_or_not(http):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Weather?"}]}]
    named = {"messages": messages, "max_tokens": 40, "temperature": 0, "tools": [WEATHER, CLOCK],
             "tool_choice": {"type": "function", "function": {"name": "weather"}}}
    reply = http.post("/v1/chat/completions", json=named).json()["choices"][0]
    assert reply["finish_reason"] == "tool_calls" and reply["message"]["content"] is None
    (call,) = reply["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "weather" and call["id"].startswith("call_")
    assert args["city"] in ("Oslo", "Rome", "Lima") and 1 <= args["days"] <= 7 and set(args) == {"city", "days"}
    # Streamed: the id and name first, then the arguments piece by piece (never an empty piece), which add up to
    # the same call.
    events = _sse(http.post("/v1/chat/completions", json={**named, "stream": True}))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[0]["role"] == "assistant" and deltas[0]["tool_calls"][0]["function"]["name"] == "weather"
    pieces = [d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d]
    assert "".join(pieces) == call["function"]["arguments"] and all(pieces)
    assert len(deltas) > 2 and events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # "required": one or more calls, each of a given function with its own arguments; then a tool result turn.
    required = {**named, "tool_choice": "required", "max_tokens": 80}
    reply = http.post("/v1/chat/completions", json=required).json()["choices"][0]
    calls = reply["message"]["tool_calls"]
    assert reply["finish_reason"] == "tool_calls" and calls
    for c in calls:
        arguments = json.loads(c["function"]["arguments"])
        assert c["function"]["name"] in ("weather", "clock")
        assert set(arguments) == ({"city", "days"} if c["function"]["name"] == "weather" else {"utc"})
    events = _sse(http.post("/v1/chat/completions", json={**required, "stream": True}))
    streamed = [d for e in events if e["choices"] for d in e["choices"][0]["delta"].get("tool_calls", [])]
    assert [c["function"] for c in streamed] == [c["function"] for c in calls]  # greedy: the same calls
    turn = messages + [{"role": "assistant", "content": None, "tool_calls": calls}] + [
        {"role": "tool", "tool_call_id": c["id"], "content": "sunny, 21 C"} for c in calls]
    answer = http.post("/v1/chat/completions", json={"messages": turn, "max_tokens": 5, "tools": [WEATHER, CLOCK],
                                                     "tool_choice": "none"}).json()["choices"][0]
    assert answer["message"]["content"] and "tool_calls" not in answer["message"]
    # A named call cut short by max_tokens is the call as far as it was written, finish_reason "length": what its
    # stream sends, piece by piece (as vLLM answers both); "required" cut short is the text it got to.
    cut = http.post("/v1/chat/completions", json={**named, "max_tokens": 3}).json()["choices"][0]
    (partial,) = cut["message"]["tool_calls"]
    assert cut["finish_reason"] == "length" and partial["function"]["arguments"].startswith("{")
    events = _sse(http.post("/v1/chat/completions", json={**named, "max_tokens": 3, "stream": True}))
    pieces = [d["tool_calls"][0]["function"]["arguments"] for e in events if e["choices"]
              for d in [e["choices"][0]["delta"]] if "tool_calls" in d]
    assert "".join(pieces) == partial["function"]["arguments"] and events[-1]["choices"][0]["finish_reason"] == "length"
    cut = http.post("/v1/chat/completions", json={**required, "max_tokens": 3}).json()["choices"][0]
    assert cut["finish_reason"] == "length" and cut["message"]["content"].startswith("[")


def test_special_tokens_are_left_out_of_the_text_unless_asked_for(http, default_mesh):
    # logit_bias makes the model say its end-of-turn token (id 5) twice; ignore_eos keeps it going.
    body = {"prompt": [7, 8, 9], "max_tokens": 2, "temperature": 0, "ignore_eos": True, "logit_bias": {"5": 100},
            "return_token_ids": True}
    default = http.post("/v1/completions", json=body).json()["choices"][0]
    kept = http.post("/v1/completions", json={**body, "skip_special_tokens": False}).json()["choices"][0]
    assert default["token_ids"] == kept["token_ids"] == [5, 5]
    assert default["text"] == "" and kept["text"] == "<|eot_id|><|eot_id|>"
    with Client(default_mesh.grpc_address) as client:
        out = client.generate([7, 8, 9], max_tokens=2, temperature=0, ignore_eos=True, logit_bias={5: 100.0},
                              skip_special_tokens=False)
    assert out.text == "<|eot_id|><|eot_id|>"


def test_tokenize_and_detokenize_round_trip_and_count_what_a_chat_would_send(http):
    tokens = http.post("/tokenize", json={"prompt": "The quick brown fox"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 4096
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"] == "The quick brown fox"
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
    counted = http.post("/tokenize", json=chat).json()["count"]
    assert http.post("/v1/chat/completions", json=chat).json()["usage"]["prompt_tokens"] == counted
    for path, body, fragment in [("/tokenize", {"prompt": 5}, 'send "prompt" (a string) or chat "messages"'),
                                 ("/detokenize", {"tokens": [1, 99999]}, "token id 99999 is outside"),
                                 ("/detokenize", {"tokens": "abc"}, "tokens must be a list of token ids")]:
        response = http.post(path, json=body)
        assert response.status_code == 400 and fragment in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def hermes_http(tiny_model_dir, tmp_path_factory):
    """A colocated mesh that reads tool calls in the Hermes syntax (tool_choice "auto") and thinking in Qwen3's.
    Its structured outputs apply from the first token, thought included, so that a choice can make the built-in
    model write what a Qwen3 model would."""
    from tests.e2e.conftest import start_mesh

    mesh = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("hermes"), mode="colocated",
                      scheduler_args=["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
                                      "--structured-output-in-reasoning"])
    with httpx.Client(base_url=mesh.http_url, timeout=60) as client:
        yield client
    mesh.stop()


def test_auto_tool_calls_are_read_in_the_models_own_syntax(hermes_http):
    """The built-in model has no tool-call habits: a structured output makes it write exactly what a Hermes-style
    model would, and the API must turn that into text plus tool_calls."""
    reply = 'Let me check.<tool_call>{"name": "weather", "arguments": {"city": "Oslo", "days": 2}}</tool_call>'
    body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 80, "temperature": 0,
            "tools": [WEATHER, CLOCK], "structured_outputs": {"choice": [reply]}}
    choice = hermes_http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me check."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "weather" and json.loads(call["function"]["arguments"]) == {
        "city": "Oslo", "days": 2}
    events = _sse(hermes_http.post("/v1/chat/completions", json={**body, "stream": True}))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Let me check."
    streamed = [c for d in deltas for c in d.get("tool_calls", [])]
    # the name once, then the arguments piece by piece as the model writes them, joining to the whole call's
    assert streamed[0]["function"]["name"] == "weather" and streamed[0]["id"].startswith("call_")
    assert len(streamed) > 3 and all(c["index"] == 0 and "name" not in c["function"] for c in streamed[1:])
    assert "".join(c["function"]["arguments"] for c in streamed) == call["function"]["arguments"]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # A reply without a call is text (a mesh without a parser refuses "auto": test_chat_features_... above).
    plain = hermes_http.post("/v1/chat/completions", json={**body, "structured_outputs": {"choice": ["Sunny."]}})
    assert plain.json()["choices"][0]["message"] == {"role": "assistant", "content": "Sunny."}
    assert plain.json()["choices"][0]["finish_reason"] == "stop"


def test_thinking_comes_back_as_reasoning_and_tool_calls_are_read_from_the_answer(hermes_http):
    """As above, a structured output makes the built-in model write what a Qwen3 model would."""
    call = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo", "days": 2}}</tool_call>'
    reply = "<think>\nThe user wants Oslo.\n</think>\n\nLet me check." + call
    body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 100, "temperature": 0,
            "tools": [WEATHER, CLOCK], "structured_outputs": {"choice": [reply]}}
    message = hermes_http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    # The answer as written after </think>, streamed or not (vLLM's parsers keep it so too).
    assert message["reasoning_content"] == "\nThe user wants Oslo.\n" and message["content"] == "\n\nLet me check."
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["weather"]
    events = _sse(hermes_http.post("/v1/chat/completions", json={**body, "stream": True}))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert len([d for d in deltas if d.get("reasoning_content")]) > 1  # streamed as it was written
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    streamed = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [c["function"]["name"] for c in streamed if "id" in c] == ["weather"]
    assert json.loads("".join(c["function"]["arguments"] for c in streamed)) == {"city": "Oslo", "days": 2}
    plain = hermes_http.post("/v1/chat/completions", json={**body, "tools": None, "structured_outputs": {
        "choice": ["<think>Sunny, surely.</think>Sunny."]}}).json()["choices"][0]
    assert plain["message"] == {"role": "assistant", "content": "Sunny.", "reasoning_content": "Sunny, surely."}
    # usage counts the thought's tokens, through the one that closes it
    thought_tokens = hermes_http.post("/tokenize", json={"prompt": "<think>Sunny, surely.</think>"}).json()["count"]
    usage = hermes_http.post("/v1/chat/completions", json={**body, "tools": None, "structured_outputs": {
        "choice": ["<think>Sunny, surely.</think>Sunny."]}}).json()["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": thought_tokens}
    assert usage["completion_tokens"] > thought_tokens
    response = hermes_http.post("/v1/responses", json={
        "input": "Weather in Oslo?", "max_output_tokens": 100, "temperature": 0, "tools": [
            {"type": "function", **WEATHER["function"]}], "structured_outputs": {"choice": [reply]}}).json()
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["reasoning", "message", "function_call"], response
    assert response["output"][0]["content"][0]["text"] == "\nThe user wants Oslo.\n"
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == hermes_http.post("/tokenize", json={
        "prompt": "<think>\nThe user wants Oslo.\n</think>"}).json()["count"]


def test_a_reasoning_model_thinks_freely_before_its_structured_answer(tiny_model_dir, tmp_path):
    """With a reasoning parser a structured output (or a forced call) is the answer's: the thought before it is
    free text. The built-in model never closes its thought, so within max_tokens all of it is thinking, where
    the format would otherwise have forced JSON from the first token (the grammar's own tests in
    tests/engine/test_grammar.py follow a thought to its end)."""
    from tests.e2e.conftest import start_mesh

    mesh = start_mesh(tiny_model_dir, tmp_path, mode="colocated", scheduler_args=["--reasoning-parser", "deepseek_r1"])
    try:
        with httpx.Client(base_url=mesh.http_url, timeout=60) as client:
            body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 12,
                    "temperature": 0, "response_format": {"type": "json_object"}}
            choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
            assert choice["finish_reason"] == "length" and not choice["message"]["content"]
            thought = choice["message"]["reasoning_content"]
            assert thought and not thought.lstrip().startswith("{")
            usage = client.post("/v1/chat/completions", json=body).json()["usage"]
            assert usage["completion_tokens_details"]["reasoning_tokens"] == usage["completion_tokens"] == 12
            forced = client.post("/v1/chat/completions", json={**body, "response_format": None, "tools": [WEATHER],
                                                                "tool_choice": "required"}).json()["choices"][0]
            assert forced["message"]["reasoning_content"] == thought  # the same free thought, greedy
            assert not forced["message"].get("tool_calls")
    finally:
        mesh.stop()


def test_reasoning_effort_reaches_the_chat_template(tiny_model_dir, tmp_path):
    """As in gpt-oss's template, a chat template may read ``reasoning_effort``: the chat API's field and the
    Responses API's ``reasoning.effort`` both reach it (a copy of the built-in model with such a template)."""
    import shutil

    from tests.e2e.conftest import start_mesh

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}\n{% endif %}"
                               + config["chat_template"])
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    mesh = start_mesh(model, tmp_path / "logs", mode="colocated")
    try:
        with httpx.Client(base_url=mesh.http_url, timeout=60) as client:
            messages = [{"role": "user", "content": "Hi"}]
            plain = client.post("/tokenize", json={"messages": messages}).json()["count"]
            high = client.post("/tokenize", json={"messages": messages, "reasoning_effort": "high"}).json()
            assert high["count"] > plain
            text = client.post("/detokenize", json={"tokens": high["tokens"]}).json()["prompt"]
            assert text.startswith("Reasoning: high\n")
            chat = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2,
                                                              "reasoning_effort": "high"}).json()
            assert chat["usage"]["prompt_tokens"] == high["count"]
            reply = client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2,
                                                       "reasoning": {"effort": "high", "summary": "auto"}}).json()
            assert reply["usage"]["input_tokens"] == high["count"]
            bad = client.post("/v1/chat/completions", json={"messages": messages, "reasoning_effort": "max"})
            assert bad.status_code == 400 and "reasoning_effort must be one of" in bad.json()["error"]["message"]
    finally:
        mesh.stop()


def test_the_clients_request_id_names_the_request_and_its_reply(http, default_mesh):
    # vLLM's X-Request-Id: the client's id is the reply's (header and body), and the mesh's, so that a stream
    # can be aborted by it from elsewhere (gRPC Abort), and found in the logs and traces.
    reply = http.post("/v1/completions", headers={"X-Request-Id": "batch-7/item 3"},
                      json={"prompt": "Hi", "max_tokens": 2})
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "batch-7/item 3"
    assert reply.json()["id"] == "cmpl-batch-7/item 3"
    plain = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert plain.json()["id"] == f"chatcmpl-{plain.headers['x-request-id']}"  # a new one when none is sent
    body = {"prompt": random_prompts([20])[0], "max_tokens": 3000, "ignore_eos": True, "stream": True, "n": 2}
    with Client(default_mesh.grpc_address) as client:
        with http.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": "long"}) as stream:
            assert stream.headers["x-request-id"] == "long"
            twice = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "n": 2},
                              headers={"X-Request-Id": "long"})
            assert twice.status_code == 400 and "already in use" in twice.json()["error"]["message"]
            assert client.abort("long-0") and client.abort("long-1")  # choice K of several is ID-K
            events = [json.loads(line[6:]) for line in stream.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
    assert {e["choices"][0]["finish_reason"] for e in events if e["choices"][0]["finish_reason"]} == {"abort"}
    bad = http.post("/v1/completions", json={"prompt": "Hi"}, headers={"X-Request-Id": "x" * 257})
    assert bad.status_code == 400 and "X-Request-Id must be 1 to 256 printable" in bad.json()["error"]["message"]
    # The Responses and Messages APIs name theirs by it too (resp_ID, msg_ID), streamed or not.
    response = http.post("/v1/responses", headers={"X-Request-Id": "r-1"}, json={"input": "Hi", "max_output_tokens": 2})
    assert response.headers["x-request-id"] == "r-1" and response.json()["id"] == "resp_r-1"
    assert http.get("/v1/responses/resp_r-1").json()["id"] == "resp_r-1"  # stored under it
    queued = http.post("/v1/responses", headers={"X-Request-Id": "r-3"},
                       json={"input": "Hi", "max_output_tokens": 2, "background": True})
    assert queued.headers["x-request-id"] == "r-3" and queued.json()["id"] == "resp_r-3"
    message = {"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    reply = http.post("/v1/messages", headers={"X-Request-Id": "m-1"}, json=message)
    assert reply.headers["x-request-id"] == "m-1" and reply.json()["id"] == "msg_m-1"
    with http.stream("POST", "/v1/messages", headers={"X-Request-Id": "m-2"}, json={**message, "stream": True}) as s:
        assert s.headers["x-request-id"] == "m-2" and any('"id": "msg_m-2"' in line or '"id":"msg_m-2"' in line
                                                          for line in s.iter_lines())
    with http.stream("POST", "/v1/responses", headers={"X-Request-Id": "r-2"},
                     json={"input": "Hi", "max_output_tokens": 2, "stream": True}) as s:
        assert s.headers["x-request-id"] == "r-2" and any("resp_r-2" in line for line in s.iter_lines())
    bad = http.post("/v1/messages", json=message, headers={"X-Request-Id": "x" * 300})
    assert bad.status_code == 400 and "X-Request-Id must be" in bad.text


def test_a_chat_continues_the_final_message_as_transformers_renders_it(http, hf_greedy, tiny_model_dir):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "My answer is "}]
    want = tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=True, return_dict=False)
    body = {"messages": messages, "continue_final_message": True, "max_tokens": 8, "temperature": 0,
            "return_token_ids": True}
    assert http.post("/tokenize", json={"messages": messages, "continue_final_message": True}).json()["tokens"] == want
    reply = http.post("/v1/chat/completions", json=body).json()
    assert reply["choices"][0]["token_ids"] == hf_greedy(want, 8) and reply["usage"]["prompt_tokens"] == len(want)
    # Without it, the assistant's message is a finished turn and a new one opens.
    closed = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    assert closed == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    for extra, fragment in [({"add_generation_prompt": True}, "cannot both be true"),
                            ({"continue_final_message": "yes"}, "continue_final_message must be true or false"),
                            ({"chat_template_kwargs": {"messages": []}}, "cannot hold messages")]:
        response = http.post("/v1/chat/completions", json={**body, **extra})
        assert response.status_code == 400 and fragment in response.json()["error"]["message"], extra
    # Template variables the server sets may be overridden (they were a 500: passed twice to the template).
    kwargs = {"bos_token": "", "add_generation_prompt": False}
    got = http.post("/tokenize", json={"messages": messages, "chat_template_kwargs": kwargs}).json()["tokens"]
    assert got == tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(http, hf_greedy, tiny_model_dir):
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    prompt = random_prompts([40], seed=31)[0]
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "return_token_ids": True, "echo": True,
            "truncate_prompt_tokens": 10}
    reply = http.post("/v1/completions", json=body).json()
    choice = reply["choices"][0]
    assert reply["usage"]["prompt_tokens"] == 10 and choice["token_ids"] == hf_greedy(prompt[-10:], 6)
    assert choice["text"].startswith(tokenizer.decode(prompt[-10:], skip_special_tokens=False))  # what ran
    text = http.post("/v1/completions", json={"prompt": "one two three four five six seven", "max_tokens": 1,
                                               "truncate_prompt_tokens": 3}).json()
    chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hello there"}],
                                                    "max_tokens": 1, "truncate_prompt_tokens": 4}).json()
    whole = http.post("/v1/completions", json={**body, "truncate_prompt_tokens": -1}).json()  # the context: all
    assert (text["usage"]["prompt_tokens"], chat["usage"]["prompt_tokens"], whole["usage"]["prompt_tokens"]) == (
        3, 4, 40)
    for bad in (0, -2, "5", 2.5):
        response = http.post("/v1/completions", json={**body, "truncate_prompt_tokens": bad})
        assert response.status_code == 400 and "truncate_prompt_tokens must be" in response.json()["error"]["message"]


def test_text_parts_give_the_same_chat_as_a_string(http):
    body = {"max_tokens": 6, "temperature": 0, "return_token_ids": True}
    whole = http.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "Hi\nthere"}]})
    parts = http.post("/v1/chat/completions", json={**body, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]})
    assert parts.json()["choices"][0]["token_ids"] == whole.json()["choices"][0]["token_ids"]
    image = http.post("/v1/chat/completions", json={**body, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})
    assert image.status_code == 400 and "only text parts" in image.json()["error"]["message"]


def test_a_structured_output_that_cannot_be_compiled_is_400_with_the_reason(http, default_mesh):
    for body, fragment in [({"guided_regex": "[a-"}, "unclosed character class"),
                           ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
                            "structured output (json) is not usable"),
                           ({"guided_grammar": "start: undefined_rule"}, "undefined_rule")]:
        response = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, **body})
        assert response.status_code == 400 and fragment in response.json()["error"]["message"], body
    with Client(default_mesh.grpc_address) as client, pytest.raises(InvalidArgument, match="unclosed character"):
        client.generate("hi", max_tokens=4, structured_output=("regex", "[a-"))


def test_constraints_that_leave_no_token_end_the_request_with_a_400_that_says_so(http, default_mesh, tiny_model_dir):
    """Contradictions only sampling finds: allowed_token_ids the grammar never allows (the first token, on the
    prefill worker), or only end tokens while min_tokens holds them back; and "a" then the end the grammar
    wants, which allowed_token_ids rules out (the second token, on the decode worker)."""
    (a,) = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).encode("a").ids
    base = {"prompt": "hi", "max_tokens": 8, "temperature": 0, "allowed_token_ids": [a]}
    first = "no token satisfies the structured output (regex) and allowed_token_ids (1 tokens) at output token 1"
    later = first.replace("token 1", "token 2")
    for body, fragment in [({**base, "guided_regex": "b"}, first), ({**base, "guided_regex": "a"}, later),
                           ({**base, "allowed_token_ids": [1, 5], "min_tokens": 2},
                            "allowed_token_ids (2 tokens) and min_tokens (2: no end-of-sequence or stop token yet)")]:
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_argument"
        assert fragment in response.json()["error"]["message"]
    # Streamed: the tokens before it, then the error as an event (which OpenAI's clients raise).
    events = _sse(http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "stream": True, "return_token_ids": True,
        **{k: v for k, v in base.items() if k != "prompt"}, "guided_regex": "a"}))
    assert [t for e in events[:-1] for t in e["choices"][0]["token_ids"]] == [a]
    assert events[-2]["choices"][0]["finish_reason"] == "error" and later in events[-1]["error"]["message"]
    # One failed choice ends the stream of them all: the other ("the" goes on with "bbb...") is aborted, not
    # left running its 3000 tokens (over 10 s here).
    (b,) = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).encode("b").ids
    events = _sse(http.post("/v1/completions", json={"prompt": ["hi", "the"], "max_tokens": 3000, "stream": True,
                                                     "temperature": 0, "allowed_token_ids": [a, b],
                                                     "guided_regex": "a|b+"}))
    assert later.replace("(1 tokens)", "(2 tokens)") in events[-1]["error"]["message"]
    with Client(default_mesh.grpc_address) as client:
        deadline = time.monotonic() + 3
        while client.stats().num_running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.stats().num_running == 0
    reply = http.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 8, "temperature": 0,
                                             "allowed_token_ids": [a], "guided_regex": "a"}).json()
    assert reply["status"] == "failed" and reply["error"]["code"] == "invalid_prompt"
    assert later in reply["error"]["message"]
    with Client(default_mesh.grpc_address) as client:
        out = client.generate("hi", max_tokens=8, temperature=0, allowed_token_ids=[a], structured_output=("regex", "a"))
        assert (out.token_ids, out.finish_reason) == ([a], "error") and later in out.finish_detail
        stats = client.stats()
        assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)


@pytest.mark.parametrize("body, fragment", [
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens must be"),
    ({"prompt": "hi", "temprature": 0.5}, "unknown field 'temprature'"),
    ({"prompt": [1, 99999]}, "outside the vocabulary"),
    ({"prompt": [7] * 5000}, "shorten the prompt"),
    ({"prompt": {"text": "hi"}}, "prompt must be a string or a list of token ids"),
    ({"prompt": ["hi", {"text": "hi"}]}, "prompt must be a string or a list of token ids"),
    ({"prompt": ["hi", [1, 99999]]}, "prompt[1]: prompt token id 99999 is outside the vocabulary"),
    ({"prompt": "hi", "n": 0}, "n must be an integer >= 1"),
    ({"prompt": "hi", "n": 2000}, "a batch of 2000 requests can never fit the queue (1024 places"),
    # Refused before its choices are built: the scheduler once spent minutes (and GBs) building 2**40 of them.
    ({"prompt": ["a", "b"], "n": 2**40}, "a batch of 2199023255552 requests can never fit the queue"),
    ({"prompt": "hi", "best_of": 2}, "best_of must be 1"),
    ({"prompt": "hi", "echo": "yes"}, "echo must be true or false"),
    ({"prompt": "hi", "logit_bias": {"4096": 5}}, "logit_bias names token id 4096, outside the vocabulary"),
    ({"prompt": "hi", "logit_bias": {"5": 150}}, "logit_bias[5] must be in [-100.0, 100.0]"),
    ({"prompt": "hi", "allowed_token_ids": [3, 5000]}, "allowed_token_ids has token id 5000, outside"),
    # Past the contract's uint32: queued, it stopped the scheduler when its plan was converted.
    ({"prompt": "hi", "top_k": 2**40}, "top_k must be an integer <= 4294967295"),
    # A number streamed (truthy), and stream_options that were no object then failed the stream: a 500.
    ({"prompt": "hi", "stream": 1e308, "stream_options": 1}, "stream must be true or false"),
    ({"prompt": "hi", "stream": True, "stream_options": 1}, "stream_options must be an object"),
    ({"prompt": "hi", "return_token_ids": "yes"}, "return_token_ids must be true or false"),
])
def test_bad_completion_requests_get_400_with_a_message_that_says_what_to_fix(http, body, fragment):
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]
    assert response.json()["error"]["code"] == "invalid_argument"
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize("extra, fragment", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "start the mesh with --tool-call-parser"),
    ({"tool_choice": "required"}, "needs tools"),
])
def test_chat_features_not_implemented_are_refused_not_ignored(http, extra, fragment):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and fragment in response.json()["error"]["message"]
    plain = {**body, "response_format": {"type": "text"}, "tools": [], "tool_choice": "none"}
    assert http.post("/v1/chat/completions", json=plain).status_code == 200


def test_malformed_json_and_bad_chat_messages_get_400(http):
    assert http.post("/v1/completions", content=b"{not json").status_code == 400
    response = http.post("/v1/chat/completions", json={"messages": [{"role": "user"}]})
    assert response.status_code == 400 and "messages[0]" in response.json()["error"]["message"]
    # Python's json reads these; echoed back in the response's metadata they made a 500 after the request ran.
    response = http.post("/v1/responses", content=b'{"input": "Hi", "max_output_tokens": 2, "metadata": {"a": Infinity}}')
    assert response.status_code == 400 and "Infinity is not a JSON number" in response.json()["error"]["message"]
    # Chat's logprobs is a switch (top_logprobs says how many); a number used to mean true.
    response = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "logprobs": 5})
    assert response.status_code == 400 and "logprobs must be true or false" in response.json()["error"]["message"]


def _scrape(mesh) -> dict[str, dict]:
    """Each service's metric families by name."""
    from prometheus_client.parser import text_string_to_metric_families

    return {name: {f.name: f for f in text_string_to_metric_families(httpx.get(url, timeout=10).text)}
            for name, url in mesh.metrics_urls.items()}


def _total(families: dict, name: str, suffix: str = "_total") -> float:
    return sum(s.value for s in families[name].samples if s.name.endswith(suffix))


def test_every_service_serves_prometheus_metrics_a_scraper_can_parse(http, default_mesh):
    before = _scrape(default_mesh)["scheduler"]
    http.post("/v1/completions", json={"prompt": random_prompts([40], seed=8)[0], "max_tokens": 5, "ignore_eos": True})
    http.post("/v1/completions", json={"prompt": random_prompts([40], seed=9)[0], "max_tokens": 5, "priority": -2,
                                       "ignore_eos": True})
    families = _scrape(default_mesh)
    sched = families["scheduler"]
    # vLLM's throughput counters and per-request lengths: these two requests' 80 prompt and 10 output tokens.
    for name, suffix, grew in (("seawall_prompt_tokens", "_total", 80), ("seawall_generation_tokens", "_total", 10),
                               ("seawall_request_prompt_tokens", "_sum", 80),
                               ("seawall_request_generation_tokens", "_sum", 10),
                               ("seawall_request_generation_tokens", "_count", 2)):
        assert _total(sched, name, suffix) - _total(before, name, suffix) == grew, name
    for name in ("seawall_request_ttft_seconds", "seawall_request_tbt_seconds", "seawall_request_e2e_seconds",
                 "seawall_step_seconds", "seawall_kv_blocks", "seawall_requests", "seawall_queue_length",
                 "seawall_preemptions", "seawall_kv_transfer_bytes"):
        assert name in sched, name
    counts = {(f, s.labels.get("priority_class")): s.value for f in ("ttft", "e2e", "queue")
              for s in sched[f"seawall_request_{f}_seconds"].samples if s.name.endswith("_count")}
    for f in ("ttft", "e2e", "queue"):  # each request's latencies under its priority's class
        assert counts[(f, "normal")] >= 1 and counts[(f, "high")] >= 1, counts
    moved = sum(s.value for s in sched["seawall_kv_transfer_bytes"].samples if s.name.endswith("_total"))
    assert moved > 0  # the disaggregated hand-off pulled KV
    for worker in ("prefill-0", "decode-1"):
        assert "seawall_step_seconds" in families[worker] and "seawall_forward_seconds" in families[worker]
        (pool,) = families[worker]["seawall_kv_cache_info"].samples  # the pool as vLLM's cache_config_info shows it
        assert pool.labels["dtype"] == "float32" and pool.labels["block_size"] == "16" and pool.value == 1
        assert int(pool.labels["bytes_per_block"]) > 0 and int(pool.labels["num_device_blocks"]) > 0
    pulled = [s for s in families["decode-1"]["seawall_kv_transfer_bytes"].samples if s.name.endswith("_total")]
    assert any(s.labels["path"] == "nixl" and s.value > 0 for s in pulled)
    for name, fams in families.items():
        # Start-up objects are out of the collector's reach (a full collection walked them all: ~100 ms stalls).
        frozen = fams["seawall_gc_frozen_objects"].samples[0].value
        assert frozen > 10_000, (name, frozen)
        assert "seawall_gc_pause_seconds" in fams, name


def test_prompt_chunks_are_sent_without_waiting_for_the_previous_chunks_result(http, default_mesh, hf_greedy):
    # 300 tokens at chunk 64: chunks 1-4 sample nothing, so chunks 2-5 go out while the one before still runs.
    prompt = random_prompts([300], seed=21)[0]
    before = default_mesh.counter("seawall_steps_pipelined")
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["token_ids"] == hf_greedy(prompt, 6)
    assert default_mesh.counter("seawall_steps_pipelined") - before >= 3


def test_only_requests_with_the_same_cache_salt_share_cached_kv(http, default_mesh):
    prompt = list(range(300, 380))  # 80 tokens: 4 full blocks a later request can take from the cache

    def cached(**extra) -> int:
        r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0, **extra})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-b") == 0  # the same prompt, another tenant: nothing to learn from timing
    assert cached() == 0
    assert cached(cache_salt="tenant-a") == 64
    assert cached() == 64
    for bad in ("", 5):
        r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "cache_salt": bad})
        assert r.status_code == 400 and "cache_salt must be a non-empty string" in r.json()["error"]["message"]


@pytest.mark.anyio
async def test_the_sdk_sends_a_cache_salt(default_mesh):
    from seawall import AsyncClient

    prompt = list(range(400, 470))
    async with AsyncClient(default_mesh.grpc_address) as client:
        first = await client.generate(prompt, max_tokens=2, cache_salt="s")
        salted = await client.generate(prompt, max_tokens=2, cache_salt="s")
        plain = await client.generate(prompt, max_tokens=2)
    assert (first.cached_prompt_tokens, salted.cached_prompt_tokens, plain.cached_prompt_tokens) == (0, 64, 0)


def test_the_scheduler_serves_without_torch(http, default_mesh):
    """After chat, structured outputs and completions above: the scheduler process never loaded torch (it reads
    the checkpoint's config and tokenizer and compiles grammars; tensors are the workers'), so it starts in
    under a second of imports and holds no torch heap."""
    reply = http.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2,
                                               "response_format": {"type": "json_object"}})
    assert reply.status_code == 200, reply.text
    (scheduler,) = [c for c in default_mesh.children if c.name == "scheduler"]
    maps = Path(f"/proc/{scheduler.proc.pid}/maps").read_text()
    assert "libtorch" not in maps


def test_special_tokens_are_added_once_as_vllm_adds_them(tiny_model_dir, tmp_path, hf_greedy):
    """A copy of the built-in model whose tokenizer adds a BOS, as Llama's does: a completion's text prompt gets
    it (unless ``add_special_tokens`` is false), a chat prompt only the one its template writes (unless true)."""
    import shutil

    from tests.bos_tokenizer import add_bos_to_every_text

    transformers = pytest.importorskip("transformers")
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    bos = add_bos_to_every_text(model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    messages = [{"role": "user", "content": "Name a colour."}]
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    text_ids = tokenizer("Name a colour.").input_ids
    assert chat_ids.count(bos) == 1 and text_ids[0] == bos
    mesh = start_mesh(model, tmp_path / "logs", mode="colocated")
    try:
        with httpx.Client(base_url=mesh.http_url, timeout=60) as client:
            def tokens(body):
                return client.post("/tokenize", json=body).json()["tokens"]

            assert tokens({"messages": messages}) == chat_ids
            assert tokens({"messages": messages, "add_special_tokens": True}) == [bos, *chat_ids]
            assert tokens({"prompt": "Name a colour."}) == text_ids
            assert tokens({"prompt": "Name a colour.", "add_special_tokens": False}) == text_ids[1:]
            chat = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4,
                                                              "temperature": 0, "return_token_ids": True}).json()
            assert chat["usage"]["prompt_tokens"] == len(chat_ids)
            assert chat["choices"][0]["token_ids"] == hf_greedy(chat_ids, 4)
            for special, want in ((None, text_ids), (False, text_ids[1:])):
                body = {"prompt": "Name a colour.", "max_tokens": 4, "temperature": 0, "return_token_ids": True,
                        **({} if special is None else {"add_special_tokens": special})}
                reply = client.post("/v1/completions", json=body).json()
                assert reply["usage"]["prompt_tokens"] == len(want)
                assert reply["choices"][0]["token_ids"] == hf_greedy(want, 4)
            usage = client.post("/v1/messages", json={"messages": messages, "max_tokens": 2}).json()["usage"]
            assert usage["input_tokens"] + usage["cache_read_input_tokens"] == len(chat_ids)  # Anthropic's split
    finally:
        mesh.stop()


def test_the_server_and_a_trusted_request_may_bring_their_own_chat_template(tiny_model_dir, tmp_path, hf_greedy):
    # vLLM's --chat-template (a file here) and --trust-request-chat-template.
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    messages = [{"role": "user", "content": "Name a colour."}]
    want = tokenizer.encode("user: Name a colour.\nassistant:", add_special_tokens=False).ids
    mesh = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated",
                      scheduler_args=["--chat-template", str(template), "--trust-request-chat-template"])
    try:
        with httpx.Client(base_url=mesh.http_url, timeout=60) as client:
            assert client.post("/tokenize", json={"messages": messages}).json()["tokens"] == want
            chat = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0,
                                                              "return_token_ids": True}).json()
            assert chat["usage"]["prompt_tokens"] == len(want)
            assert chat["choices"][0]["token_ids"] == hf_greedy(want, 4)
            reply = client.post("/v1/responses", json={"input": "Name a colour.", "max_output_tokens": 2}).json()
            assert reply["usage"]["input_tokens"] == len(want)
            own = client.post("/tokenize", json={"messages": messages, "chat_template": "<{{ messages[0].content }}>"})
            assert own.json()["tokens"] == tokenizer.encode("<Name a colour.>", add_special_tokens=False).ids
            bad = client.post("/v1/chat/completions", json={"messages": messages, "chat_template": "{% if %}"})
            assert bad.status_code == 400 and "chat_template does not compile" in bad.json()["error"]["message"]
    finally:
        mesh.stop()


def test_requests_that_leave_sampling_out_take_the_models_generation_config(tiny_model_dir, tmp_path):
    """vLLM's --generation-config auto: the model's generation_config.json (here top_k 1, greedy, and
    max_new_tokens 5) fills what a request leaves out, in every API; a beam search takes none of it."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "top_k": 1, "max_new_tokens": 5}))
    mesh = start_mesh(model, tmp_path / "logs", mode="colocated")
    prompt = random_prompts([30], seed=51)[0]
    try:
        with httpx.Client(base_url=mesh.http_url, timeout=60) as client:
            def completion(**body):
                reply = client.post("/v1/completions", json={"prompt": prompt, "ignore_eos": True, **body}).json()
                return reply["choices"][0]["token_ids"]

            greedy = completion(temperature=0, max_tokens=8, return_token_ids=True)
            assert completion(seed=5, return_token_ids=True) == greedy[:5]
            assert len(completion(max_tokens=8, return_token_ids=True)) == 8  # its own max_tokens
            messages = [{"role": "user", "content": "Hi"}]
            chat = client.post("/v1/chat/completions", json={"messages": messages, "ignore_eos": True}).json()
            assert chat["usage"]["completion_tokens"] == 5
            reply = client.post("/v1/responses", json={"input": "Hi"}).json()
            assert reply["usage"]["output_tokens"] == 5
            beams = client.post("/v1/completions", json={"prompt": prompt, "use_beam_search": True, "n": 2,
                                                         "max_tokens": 3})
            assert beams.status_code == 200 and len(beams.json()["choices"]) == 2
        # gRPC: a field left unset takes the model's; one set, even to its "off" value, keeps it.
        with Client(mesh.grpc_address) as sdk:
            assert sdk.generate(prompt, seed=5, max_tokens=8, ignore_eos=True).token_ids == greedy
            sampled = sdk.generate(prompt, seed=5, max_tokens=8, ignore_eos=True, top_k=0).token_ids
            assert sampled != greedy
            assert len(sdk.beam_search(prompt, 2, max_tokens=3)) == 2
        with grpc.insecure_channel(mesh.grpc_address) as channel:
            request = scheduler_pb2.GenerateRequest(request_id="unset", token_ids=scheduler_pb2.TokenIds(ids=prompt),
                                                    sampling=common_pb2.SamplingParams(seed=5, ignore_eos=True),
                                                    final_only=True)
            (reply,) = scheduler_pb2_grpc.SchedulerStub(channel).Generate(request, timeout=60)
            assert list(reply.token_ids) == greedy[:5]  # max_tokens 0: the config's max_new_tokens
    finally:
        mesh.stop()


def test_a_chat_without_a_limit_generates_to_the_end_of_the_context(tiny_model_dir, tmp_path):
    # OpenAI's chat and Responses APIs set no default limit; vLLM's is what the context leaves, as here (a
    # 96-token context keeps it short). Completions keep OpenAI's 16.
    mesh = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated", scheduler_args=["--max-model-len", "96"],
                      worker_args=["--max-model-len", "96"])
    try:
        with httpx.Client(base_url=mesh.http_url, timeout=60) as client:
            chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                              "ignore_eos": True}).json()
            assert chat["usage"]["total_tokens"] == 96 and chat["choices"][0]["finish_reason"] == "length"
            reply = client.post("/v1/responses", json={"input": "Hi", "ignore_eos": True}).json()
            assert reply["usage"]["total_tokens"] == 96
            text = client.post("/v1/completions", json={"prompt": "Hi", "ignore_eos": True}).json()
            assert text["usage"]["completion_tokens"] == 16
    finally:
        mesh.stop()
