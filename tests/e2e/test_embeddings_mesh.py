"""``/v1/embeddings`` through the live mesh, driven by the official ``openai`` client: an embedding checkpoint as
Qwen3-Embedding ships it (saved from the base model: no output head) served by the default disaggregated
topology (the prompts run on the prefill worker, none is handed off), each vector equal to transformers' last
hidden state, normalized; text and token-id inputs, base64, ``dimensions``; generation from it refused; and
every block freed after."""

from __future__ import annotations

import base64
import re
import struct

import httpx
import openai
import pytest
import torch

from seawall import Client
from services.common.errors import InvalidArgument
from services.engine.model_config import ModelConfig
from tests.e2e.conftest import random_prompts, start_mesh
from tests.engine.test_embeddings import CONFIG, _save

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.timeout(300)]

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("embedding-model")
    model = transformers.AutoModel.from_config(transformers.Qwen3Config(**CONFIG, tie_word_embeddings=False))
    return out, _save(model, out, tiny_model_dir)


@pytest.fixture(scope="module")
def mesh(checkpoint, tmp_path_factory):
    m = start_mesh(checkpoint[0], tmp_path_factory.mktemp("logs"), scheduler_args=["--chunk-size", "16"])
    yield m
    assert all(code == 0 for code in m.stop().values())


def _want(model, prompt: list[int], dims: int | None = None) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(torch.tensor([prompt])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden[:dims], dim=-1)


def test_embeddings_of_text_and_token_ids_match_transformers(mesh, checkpoint):
    path, model = checkpoint
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    texts = ["Bursts of long prompts", "stall decodes in a prefill-first scheduler"]
    ids = random_prompts([5, 40, 70], seed=31)
    with openai.OpenAI(base_url=f"{mesh.http_url}/v1", api_key="unused", max_retries=0) as client:
        model_id = client.models.list().data[0].id
        by_text = client.embeddings.create(model=model_id, input=texts)
        by_ids = client.embeddings.create(model=model_id, input=ids, dimensions=24, encoding_format="base64",
                                          extra_body={"priority": -1})
        with pytest.raises(openai.BadRequestError, match="an embedding model .* not generation"):
            client.completions.create(model=model_id, prompt="hi", max_tokens=4)
        with pytest.raises(openai.BadRequestError, match="dimensions must be an integer from 1 to the model's 64"):
            client.embeddings.create(model=model_id, input="hi", dimensions=65)
    assert [d.index for d in by_text.data] == [0, 1]
    encoded = [tokenizer(t)["input_ids"] for t in texts]
    assert by_text.usage.prompt_tokens == sum(map(len, encoded))
    for item, prompt in zip(by_text.data, encoded, strict=True):
        assert torch.tensor(item.embedding) == pytest.approx(_want(model, prompt), abs=1e-5)
    for item, prompt in zip(by_ids.data, ids, strict=True):
        vector = item.embedding  # the client decodes base64 into floats unless asked for the raw string
        if isinstance(vector, str):
            vector = list(struct.unpack("<24f", base64.b64decode(vector)))
        assert len(vector) == 24 and torch.tensor(vector) == pytest.approx(_want(model, prompt, 24), abs=1e-5)
    with Client(mesh.grpc_address) as client:
        stats = client.stats()
    assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)


def test_embed_over_grpc_matches_transformers_and_generate_is_refused(mesh, checkpoint):
    """The SDK's Embed call: the same vectors as the HTTP API's; a generation request to an embedding model,
    and Generate asked to pool, are refused with what to call instead."""
    path, model = checkpoint
    ids = random_prompts([3, 33], seed=32)
    with Client(mesh.grpc_address) as client:
        vectors = client.embed(ids)
        short = client.embed(ids[0], dimensions=8)
        with pytest.raises(InvalidArgument, match="an embedding model .* not generation"):
            client.generate([5, 6, 7], max_tokens=2)
        with pytest.raises(InvalidArgument, match="inputs\\[1\\]: .*outside the vocabulary"):
            client.embed([[5], [10**6]])
        with pytest.raises(InvalidArgument, match="dimensions must be an integer from 1 to the model's 64"):
            client.embed("hi", dimensions=65)
    for vector, prompt in zip(vectors, ids, strict=True):
        assert len(vector) == 64 and torch.tensor(vector) == pytest.approx(_want(model, prompt), abs=1e-5)
    assert len(short) == 1 and torch.tensor(short[0]) == pytest.approx(_want(model, ids[0], 8), abs=1e-5)


def test_generate_asked_to_pool_is_told_to_call_embed(default_mesh):
    with Client(default_mesh.grpc_address) as client:
        with pytest.raises(InvalidArgument, match="sampling.pooling asks for an embedding: call Embed"):
            client.generate([5, 6, 7], max_tokens=1, pooling=True)
        assert len(client.embed("the built-in model embeds too")[0]) > 0


def test_bad_embedding_requests_get_400_naming_the_field(default_mesh, tiny_model_dir):
    """And a generative model (the built-in one) embeds too: its last hidden state, normalized."""
    url = f"{default_mesh.http_url}/v1/embeddings"
    cases = [({"input": []}, "input must be a string"), ({"input": [[1, 2], 7]}, r"input\[1\] must be a string"),
             ({"input": "x", "encoding_format": "int8"}, "encoding_format must be one of float, base64"),
             ({"input": "x", "truncate_prompt_tokens": 4}, "unknown or unsupported fields: truncate_prompt_tokens"),
             ({"input": [[5, 10**9]]}, "outside the vocabulary")]
    for body, message in cases:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400 and re.search(message, r.json()["error"]["message"]), body
    ok = httpx.post(url, json={"input": "the built-in model embeds too"}, timeout=30).json()
    vector = ok["data"][0]["embedding"]
    assert len(vector) == ModelConfig.from_dir(tiny_model_dir).hidden_size
    assert sum(v * v for v in vector) == pytest.approx(1.0, abs=1e-5)


def test_score_and_rerank_are_the_cosines_of_transformers_embeddings(mesh, checkpoint):
    """vLLM's /score (one text against several, and pairwise) and /rerank (best first, top_n, documents as
    strings or objects) from the embedding model: each score the cosine of transformers' two vectors."""
    path, model = checkpoint
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))

    def cosine(a: str, b: str) -> float:
        va, vb = (_want(model, tokenizer(t)["input_ids"]) for t in (a, b))
        return float(torch.dot(va, vb))

    query, docs = "bursty traffic", ["long prompts arrive together", "decode steps stall", "a quiet night"]
    one = httpx.post(f"{mesh.http_url}/score", json={"text_1": query, "text_2": docs}, timeout=60).json()
    assert [d["index"] for d in one["data"]] == [0, 1, 2]
    assert [d["score"] for d in one["data"]] == pytest.approx([cosine(query, d) for d in docs], abs=1e-5)
    pairwise = httpx.post(f"{mesh.http_url}/v1/score", json={"text_1": docs[:2], "text_2": docs[1:]}, timeout=60)
    assert [d["score"] for d in pairwise.json()["data"]] == pytest.approx(
        [cosine(docs[0], docs[1]), cosine(docs[1], docs[2])], abs=1e-5)
    ranked = httpx.post(f"{mesh.http_url}/v1/rerank", json={
        "query": query, "documents": [docs[0], {"text": docs[1]}, docs[2]], "top_n": 2}, timeout=60).json()
    want = sorted(range(3), key=lambda i: -cosine(query, docs[i]))[:2]
    assert [r["index"] for r in ranked["results"]] == want
    assert [r["document"]["text"] for r in ranked["results"]] == [docs[i] for i in want]
    assert [r["relevance_score"] for r in ranked["results"]] == pytest.approx([cosine(query, docs[i]) for i in want],
                                                                              abs=1e-5)
    for url, body, message in [
            ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1 must be one text or as many"),
            ("/rerank", {"query": "q", "documents": []}, "documents must be a non-empty list"),
            ("/rerank", {"query": "q", "documents": "one string"}, "documents must be a non-empty list"),
            ("/rerank", {"query": "q", "documents": 5}, "documents must be a non-empty list"),
            ("/rerank", {"query": "q", "documents": ["d", {"text": 5}]}, "documents[1] must be a string"),
            ("/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, "top_n must be an integer >= 1"),
            ("/v2/rerank", {"query": "q", "documents": ["d"], "max_chunks_per_doc": 2}, "unknown or unsupported")]:
        r = httpx.post(f"{mesh.http_url}{url}", json=body, timeout=30)
        assert r.status_code == 400 and message in r.json()["error"]["message"], (url, body)
