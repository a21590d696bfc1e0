"""Sequence classifiers through the live mesh's HTTP API: ``/classify`` (vLLM's) gives each input's classes as
transformers' ``...ForSequenceClassification`` scores them; a one-class classifier (a cross-encoder reranker)
answers ``/score`` and ``/rerank`` with its score of each (query, document) pair, tokenized as transformers'
``tokenizer(query, document)``; what such a model cannot do is refused saying so."""

from __future__ import annotations

import grpc
import httpx
import pytest
import torch
from tokenizers import Tokenizer, processors

from seawall import Client
from seawall.client import build_embed
from services.common.errors import InvalidArgument
from tests.e2e.conftest import random_prompts, start_mesh
from tests.engine.test_classifier import write_classifier
from tests.lora_adapters import make_classifier_adapter, peft_classifier

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.timeout(300)]

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def three_classes(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("classifier")
    model = write_classifier(out, tiny_model_dir, 3)
    mesh = start_mesh(out, tmp_path_factory.mktemp("logs"),
                      scheduler_args=["--chunk-size", "16", "--allow-runtime-lora-updating"])
    yield mesh, model, out
    assert all(code == 0 for code in mesh.stop().values())


@pytest.fixture(scope="module")
def cross_encoder(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("reranker")
    model = write_classifier(out, tiny_model_dir, 1, transformers.Qwen3Config)
    # A pair template, as cross-encoders' tokenizers have one: the pair must be joined by it, not as one text.
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    tokenizer.post_processor = processors.Sequence([tokenizer.post_processor, processors.TemplateProcessing(
        single="$A", pair="$A <|end_of_text|> $B:1", special_tokens=[("<|end_of_text|>", 1)])])
    tokenizer.save(str(out / "tokenizer.json"))
    mesh = start_mesh(out, tmp_path_factory.mktemp("logs"), mode="colocated")
    yield mesh, model, out
    assert all(code == 0 for code in mesh.stop().values())


def _post(mesh, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{mesh.http_url}{path}", json=body, timeout=60)


def test_classify_returns_each_input_s_classes_as_transformers_scores_them(three_classes):
    mesh, model, path = three_classes
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    texts = ["Bursts of long prompts", "stall every decode"]
    ids = random_prompts([7, 40], seed=3)
    out = _post(mesh, "/classify", {"model": "", "input": texts + ids})
    assert out.status_code == 200, out.text
    data = out.json()["data"]
    prompts = [tokenizer(t)["input_ids"] for t in texts] + ids
    with torch.no_grad():
        want = [model(torch.tensor([p])).logits[0] for p in prompts]
    for row, ref in zip(data, want, strict=True):
        assert torch.tensor(row["logits"]) == pytest.approx(ref, rel=1e-4, abs=1e-4)
        assert torch.tensor(row["probs"]) == pytest.approx(torch.softmax(ref, -1), abs=1e-4)
        assert row["label"] == f"class-{int(ref.argmax())}" and row["num_classes"] == 3
    assert [row["index"] for row in data] == [0, 1, 2, 3]
    assert out.json()["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_an_adapter_trained_to_classify_scores_with_its_own_head(three_classes, tmp_path):
    # Loaded at run time; its requests run on the prefill worker (disaggregated), with the base model's.
    pytest.importorskip("peft")
    mesh, model, path = three_classes
    adapter = make_classifier_adapter(path, tmp_path / "adapter", seed=4)
    loaded = _post(mesh, "/v1/load_lora_adapter", {"lora_name": "tuned", "lora_path": str(adapter)})
    assert loaded.status_code == 200, loaded.text
    ids = random_prompts([7, 40, 19], seed=6)
    with httpx.Client(base_url=mesh.http_url, timeout=60) as http:
        tuned, plain = (http.post("/classify", json={"model": name, "input": ids}) for name in ("tuned", ""))
    oracle = peft_classifier(path, adapter)
    with torch.no_grad():
        for got, run in ((tuned, oracle), (plain, model)):
            assert got.status_code == 200, got.text
            for row, p in zip(got.json()["data"], ids, strict=True):
                assert torch.tensor(row["logits"]) == pytest.approx(run(torch.tensor([p])).logits[0], rel=1e-4,
                                                                    abs=1e-4)


def test_the_sdk_classifies_over_grpc_as_the_http_api_does(three_classes, default_mesh):
    mesh, _, _ = three_classes
    inputs = ["a burst", random_prompts([12], seed=8)[0]]
    http = _post(mesh, "/classify", {"model": "", "input": inputs}).json()["data"]
    with Client(mesh.grpc_address) as sdk:
        got = sdk.classify(inputs, priority=-1)
        with pytest.raises(grpc.RpcError) as refused:  # the SDK never sends dimensions with classify
            sdk._stub.Classify(build_embed("x", None, 3, 0))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "leave it 0" in refused.value.details()
    assert [c.label for c in got] == [row["label"] for row in http]
    for c, row in zip(got, http, strict=True):  # float32 on the wire
        assert c.logits == pytest.approx(row["logits"], abs=1e-6) and c.probs == pytest.approx(row["probs"], abs=1e-6)
    with Client(default_mesh.grpc_address) as sdk, pytest.raises(InvalidArgument, match="not a sequence classifier"):
        sdk.classify("x")


def test_what_a_classifier_cannot_do_is_refused_saying_so(three_classes):
    mesh, _, _ = three_classes
    embed = _post(mesh, "/v1/embeddings", {"model": "", "input": "x"})
    assert embed.status_code == 400 and "/classify" in embed.json()["error"]["message"]
    generate = _post(mesh, "/v1/completions", {"model": "", "prompt": "x", "max_tokens": 2})
    assert generate.status_code == 400 and "no output head" in generate.json()["error"]["message"]
    pairs = _post(mesh, "/score", {"model": "", "text_1": "q", "text_2": ["a", "b"]})
    assert pairs.status_code == 400 and "3 classes" in pairs.json()["error"]["message"]
    assert _post(mesh, "/classify", {"model": "", "input": []}).status_code == 400


def test_a_cross_encoder_scores_and_reranks_pairs_as_transformers(cross_encoder):
    mesh, model, path = cross_encoder
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    query, docs = "where do bursts come from", ["agents retrying", "a quiet night", "long prompts at once"]
    assert 1 in tokenizer(query, docs[0])["input_ids"]  # the template's separator
    with torch.no_grad():
        want = [torch.sigmoid(model(**tokenizer(query, d, return_tensors="pt")).logits[0, 0]).item() for d in docs]
    scored = _post(mesh, "/score", {"model": "", "text_1": query, "text_2": docs})
    assert scored.status_code == 200, scored.text
    assert [d["score"] for d in scored.json()["data"]] == pytest.approx(want, abs=1e-4)
    ranked = _post(mesh, "/rerank", {"model": "", "query": query, "documents": docs, "top_n": 2})
    results = ranked.json()["results"]
    order = sorted(range(3), key=lambda i: -want[i])[:2]
    assert [r["index"] for r in results] == order
    assert [r["relevance_score"] for r in results] == pytest.approx([want[i] for i in order], abs=1e-4)
    classes = _post(mesh, "/v1/classify", {"model": "", "input": "x"}).json()["data"][0]
    assert classes["num_classes"] == 1 and classes["label"] == "class-0"
