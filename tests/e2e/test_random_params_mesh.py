"""Random mixes of sampling options through the live mesh (disaggregated: a prefill worker samples the first token,
the decode worker the rest, with the penalties, bad words, grammar and logprobs carried across the hand-off)
give what the in-process engine gives for the same requests: the same tokens, text and finish for greedy and
seeded ones, the same logprobs, and an error for the same contradictions."""

from __future__ import annotations

import dataclasses
import random

import anyio
import pytest

from seawall import AsyncClient
from seawall.offline.engine import OfflineEngine
from services.common.errors import SeawallError
from services.engine.config import EngineConfig
from tests.seawall.offline.test_random_params import _params

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]


async def test_random_option_mixes_through_the_mesh_match_the_in_process_engine(default_mesh, tiny_model_dir):
    engine = OfflineEngine(EngineConfig(model=str(tiny_model_dir)))
    vocab = engine.checkpoint.config.vocab_size
    rng = random.Random(7)
    batch = []
    while len(batch) < 24:
        prompt, params = [rng.randrange(6, vocab) for _ in range(rng.choice([1, 3, 20, 70, 150]))], _params(rng, vocab)
        try:
            engine.validate(prompt, params)
        except SeawallError:
            continue
        batch.append((prompt, params))
    want = engine.generate([p for p, _ in batch], [params for _, params in batch])
    got = [None] * len(batch)
    async with AsyncClient(default_mesh.grpc_address) as client:
        async def one(i: int) -> None:
            prompt, params = batch[i]
            got[i] = await client.generate(prompt, **{f.name: getattr(params, f.name)
                                                      for f in dataclasses.fields(params)})

        async with anyio.create_task_group() as tg:
            for i in range(len(batch)):
                tg.start_soon(one, i)
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
