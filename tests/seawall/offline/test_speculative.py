"""Speculative decoding through the scheduler core and the model runner (``num_speculative_tokens``).

Any drafts must give the output the engine gives without them: only drafts the sampler agrees with are kept.
So the tests feed drafts whose fate they know: the true continuation, each token corrupted with some
probability, so that steps keep all, some or none of their drafts. Greedy output must then equal
``transformers`` token for token, under several policies and with preemptions; any mix of options must give
the tokens, logprobs and errors of the same engine without drafts. And the n-gram drafter itself, on a model
whose greedy output loops, keeps nearly every draft and still equals ``transformers``.
"""

from __future__ import annotations

import random

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.errors import SeawallError
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.engine.inputs import SequenceState
from services.scheduler.core.config import SchedulerConfig
from tests.seawall.offline.test_random_params import _params

transformers = pytest.importorskip("transformers")


def _engine(model_dir, k: int, kv_kib: int = 8192, **sched) -> OfflineEngine:
    return OfflineEngine(EngineConfig(model=str(model_dir), kv_cache_bytes=kv_kib << 10, swap_bytes=4 << 20),
                         SchedulerConfig(num_speculative_tokens=k, **sched))


def _known_drafts(engine: OfflineEngine, truth: dict[tuple[int, ...], list[int]], wrong: float, seed: int = 0):
    """Makes ``engine`` draft the true continuation of each prompt (``truth``), each draft token replaced by
    a random one with probability ``wrong``."""
    vocab = engine.checkpoint.config.vocab_size

    def drafter(seq: SequenceState, k: int) -> list[int]:
        done = len(seq.token_ids) - seq.prompt_len
        rng = random.Random(hash((seed, seq.seq_id, done)))
        true = truth[tuple(seq.token_ids[: seq.prompt_len])][done:done + k]
        return [rng.randrange(vocab) if rng.random() < wrong else t for t in true]

    engine.runner.drafter = drafter


def _hf_greedy(model_dir, prompts: list[list[int]], max_tokens: list[int], eos: set[int]) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt, m in zip(prompts, max_tokens, strict=True):
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=m, do_sample=False,
                                 pad_token_id=0)[0, len(prompt):].tolist()
            out.append(ids[:next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))])
    return out


def _random_prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[i + 6] + [rng.randrange(6, vocab) for _ in range(rng.choice([0, 2, 15, 40, 130]))] for i in range(n)]


@pytest.fixture(scope="module", params=["tiny", "second"])
def oracle(request, tiny_model_dir, second_model_dir):
    model_dir = tiny_model_dir if request.param == "tiny" else second_model_dir
    engine = _engine(model_dir, 0)
    prompts = _random_prompts(engine.checkpoint.config.vocab_size, 10, seed=4)
    max_tokens = [4 + 9 * i for i in range(len(prompts))]
    return model_dir, prompts, max_tokens, _hf_greedy(model_dir, prompts, max_tokens, set(engine.checkpoint.eos_token_ids))


@pytest.mark.oracle
@pytest.mark.parametrize("k, wrong, sched", [
    (4, 0.2, {"chunk_size": 32}),
    (1, 0.5, {"policy": "vllm", "max_num_batched_tokens": 160}),
    (7, 0.1, {"policy": "fastserve", "kv_kib": 512}),  # a small pool: swaps while drafts are verified
    (3, 0.3, {"policy": "sarathi", "kv_kib": 512, "preemption_mode": "recompute", "chunk_size": 16}),
])
def test_greedy_output_with_drafts_kept_or_not_equals_transformers(oracle, k, wrong, sched):
    model_dir, prompts, max_tokens, expected = oracle
    engine = _engine(model_dir, k, **sched)
    _known_drafts(engine, {tuple(p): e for p, e in zip(prompts, expected, strict=True)}, wrong)
    done = engine.generate(prompts, [SamplingParams(max_tokens=m, temperature=0) for m in max_tokens])
    assert [c.token_ids for c in done] == expected
    assert 0 < engine.scheduler.draft_stats.kept < engine.scheduler.draft_stats.drafted  # steps kept drafts, and rejected some


@pytest.mark.oracle
def test_ngram_drafts_on_looping_output_are_kept_and_equal_transformers(looping_model_dir):
    engine = _engine(looping_model_dir, 5)
    prompts = _random_prompts(engine.checkpoint.config.vocab_size, 6, seed=9)
    max_tokens = [60 + 20 * i for i in range(len(prompts))]
    done = engine.generate(prompts, [SamplingParams(max_tokens=m, temperature=0) for m in max_tokens])
    expected = _hf_greedy(looping_model_dir, prompts, max_tokens, set(engine.checkpoint.eos_token_ids))
    assert [c.token_ids for c in done] == expected
    assert engine.scheduler.draft_stats.kept > 0.5 * sum(map(len, expected))


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_any_mix_of_options_gives_what_it_gives_without_drafts(tiny_model_dir, seed):
    rng = random.Random(seed)
    plain = _engine(tiny_model_dir, 0, chunk_size=64)
    vocab = plain.checkpoint.config.vocab_size
    batch = []
    for prompt in _random_prompts(vocab, 40, seed):
        params = _params(rng, vocab)
        if params.temperature and params.seed is None:  # unseeded draws differ run to run, drafts or not
            continue
        try:
            plain.validate(prompt, params)
        except SeawallError:
            continue
        batch.append((prompt, params))
    prompts, params = [b[0] for b in batch], [b[1] for b in batch]
    expected = plain.generate(prompts, params)
    spec = _engine(tiny_model_dir, 4, chunk_size=64)
    _known_drafts(spec, {tuple(p): e.token_ids for p, e in zip(prompts, expected, strict=True)}, 0.2, seed)
    got = spec.generate(prompts, params)
    assert 0 < spec.scheduler.draft_stats.kept < spec.scheduler.draft_stats.drafted
    for p, e, g in zip(params, expected, got, strict=True):
        assert (g.token_ids, g.text, g.finish_reason, str(g.error)) == (e.token_ids, e.text, e.finish_reason,
                                                                        str(e.error)), p
        assert len(g.logprobs) == len(e.logprobs)
        for a, b in zip(g.logprobs, e.logprobs, strict=True):
            assert a.token_id == b.token_id and (a.logprob is None) == (b.logprob is None)
            assert a.logprob is None or abs(a.logprob - b.logprob) < 1e-4
            assert [t for t, _ in a.top_logprobs] == [t for t, _ in b.top_logprobs]
