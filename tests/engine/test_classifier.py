"""Sequence-classification checkpoints (``...ForSequenceClassification``: reward models, classifiers,
cross-encoder rerankers) through the engine: each prompt's class logits equal transformers' (its ``score`` head
on the last token's final hidden state), chunked or not, with and without the fused CPU kernels; the checkpoint
cannot generate, and its labels and activation are read as transformers and vLLM read them."""

from __future__ import annotations

import json

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.errors import InvalidArgument
from services.common.sampling_params import SamplingParams
from services.common.step import LoraRef
from services.engine.checkpoint import load_checkpoint_meta
from services.engine.config import EngineConfig
from services.engine.pooling import EMBEDDING_PARAMS, Classifier
from services.scheduler.core.config import SchedulerConfig
from tests.engine.test_embeddings import CONFIG, _save
from tests.lora_adapters import make_classifier_adapter, peft_classifier

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")


def write_classifier(out, tiny_model_dir, num_labels: int, config=transformers.LlamaConfig, **extra):
    """A random-weight ``...ForSequenceClassification`` checkpoint with the built-in model's tokenizer."""
    labels = {i: f"class-{i}" for i in range(num_labels)}
    cfg = config(**CONFIG, num_labels=num_labels, id2label=labels, label2id={v: k for k, v in labels.items()}, **extra)
    return _save(transformers.AutoModelForSequenceClassification.from_config(cfg), out, tiny_model_dir)


@pytest.fixture(scope="module", params=[(3, transformers.LlamaConfig), (1, transformers.Qwen3Config)],
            ids=["llama-3-classes", "qwen3-1-class"])
def classifier(request, tmp_path_factory, tiny_model_dir):
    num_labels, config = request.param
    out = tmp_path_factory.mktemp("classifier")
    return out, write_classifier(out, tiny_model_dir, num_labels, config)


def _prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (1, 9, 33, 80)]


@pytest.mark.parametrize("cpu_kernels,chunk_size", [(True, 8), (False, 512)], ids=["kernels-chunked", "torch"])
def test_class_logits_match_transformers(classifier, cpu_kernels, chunk_size):
    path, model = classifier
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32", cpu_kernels=cpu_kernels),
                           SchedulerConfig(chunk_size=chunk_size))
    prompts = _prompts()
    got = engine.classify(prompts)
    with torch.no_grad():
        want = [model(torch.tensor([p])).logits[0] for p in prompts]
    for row, ref in zip(got, want, strict=True):
        assert torch.tensor(row) == pytest.approx(ref, rel=1e-4, abs=1e-4)
    with pytest.raises(InvalidArgument, match="no output head"):
        engine.validate(prompts[0], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidArgument, match="sequence classifier"):
        engine.validate_embedding(prompts[0])


def test_labels_and_activation_are_read_as_transformers_names_them(tmp_path, tiny_model_dir):
    write_classifier(tmp_path, tiny_model_dir, 3)
    meta = load_checkpoint_meta(tmp_path)
    assert meta.config.num_labels == 3 and not meta.has_lm_head
    assert meta.classifier == Classifier(("class-0", "class-1", "class-2"), "softmax")
    config = json.loads((tmp_path / "config.json").read_text())
    for problem, activation in (("multi_label_classification", "sigmoid"), ("regression", "identity")):
        (tmp_path / "config.json").write_text(json.dumps({**config, "problem_type": problem}))
        assert load_checkpoint_meta(tmp_path).classifier.activation == activation
    (tmp_path / "config.json").write_text(json.dumps({**config, "id2label": None, "num_labels": 1,
                                                      "problem_type": None}))
    assert load_checkpoint_meta(tmp_path).classifier == Classifier(("LABEL_0",), "sigmoid")


def test_scores_are_softmax_sigmoid_or_the_logits():
    assert Classifier(("a", "b"), "softmax").scores([0.0, 0.0]) == [0.5, 0.5]
    assert Classifier(("a",), "sigmoid").scores([0.0]) == [0.5]
    assert Classifier(("a",), "sigmoid").scores([-800.0])[0] == pytest.approx(0.0)  # no overflow
    assert Classifier(("a", "b"), "identity").scores([1.5, -2.0]) == [1.5, -2.0]
    probs = Classifier(("a", "b", "c"), "softmax").scores([1000.0, 999.0, 0.0])  # no overflow either
    assert sum(probs) == pytest.approx(1.0) and probs[0] > probs[1] > probs[2]


def test_an_adapter_trained_to_classify_scores_with_its_own_head_as_peft_does(classifier, tmp_path):
    # PEFT's task_type SEQ_CLS saves the classifier head whole beside the LoRA weights: the adapter's requests
    # are scored by its head, the base model's by the checkpoint's, in one batch.
    pytest.importorskip("peft")
    path, base = classifier
    ref = LoraRef("tuned", str(make_classifier_adapter(path, tmp_path / "adapter", seed=3)))
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32"), SchedulerConfig(chunk_size=16))
    prompts = _prompts()
    loras = [ref if i % 2 == 0 else None for i in range(len(prompts))]
    got = [c.hidden_state for c in engine.generate(prompts, [EMBEDDING_PARAMS] * len(prompts), loras)]
    oracle = peft_classifier(path, ref.path)
    with torch.no_grad():
        want = [(oracle if lora else base)(torch.tensor([p])).logits[0] for p, lora in zip(prompts, loras, strict=True)]
        without_head = oracle.base_model.model.score.original_module(
            oracle.base_model.model.model(torch.tensor([prompts[0]])).last_hidden_state[0, -1])
    for row, ref_row in zip(got, want, strict=True):
        assert torch.tensor(row) == pytest.approx(ref_row, rel=1e-4, abs=1e-4)
    assert torch.tensor(got[0]) != pytest.approx(without_head, rel=1e-2, abs=1e-2)  # the head made a difference
    assert engine.classify(prompts[:1], lora=ref)[0] == pytest.approx(got[0], rel=1e-4, abs=1e-4)
