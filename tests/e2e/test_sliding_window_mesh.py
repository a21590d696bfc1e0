"""A sliding-window model (every layer attending within 40 keys) through the live disaggregated mesh: prompts
run in chunks on the prefill worker, which frees their blocks behind the window as it goes; the decode worker
receives only the blocks still read (NIXL), and decodes on past the window. Greedy output equals
transformers' for every request, and for a context longer than the workers' KV pools, which admission
lets in because its window fits. A session's turn keeps all its blocks, stores them to kvcache, and the next
turn loads its whole prefix."""

from __future__ import annotations

import pytest

from seawall import AsyncClient
from tests.e2e.conftest import generate_all, greedy_oracle, random_prompts, start_mesh
from tests.e2e.test_dual_path import _kv_stats

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

transformers = pytest.importorskip("transformers")

MAX_TOKENS = 24
PROMPTS = random_prompts([5, 39, 41, 100, 200, 300], seed=40)


@pytest.fixture(scope="module")
def greedy(windowed_model_dir):
    import torch

    return greedy_oracle(transformers.AutoModelForCausalLM.from_pretrained(windowed_model_dir,
                                                                           dtype=torch.float32).eval())


@pytest.fixture(scope="module")
def mesh(windowed_model_dir, tmp_path_factory):
    # A small decode pool: blocks freed behind the window are soon another request's.
    m = start_mesh(windowed_model_dir, tmp_path_factory.mktemp("logs"), scheduler_args=["--chunk-size", "16"],
                   worker_args=["--kv-cache-bytes", str(2 * 2**20)], kvcache_args=[])
    yield m
    assert all(code == 0 for code in m.stop().values())


async def test_concurrent_requests_past_the_window_equal_transformers(mesh, greedy):
    async with AsyncClient(mesh.grpc_address) as client:
        outs = await generate_all(client, PROMPTS, max_tokens=MAX_TOKENS, temperature=0)
        stats = await client.stats()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == greedy(prompt, MAX_TOKENS), f"the {len(prompt)}-token prompt diverged"
    assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)


async def test_a_session_past_the_window_stores_its_turns_and_equals_transformers(mesh, greedy):
    first = PROMPTS[3]
    async with AsyncClient(mesh.grpc_address) as client:
        turn1 = await client.generate(first, session_id="s-window", max_tokens=MAX_TOKENS, temperature=0)
        second = first + turn1.token_ids + [7, 8, 9]
        turn2 = await client.generate(second, session_id="s-window", max_tokens=8, temperature=0)
        short = first[:32] + [11, 12]  # turn 1's first blocks
        other = await client.generate(short, max_tokens=8, temperature=0)
    assert turn1.token_ids == greedy(first, MAX_TOKENS)
    assert turn2.token_ids == greedy(second, 8) and turn2.cached_prompt_tokens == 112  # 100 + 24 tokens
    assert other.token_ids == greedy(short, 8) and other.cached_prompt_tokens == 32
    # Turn 1 stored its 7 full blocks (124 tokens computed), its first ones too.
    assert sum(t.num_blocks for t in _kv_stats(mesh.kvcache_address).tiers) >= 7


async def test_a_context_longer_than_the_pool_runs_on_its_window(mesh, greedy):
    """1200 + 20 tokens would need 77 blocks whole; each worker's pool has 64 (2 MiB), its window 5."""
    (prompt,) = random_prompts([1200], seed=41)
    async with AsyncClient(mesh.grpc_address) as client:
        out = await client.generate(prompt, max_tokens=20, temperature=0)
        stats = await client.stats()
    assert all(w.num_device_blocks == 64 - 1 for w in stats.workers)  # block 0 is the null block
    assert out.token_ids == greedy(prompt, 20)
