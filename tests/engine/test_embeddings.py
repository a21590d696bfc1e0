"""Embedding requests (SamplingParams.pooling) through the engine against transformers on the same weights: the
last prompt token's final hidden state, normalized as the checkpoint says; checkpoints saved from a base model
(no output head, names without ``model.``) serve embeddings only."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.errors import InvalidArgument
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.engine.loader import iter_weights
from services.scheduler.core.scheduler import SchedulerConfig

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")

CONFIG = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
LENGTHS = (1, 9, 16, 40, 130)


def _save(model, out, tiny_model_dir):
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.2) if "norm" in name else p.normal_(0.0, 0.3)
    model.eval().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    return model


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("qwen3-lm")
    model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(**CONFIG))
    return out, _save(model, out, tiny_model_dir).model  # its base model gives the hidden states


@pytest.fixture(scope="module")
def base_model(tmp_path_factory, tiny_model_dir):
    """An embedding checkpoint as Qwen3-Embedding ships: saved from the base model, no lm_head."""
    out = tmp_path_factory.mktemp("qwen3-embedding")
    model = transformers.AutoModel.from_config(transformers.Qwen3Config(**CONFIG, tie_word_embeddings=False))
    return out, _save(model, out, tiny_model_dir)


def _prompts():
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, 4096, (n,), generator=g).tolist() for n in LENGTHS]


def _reference(model, prompts, normalize=True):
    with torch.no_grad():
        out = [model(torch.tensor([p])).last_hidden_state[0, -1] for p in prompts]
    return [torch.nn.functional.normalize(h, dim=-1) if normalize else h for h in out]


def _engine(path, cpu_kernels=True, chunk_size=7):
    return OfflineEngine(EngineConfig(model=str(path), dtype="float32", cpu_kernels=cpu_kernels),
                         SchedulerConfig(chunk_size=chunk_size))


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
@pytest.mark.parametrize("chunk_size", [7, 512])
def test_embeddings_match_transformers_last_hidden_state(causal_lm, cpu_kernels, chunk_size):
    path, model = causal_lm
    prompts = _prompts()
    got = _engine(path, cpu_kernels, chunk_size).embed(prompts)
    for vector, want in zip(got, _reference(model, prompts), strict=True):
        assert torch.tensor(vector) == pytest.approx(want, abs=1e-5)
        assert sum(v * v for v in vector) == pytest.approx(1.0, abs=1e-5)


def test_a_cached_prefix_gives_the_same_embedding_and_generation_runs_beside(causal_lm):
    """The same prompts again hit the prefix cache (their last token still runs); embeddings and generations in
    one batch do not disturb each other."""
    path, model = causal_lm
    engine, prompts = _engine(path), _prompts()
    first = engine.embed(prompts)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    alone = engine.generate(prompts[-1:], [greedy])[0].token_ids
    from services.engine.pooling import EMBEDDING_PARAMS

    mixed = engine.generate(prompts + prompts[-1:], [EMBEDDING_PARAMS] * len(prompts) + [greedy])
    assert sum(c.num_cached_prompt_tokens for c in mixed) > 0
    assert mixed[-1].token_ids == alone
    again = [torch.nn.functional.normalize(torch.tensor(c.hidden_state), dim=-1) for c in mixed[:-1]]
    for vector, want in zip(again, first, strict=True):
        assert vector == pytest.approx(torch.tensor(want), abs=1e-5)
    assert engine.embed(prompts[:1], dimensions=8)[0] == pytest.approx(
        torch.nn.functional.normalize(torch.tensor(first[0][:8]) * 1.0, dim=-1).tolist(), abs=1e-5)


def test_a_base_model_checkpoint_serves_embeddings_only(base_model):
    path, model = base_model
    assert not any(name.startswith(("model.", "lm_head")) for name, _ in iter_weights(path))
    engine, prompts = _engine(path), _prompts()
    assert not engine.checkpoint.has_lm_head and engine.runner.model.lm_head is None
    for vector, want in zip(engine.embed(prompts), _reference(model, prompts), strict=True):
        assert torch.tensor(vector) == pytest.approx(want, abs=1e-5)
    with pytest.raises(InvalidArgument, match="an embedding model .* not generation"):
        engine.validate(prompts[0], SamplingParams(max_tokens=4))


def test_sentence_transformers_pooling_is_followed(base_model, tmp_path, tiny_model_dir):
    """modules.json without Normalize: raw hidden states; a pooling other than the last token's: refused."""
    path, model = base_model
    shutil.copytree(path, tmp_path / "st")
    (tmp_path / "st" / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "st" / "1_Pooling").mkdir()
    pooling = tmp_path / "st" / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"word_embedding_dimension": 64, "pooling_mode_lasttoken": True}))
    engine, prompts = _engine(tmp_path / "st"), _prompts()[:2]
    for vector, want in zip(engine.embed(prompts), _reference(model, prompts, normalize=False), strict=True):
        assert torch.tensor(vector) == pytest.approx(want, abs=1e-4)
    pooling.write_text(json.dumps({"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}))
    engine = _engine(tmp_path / "st")
    with pytest.raises(InvalidArgument, match="pools by mean_tokens .* last-token pooling is supported"):
        engine.validate_embedding(prompts[0])
    with pytest.raises(InvalidArgument, match="dimensions must be an integer from 1 to the model's 64"):
        _engine(path).validate_embedding(prompts[0], dimensions=65)
