"""A conversation's next turn in the disaggregated mesh reads its prefix from the decode worker's prefix cache
(services/scheduler/peer_prefix.py): the prefill worker holds the turn before's prompt, the decode worker also
its outputs; the prefill worker pulls the blocks it lacks from there, computes the rest, and hands the request
back to that decode worker. With and without a kvcache service (which holds nothing of a turn without a
session); greedy output equals transformers', and every block is free afterwards."""

from __future__ import annotations

import httpx
import pytest

from seawall import AsyncClient
from tests.e2e.conftest import random_prompts, start_mesh

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]


@pytest.fixture(scope="module", params=["no-kvcache", "kvcache"])
def mesh(request, tiny_model_dir, tmp_path_factory):
    m = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("logs"), scheduler_args=["--chunk-size", "64"],
                   kvcache_args=[] if request.param == "kvcache" else None)
    yield m
    assert all(code == 0 for code in m.stop().values())


async def test_the_next_turn_reads_the_turn_befores_outputs_from_the_decode_worker(mesh, hf_greedy):
    first_prompt, message = random_prompts([100, 20], seed=61)
    async with AsyncClient(mesh.grpc_address) as client:
        first = await client.generate(first_prompt, max_tokens=32, temperature=0, ignore_eos=True)
        prompt = first_prompt + first.token_ids + message
        chunks = [c async for c in client.stream(prompt, max_tokens=8, temperature=0)]
        stats = await client.stats()
    assert first.token_ids == hf_greedy(first_prompt, 32)
    assert [t for c in chunks for t in c.token_ids] == hf_greedy(prompt, 8)
    # The prefill worker caches the first prompt's 6 full blocks (96 tokens); the decode worker computed 131
    # tokens of the conversation: 8 full blocks, of which the prefill worker pulled the 2 it lacked. Every
    # streamed chunk says so.
    assert {c.cached_prompt_tokens for c in chunks} == {128}
    assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)
    text = httpx.get(mesh.metrics_urls["scheduler"], timeout=10).text
    assert 'seawall_peer_prefix_reads_total{result="done"} 1.0' in text
    assert "seawall_peer_prefix_tokens_total 128.0" in text
    # KV moved: the first turn's 7 blocks to the decode worker, 2 from it, and the turn's 2 new blocks back
    # (the decode worker caches the 8 before them). A block: 4 layers x (K, V) x 16 tokens x 2 heads x 32 x fp32.
    moved = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("seawall_kv_transfer_bytes_total{") and 'status="done"' in line)
    assert moved == (7 + 2 + 2) * 4 * 2 * 16 * 2 * 32 * 4
