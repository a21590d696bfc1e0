"""A float8 KV cache through the live disaggregated mesh (``--kv-cache-dtype fp8`` on every worker): prompts
prefill in chunks on the prefill worker, their float8 blocks move to the decode worker over NIXL (a quarter of
fp32's bytes), a session's turns are stored to kvcache and a next turn loads them. Greedy output equals
transformers' with a cache that rounds keys and values the same way, as in
tests/seawall/offline/test_kv_cache_dtype.py (at most one request parting at a near-tie), and each worker's
pool holds four times the blocks of an fp32 pool of the same bytes; DeepSeek-V3's float8 latents move alike."""

from __future__ import annotations

import pytest

from seawall import AsyncClient
from seawall.v1 import common_pb2
from tests.e2e.conftest import generate_all, greedy_misses, greedy_oracle, random_prompts, start_mesh
from tests.e2e.test_dual_path import _kv_stats

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

transformers = pytest.importorskip("transformers")

KV_BYTES = 4 * 2**20
MAX_TOKENS = 16
NEAR_TIE = 0.05  # logprob gap where the rounding may tip a choice (test_kv_cache_dtype.py)
PROMPTS = random_prompts([3, 17, 33, 64, 150, 260], seed=61)


@pytest.fixture(scope="module")
def oracle(tiny_model_dir):
    """(greedy, misses): transformers with a cache rounding to float8 e4m3, generating, and teacher-forced."""
    import torch

    from tests.kv_fp8_oracle import rounding_cache

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    cache = rounding_cache("fp8")
    return (greedy_oracle(model, cache),
            lambda prompt, output: greedy_misses(model, prompt, output, NEAR_TIE, cache))


@pytest.fixture(scope="module")
def mesh(tiny_model_dir, tmp_path_factory):
    m = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("logs"), scheduler_args=["--chunk-size", "16"],
                   worker_args=["--kv-cache-bytes", str(KV_BYTES), "--kv-cache-dtype", "fp8"], kvcache_args=[])
    yield m
    assert all(code == 0 for code in m.stop().values())


def _assert_agree(oracle, prompts, outputs):
    greedy, misses = oracle
    same = 0
    for prompt, out in zip(prompts, outputs, strict=True):
        same += out == greedy(prompt, MAX_TOKENS)
        assert misses(prompt, out) == [], f"the {len(prompt)}-token prompt chose a token transformers ranks lower"
    assert same >= len(prompts) - 1


async def test_concurrent_requests_equal_transformers_with_a_rounding_cache(mesh, oracle, tiny_model_dir):
    async with AsyncClient(mesh.grpc_address) as client:
        outs = await generate_all(client, PROMPTS, max_tokens=MAX_TOKENS, temperature=0)
        stats = await client.stats()
    _assert_agree(oracle, PROMPTS, [o.token_ids for o in outs])
    assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)
    # 4 layers x (K, V) x 16 tokens x 2 heads x 32 dims x 1 byte: 8 KiB a block (fp32's: 32 KiB).
    assert all(w.num_device_blocks >= KV_BYTES // (8 << 10) - 1 for w in stats.workers)
    assert all(w.kv_layout.dtype == common_pb2.KV_DTYPE_FP8_E4M3 and w.kv_layout.bytes_per_block == 8 << 10
               for w in stats.workers)


async def test_a_session_stores_float8_blocks_and_the_next_turn_loads_them(mesh, oracle):
    first = PROMPTS[4]
    async with AsyncClient(mesh.grpc_address) as client:
        turn1 = await client.generate(first, session_id="s-fp8", max_tokens=MAX_TOKENS, temperature=0)
        second = first + turn1.token_ids + [7, 8, 9]
        turn2 = await client.generate(second, session_id="s-fp8", max_tokens=MAX_TOKENS, temperature=0)
    assert turn2.cached_prompt_tokens >= 160  # turn 1's full blocks at least
    _assert_agree(oracle, [first, second], [turn1.token_ids, turn2.token_ids])
    tiers = _kv_stats(mesh.kvcache_address).tiers
    assert sum(t.num_blocks for t in tiers) >= 10  # 150 + 16 tokens: 10 full blocks stored


async def test_latent_attention_moves_float8_latents_and_equals_transformers(tiny_model_dir, tmp_path):
    """DeepSeek-V3's one latent a token, as float8, prefilled on one worker and decoded on the other."""
    import torch

    from tests.engine.test_architectures import CASES, save_checkpoint
    from tests.kv_fp8_oracle import rounding_cache

    model_dir = tmp_path / "deepseek-v3"
    save_checkpoint(CASES["deepseek-v3"](), model_dir, tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cache = rounding_cache("fp8")
    oracle = (greedy_oracle(model, cache), lambda prompt, output: greedy_misses(model, prompt, output, NEAR_TIE, cache))
    mesh = start_mesh(model_dir, tmp_path / "logs", scheduler_args=["--chunk-size", "16"],
                      worker_args=["--kv-cache-bytes", str(KV_BYTES), "--kv-cache-dtype", "fp8"])
    try:
        prompts = PROMPTS[:4]
        async with AsyncClient(mesh.grpc_address) as client:
            outs = await generate_all(client, prompts, max_tokens=MAX_TOKENS, temperature=0)
        _assert_agree(oracle, prompts, [o.token_ids for o in outs])
    finally:
        assert all(code == 0 for code in mesh.stop().values())
