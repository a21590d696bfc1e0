"""Speculative decoding through the live mesh (``--speculative-tokens``): greedy output equals transformers,
drafts are kept (the scheduler's counters say how many), streams carry several tokens per step, and every
block comes back. Both modes; in the disaggregated one the decode worker speculates after the KV hand-off.

The model is the tiny one without attention output (tests/conftest.py ``looping_model_dir``): its greedy output
soon loops, which n-gram drafts predict. Whether any drafts, kept or not, leave the output unchanged is
tests/seawall/offline/test_speculative.py's subject, with drafts of known fate; here it is the contract and
the mesh: the plan's flag, the result's counts, planning after (never ahead of) a speculative step.
"""

from __future__ import annotations

import anyio
import pytest
import torch

from seawall import AsyncClient
from tests.e2e.conftest import greedy_oracle, random_prompts, start_mesh

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def looping_greedy(looping_model_dir):
    return greedy_oracle(transformers.AutoModelForCausalLM.from_pretrained(looping_model_dir,
                                                                         dtype=torch.float32).eval())


@pytest.fixture(scope="module", params=["colocated", "disaggregated"])
def mesh(request, looping_model_dir, tmp_path_factory):
    m = start_mesh(looping_model_dir, tmp_path_factory.mktemp("logs"), mode=request.param,
                   scheduler_args=["--chunk-size", "64", "--speculative-tokens", "5"])
    yield m
    assert all(code == 0 for code in m.stop().values())


async def test_greedy_output_with_ngram_drafts_matches_transformers(mesh, looping_greedy):
    prompts = random_prompts([3, 20, 64, 150, 7, 33])
    max_tokens = [100 + 30 * i for i in range(len(prompts))]  # loops form within ~30 tokens, drafts follow
    streamed = [[] for _ in prompts]
    async with AsyncClient(mesh.grpc_address) as client:
        async def one(i):
            async for chunk in client.stream(prompts[i], max_tokens=max_tokens[i], temperature=0):
                streamed[i].append(chunk)

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        stats = await client.stats()
    for i, chunks in enumerate(streamed):
        assert [t for c in chunks for t in c.token_ids] == looping_greedy(prompts[i], max_tokens[i]), f"prompt {i}"
    # Kept drafts reach the client with the token after them, in one response.
    assert max(len(c.token_ids) for chunks in streamed for c in chunks) > 1
    total = sum(len(c.token_ids) for chunks in streamed for c in chunks)
    drafts, kept = mesh.counter("seawall_spec_decode_draft_tokens"), mesh.counter("seawall_spec_decode_accepted_tokens")
    assert kept > 0.5 * total and drafts >= kept
    # GetStats tells the same per worker.
    assert sum(w.num_accepted_draft_tokens for w in stats.workers) == kept
    assert sum(w.num_draft_tokens for w in stats.workers) == drafts
    assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)

