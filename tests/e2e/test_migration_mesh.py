"""Live migration through the real mesh: a worker whose long outputs outgrow its KV pool moves a decode, with
its KV, to a peer whose requests ended sooner, instead of preempting; the outputs stay token-identical to
transformers, and no block leaks on either worker.

Two workers of 32 blocks (512 tokens of the built-in model in fp32). Requests arrive one after another, each
once the one before streams, so that token-load placement puts both long outputs on the first worker (the
second holds the first short one's longer prompt when the second long one arrives): 330 + 330 tokens outgrow
the first worker's pool, while the second idles once its short requests ended. Without
migration (``--migration-headroom 0``) the same run preempts, which shows the move is what avoided it.
"""

from __future__ import annotations

import anyio
import pytest

from seawall import AsyncClient
from tests.e2e.conftest import random_prompts, start_mesh

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

# (prompt tokens, max tokens), in arrival order: long, short, long, short.
REQUESTS = [(30, 300), (200, 40), (30, 300), (200, 40)]
POOL_BYTES = 32 * 16 * 2048  # 32 blocks of 16 tokens at 2 KiB a token


async def _run(address, prompts):
    outputs = [None] * len(prompts)
    async with AsyncClient(address) as client:
        async def one(i, placed):
            stream = client.stream(prompts[i], max_tokens=REQUESTS[i][1], temperature=0)
            tokens = []
            async for chunk in stream:
                if not tokens:
                    placed.set()
                tokens.extend(chunk.token_ids)
            outputs[i] = tokens

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):  # each placed (its first token out) before the next arrives
                placed = anyio.Event()
                tg.start_soon(one, i, placed)
                await placed.wait()
        stats = await client.stats()
    return outputs, stats


# (mode, KV transport, policy, migration headroom, extra scheduler flags)
CASES = [
    ("colocated", "nixl", "sarathi", 32, []),
    ("disaggregated", "grpc", "fastserve", 32, []),  # fastserve swaps when it preempts
    ("colocated", "nixl", "sarathi", 32, ["--decode-steps", "4"]),  # up to 4 tokens a request in flight
    ("colocated", "nixl", "sarathi", 0, []),  # no migration: the control
]


@pytest.mark.parametrize(("mode", "transport", "policy", "headroom", "extra"), CASES,
                         ids=["-".join([*map(str, c[:4]), *(f.lstrip("-") for f in c[4])]) for c in CASES])
async def test_a_full_worker_moves_a_decode_to_a_peer_instead_of_preempting(
        tiny_model_dir, tmp_path, hf_greedy, mode, transport, policy, headroom, extra):
    mesh = start_mesh(tiny_model_dir, tmp_path, mode=mode, num_decode=2, http=False,
                      scheduler_args=["--policy", policy, "--kv-transport", transport, "--chunk-size", "64",
                                      "--migration-headroom", str(headroom), *extra],
                      worker_args=["--kv-cache-bytes", str(POOL_BYTES)])
    try:
        prompts = random_prompts([n for n, _ in REQUESTS], seed=7)
        outputs, stats = await _run(mesh.grpc_address, prompts)
        for prompt, (_, max_tokens), got in zip(prompts, REQUESTS, outputs, strict=True):
            assert got == hf_greedy(prompt, max_tokens)
        if headroom:
            assert stats.num_migrations >= 1 and stats.num_preemptions == 0
        else:
            assert stats.num_migrations == 0 and stats.num_preemptions >= 1
        with anyio.fail_after(10):
            while True:
                async with AsyncClient(mesh.grpc_address) as client:
                    stats = await client.stats()
                if all(w.num_device_blocks_used == 0 for w in stats.workers):
                    break
                await anyio.sleep(0.1)
    finally:
        assert all(code == 0 for code in mesh.stop().values())
