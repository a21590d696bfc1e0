"""Random mixes of sampling options through the live mesh (disaggregated: a prefill worker samples the first token,
the decode worker the rest, with the penalties, bad words, grammar and logprobs carried across the hand-off)
give what the in-process engine gives for the same requests: the same tokens, text and finish for greedy and
seeded ones, the same logprobs, and an error for the same contradictions. Also with speculative decoding on
(colocated, n-gram drafts verified on the worker) against the same engine without it."""

from __future__ import annotations

import dataclasses
import random

import anyio
import pytest

from seawall import AsyncClient
from seawall.offline.engine import OfflineEngine
from services.common.errors import SeawallError
from services.engine.config import EngineConfig
from tests.e2e.conftest import start_mesh
from tests.seawall.offline.test_random_params import _params

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def speculative_mesh(tiny_model_dir, tmp_path_factory):
    m = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("logs"), mode="colocated", http=False,
                   scheduler_args=["--chunk-size", "64", "--speculative-tokens", "4"])
    yield m
    assert all(code == 0 for code in m.stop().values())


async def test_random_option_mixes_through_the_mesh_match_the_in_process_engine(default_mesh, tiny_model_dir):
    await _mixes_match_the_engine(default_mesh.grpc_address, tiny_model_dir, seed=7)


async def test_with_drafts_they_match_the_engine_without(speculative_mesh, tiny_model_dir):
    stats = await _mixes_match_the_engine(speculative_mesh.grpc_address, tiny_model_dir, seed=8, repeat=True)
    assert sum(w.num_draft_tokens for w in stats.workers) > 0


async def _mixes_match_the_engine(address: str, model_dir, seed: int, repeat: bool = False):
    """``repeat``: prompts that repeat a phrase, so that n-gram lookup finds drafts (the random model's output
    seldom follows them: mostly rejected drafts)."""
    engine = OfflineEngine(EngineConfig(model=str(model_dir)))
    vocab = engine.checkpoint.config.vocab_size
    rng = random.Random(seed)
    batch = []
    while len(batch) < 24:
        prompt = [rng.randrange(6, vocab) for _ in range(rng.choice([1, 3, 20, 70, 150]))]
        if repeat:
            prompt = (prompt[:6] * 30)[:len(prompt)]
        params = _params(rng, vocab)
        try:
            engine.validate(prompt, params)
        except SeawallError:
            continue
        batch.append((prompt, params))
    want = engine.generate([p for p, _ in batch], [params for _, params in batch])
    got = [None] * len(batch)
    async with AsyncClient(address) as client:
        async def one(i: int) -> None:
            prompt, params = batch[i]
            got[i] = await client.generate(prompt, **{f.name: getattr(params, f.name)
                                                      for f in dataclasses.fields(params)})

        async with anyio.create_task_group() as tg:
            for i in range(len(batch)):
                tg.start_soon(one, i)
        stats = await client.stats()
    for (_, params), w, g in zip(batch, want, got, strict=True):
        if w.finish_reason == "error":
            assert g.finish_reason == "error" and g.finish_detail == str(w.error), params
        elif params.temperature == 0 or params.seed is not None:
            assert (g.token_ids, g.text, g.finish_reason) == (w.token_ids, w.text, w.finish_reason), params
            if params.logprobs is not None:
                assert [t.logprob for t in g.logprobs] == pytest.approx([t.logprob for t in w.logprobs], abs=1e-4)
            assert len(g.prompt_logprobs) == len(w.prompt_logprobs)
        else:
            assert g.finish_reason in ("stop", "length") and len(g.token_ids) <= params.max_tokens, params
    return stats
