"""Greedy output through the live mesh is token-identical to transformers.

Real processes on loopback: the scheduler plus workers, in both modes, over NIXL and over the gRPC KV
fallback, under each step policy. A batch of concurrent requests of mixed lengths (prompts chunked,
requests joining and leaving mid-batch), then the same prompts again (prefix-cache hits), streamed, and as one
GenerateBatch call.
"""

from __future__ import annotations

import anyio
import pytest

from seawall import AsyncClient
from services.scheduler.core.scheduler import POLICIES
from tests.e2e.conftest import DEVICE, random_prompts, start_mesh

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

PROMPT_LENS = [1, 5, 16, 17, 40, 100, 170, 300]
# (mode, KV transport, policy, extra scheduler flags, extra worker flags). The scheduler plans ahead of every
# step (--step-pipelining all) unless the flags say otherwise; CPU workers run their steps on their event-loop
# thread unless told --step-thread own (a GPU worker's default).
KNOWN = ["--step-pipelining", "known"]  # plan ahead only behind prompt chunks
CASES = [
    ("disaggregated", "nixl", "sarathi", [], []),
    ("disaggregated", "grpc", "sarathi", KNOWN, []),
    ("colocated", "nixl", "sarathi", [], []),
    ("disaggregated", "nixl", "fastserve", KNOWN, []),
    ("colocated", "nixl", "fastserve", ["--step-pipelining", "prompts"], []),  # ahead of first tokens, not decodes
    # Multi-step decoding: a decode worker runs up to 4 passes per plan, tokens streamed 4 at a time.
    ("colocated", "nixl", "sarathi", ["--decode-steps", "4", *KNOWN], []),
    ("disaggregated", "nixl", "sarathi", ["--decode-steps", "4"], []),
    ("disaggregated", "nixl", "sarathi", [], ["--step-thread", "own"]),  # steps on a thread of their own
]


def _max_tokens(i: int) -> int:
    return 4 + (i * 5) % 13


@pytest.fixture(scope="module", params=CASES,
                ids=["-".join([*c[:3], *(f.lstrip("-") for f in c[3] + c[4])]) for c in CASES])
def mesh(request, tiny_model_dir, tmp_path_factory):
    mode, transport, policy, extra, worker_flags = request.param
    if policy not in POLICIES:
        pytest.skip(f"policy {policy} is not implemented yet")
    m = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("logs"), mode=mode, num_decode=2 if mode == "colocated" else 1,
                   scheduler_args=["--policy", policy, "--kv-transport", transport, "--chunk-size", "64",
                                   "--step-pipelining", "all", *extra], worker_args=worker_flags, http=False)
    own = "own" in worker_flags or DEVICE != "cpu"  # a GPU worker's default
    where = "their own thread" if own else "the event-loop thread"
    assert all(f"steps on {where}" in (m.options.log_dir / f"{c.name}.log").read_text() for c in m.children
               if c.name != "scheduler")
    yield m
    assert all(code == 0 for code in m.stop().values())


async def _run_all(address, prompts):
    """generate(): one final response per request (final_only)."""
    results = [None] * len(prompts)
    async with AsyncClient(address) as client:
        async def one(i):
            results[i] = await client.generate(prompts[i], max_tokens=_max_tokens(i), temperature=0)

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return results


async def _stream_all(address, prompts):
    chunks = [[] for _ in prompts]
    async with AsyncClient(address) as client:
        async def one(i):
            async for chunk in client.stream(prompts[i], max_tokens=_max_tokens(i), temperature=0):
                chunks[i].append(chunk)

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return chunks


async def test_concurrent_greedy_requests_match_transformers(mesh, hf_greedy, request):
    prompts = random_prompts(PROMPT_LENS)
    for round_ in range(2):  # the second round hits the prefix cache for prompts of a block or more
        results = await _run_all(mesh.grpc_address, prompts)
        for i, (prompt, out) in enumerate(zip(prompts, results, strict=True)):
            assert out.token_ids == hf_greedy(prompt, _max_tokens(i)), f"round {round_}, prompt {i} ({len(prompt)} tokens)"
            assert out.finish_reason in ("stop", "length")
    assert any(r.cached_prompt_tokens > 0 for r in results)
    streamed = await _stream_all(mesh.grpc_address, prompts)  # one response per step this time
    for i, (prompt, chunks) in enumerate(zip(prompts, streamed, strict=True)):
        assert [t for c in chunks for t in c.token_ids] == hf_greedy(prompt, _max_tokens(i)), f"streamed prompt {i}"
        assert chunks[-1].finish_reason in ("stop", "length")
    assert max(len(chunks) for chunks in streamed) > 1
    if "--decode-steps" in request.node.callspec.params["mesh"][3]:  # tokens of a multi-step plan come together
        assert max(len(c.token_ids) for chunks in streamed for c in chunks) > 1
    async with AsyncClient(mesh.grpc_address) as client:
        batch = await client.generate_batch(prompts, max_tokens=9, temperature=0)  # all in one call
        assert [c.token_ids for c in batch] == [hf_greedy(p, 9) for p in prompts]
        stats = await client.stats()
    assert stats.num_finished == 4 * len(prompts) and stats.num_running == 0
    assert all(w.num_device_blocks_used == 0 for w in stats.workers)
    # The second round's cache hits are in the workers' prefix counters (seawall bench reports their share).
    hits = sum(w.num_prefix_hit_blocks for w in stats.workers)
    assert 16 * hits >= sum(r.cached_prompt_tokens for r in results) > 0
    assert sum(w.num_prefix_queried_blocks for w in stats.workers) > hits
