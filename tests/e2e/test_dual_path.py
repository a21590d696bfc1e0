"""Multi-turn reuse through kvcache: the next turn's prefix is loaded (PE-read or DE-read, from the DRAM or
the disk tier) instead of computed, and greedy output stays token-identical to transformers."""

from __future__ import annotations

import time

import anyio
import grpc
import pytest

from seawall import AsyncClient, Client
from seawall.v1 import kvcache_pb2, kvcache_pb2_grpc, worker_pb2
from services.common.shaper import MIN_BURST_BYTES
from tests.e2e.conftest import random_prompts, start_mesh

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.timeout(300)]

# The workers cache no prefixes, so every reused token comes from kvcache.
CASES = {
    "pe-read-dram": (["--kv-read-policy", "pe-read"], []),
    "de-read-dram": (["--kv-read-policy", "de-read"], []),
    # A DRAM tier of 4 blocks: the session's blocks are demoted to disk before the next turn loads them.
    "dual-disk": (["--kv-read-policy", "dual"], ["--dram-bytes", "DRAM", "--disk-dir", "DIR", "--disk-bytes",
                                                 str(2**30)]),
}


def _wait_blocks_free(client, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = client.stats()
        if stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers):
            return
        assert time.monotonic() < deadline, f"blocks still in use: {stats}"
        time.sleep(0.05)


def _scrape(http_url):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(httpx.get(f"{http_url}/metrics", timeout=10).text)}


def _kv_stats(address):
    with grpc.insecure_channel(address) as channel:
        return kvcache_pb2_grpc.KVCacheStub(channel).Stats(kvcache_pb2.KVCacheStatsRequest())


@pytest.fixture(scope="module")
def pe_read_mesh(tiny_model_dir, tmp_path_factory):
    """Shared by the tests that load through the prefill worker (each with sessions and prompts of its own):
    workers cache no prefixes, so every reused block comes from kvcache; multi-step decoding on."""
    mesh = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("logs"), scheduler_args=[
        "--chunk-size", "64", "--no-prefix-caching", "--kv-read-policy", "pe-read", "--decode-steps", "4"],
        kvcache_args=[])
    yield mesh
    mesh.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_the_next_turn_loads_its_prefix_from_kvcache_and_matches_transformers(case, tiny_model_dir, tmp_path,
                                                                              hf_greedy, request):
    sched_args, kv_args = CASES[case]
    block_bytes = 4 * 2 * 16 * 2 * 32 * 4  # layers x (k, v) x block x kv heads x head dim x fp32 (tiny preset)
    kv_args = [a.replace("DIR", str(tmp_path / "kv")).replace("DRAM", str(4 * block_bytes)) for a in kv_args]
    own = case != "pe-read-dram"
    mesh = start_mesh(tiny_model_dir, tmp_path / "logs", scheduler_args=["--chunk-size", "64",
                      "--no-prefix-caching", *sched_args], kvcache_args=kv_args, http=False) if own else (
        request.getfixturevalue("pe_read_mesh"))
    try:
        with Client(mesh.grpc_address) as client:
            prompt = random_prompts([90], seed=21)[0]
            first = client.generate(prompt, max_tokens=10, temperature=0, session_id=f"s-{case}")
            assert first.token_ids == hf_greedy(prompt, 10) and first.cached_prompt_tokens == 0
            second_prompt = prompt + first.token_ids + random_prompts([23], seed=22)[0]
            second = client.generate(second_prompt, max_tokens=8, temperature=0, session_id=f"s-{case}")
            assert second.token_ids == hf_greedy(second_prompt, 8)
            # Turn 1 stored its 6 full blocks (99 tokens computed); turn 2 loads them.
            assert second.cached_prompt_tokens == 96
            stats = _kv_stats(mesh.kvcache_address)
            tiers = {t.tier: t for t in stats.tiers}
            if case == "dual-disk":
                assert tiers[kvcache_pb2.STORAGE_TIER_DISK].bytes_read > 0
            paths = {p.path: p.num_loads for p in stats.paths}
            want = kvcache_pb2.KV_READ_PATH_DE_READ if case == "de-read-dram" else kvcache_pb2.KV_READ_PATH_PE_READ
            assert paths.get(want, 0) >= 1, paths
            _wait_blocks_free(client)  # the last turn's blocks are held until its store to kvcache ended
    finally:
        if own:
            mesh.stop()


def test_kvcache_down_means_recompute_and_the_mesh_recovers_when_it_returns(tiny_model_dir, tmp_path, hf_greedy):
    mesh = start_mesh(tiny_model_dir, tmp_path / "logs", scheduler_args=["--chunk-size", "64", "--no-prefix-caching"],
                      kvcache_args=[], http=False)
    try:
        with Client(mesh.grpc_address) as client:
            prompt = random_prompts([70], seed=31)[0]

            def turn(p, tokens=6):
                out = client.generate(p, max_tokens=tokens, temperature=0, session_id="s")
                assert out.token_ids == hf_greedy(p, tokens)
                return out

            first = turn(prompt)
            mesh.kill("kvcache")
            prompt = prompt + first.token_ids + [7, 8, 9]
            second = turn(prompt)  # kvcache is gone: computed, same tokens
            assert second.cached_prompt_tokens == 0
            mesh.respawn("kvcache", mesh.kvcache_address)
            time.sleep(3)  # past the scheduler's back-off after the failures
            prompt = prompt + second.token_ids + [10, 11]
            turn(prompt)  # kvcache is empty again: computed, and its blocks are stored
            prompt = prompt + [12, 13, 14]
            assert turn(prompt).cached_prompt_tokens > 0  # the mesh uses kvcache again
            _wait_blocks_free(client)
    finally:
        mesh.stop()


def _stop_inside_a_group(tokenizer, prompt_len: int, ref: list[int], k_steps: int) -> tuple[str, int]:
    """A stop string that the ``k``-th output token completes, where ``k`` is inside a multi-step group (the
    first output comes from the prompt's step, then groups of ``k_steps``) and the outputs it cuts off cross
    a block boundary: what kvcache stores must end at the kept tokens, not at what the worker computed."""
    for k in range(8, len(ref)):
        group_end = -(-k // k_steps) * k_steps
        if k == group_end or (prompt_len + k + 1) // 16 == (prompt_len + group_end) // 16:
            continue
        before, upto = tokenizer.decode(ref[:k]), tokenizer.decode(ref[: k + 1])
        added = upto[len(before):] if upto.startswith(before) else ""
        if added.strip() and added not in before:
            return added, k
    raise AssertionError("no stop string fits")


def test_a_stop_string_inside_a_multi_step_group_stores_only_the_kept_tokens(tiny_model_dir, pe_read_mesh,
                                                                            hf_greedy):
    from tokenizers import Tokenizer

    mesh = pe_read_mesh
    with Client(mesh.grpc_address) as client:
        prompt = random_prompts([93], seed=23)[0]
        ref = hf_greedy(prompt, 60)
        stop, k = _stop_inside_a_group(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")), 93, ref, 4)
        first = client.generate(prompt, max_tokens=60, temperature=0, stop=(stop,), session_id="s-stop")
        assert first.finish_reason == "stop" and first.token_ids == ref[: k + 1]
        second_prompt = prompt + first.token_ids + random_prompts([20], seed=24)[0]
        second = client.generate(second_prompt, max_tokens=8, temperature=0, session_id="s-stop")
        assert second.token_ids == hf_greedy(second_prompt, 8)
        assert second.cached_prompt_tokens == (93 + k + 1) // 16 * 16  # the kept tokens' full blocks
        _wait_blocks_free(client)


def test_a_responses_api_conversation_loads_each_turns_prefix_from_kvcache(pe_read_mesh):
    import openai

    mesh = pe_read_mesh
    with openai.OpenAI(base_url=f"{mesh.http_url}/v1", api_key="unused", max_retries=0) as api:
        question = "How do bursts of long prompts stall decoding? " * 6
        first = api.responses.create(model="tiny", input=question, max_output_tokens=6, temperature=0)
        assert first.usage.input_tokens_details.cached_tokens == 0
        second = api.responses.create(model="tiny", previous_response_id=first.id, input="Why?",
                                      max_output_tokens=6, temperature=0)
        # The workers cache nothing here: the first turn's blocks came from kvcache (stored as its session).
        assert second.usage.input_tokens_details.cached_tokens >= 64
        assert sum(p.num_loads for p in _kv_stats(mesh.kvcache_address).paths) >= 1
        choices = {s.labels["choice"]: s.value for s in _scrape(mesh.http_url)["seawall_dual_path_choices"].samples
                   if s.name.endswith("_total")}  # the scheduler's side of the same decision
        assert choices["pe-read"] + choices["de-read"] >= 1 and choices["recompute"] == 0, choices
        chat = api.chat.completions.create(model="tiny", max_tokens=6, temperature=0, messages=[
            {"role": "user", "content": question}, {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "Why?"}])
        assert second.output_text == chat.choices[0].message.content  # computed whole: the same reply
    with Client(mesh.grpc_address) as client:
        _wait_blocks_free(client)


# --- an abort while KV is on its way in ---------------------------------------------------------------------
# Loads and pulls are shaped to take ~2 s, so the abort lands mid-transfer: the blocks the transfer writes into
# must stay held until it ended (a late write would land in whoever took them), and a request that needs them
# waits for them, then matches transformers.

_BLOCK_BYTES = 4 * 2 * 16 * 2 * 32 * 4  # tiny preset, fp32
_SLOW_GBPS = (6 * _BLOCK_BYTES - MIN_BURST_BYTES) / 2.0 / 1e9  # 6 blocks in ~2 s past the bucket's burst


async def _used_blocks(client, role=None) -> int:
    stats = await client.stats()
    return sum(w.num_device_blocks_used for w in stats.workers if role is None or w.role == role)


async def _wait_used(client, want, role=None, timeout_s=20.0) -> None:
    with anyio.fail_after(timeout_s):
        while await _used_blocks(client, role) != want:
            await anyio.sleep(0.02)


async def _abort_mid_transfer(client, prompt, held, role=None, **session) -> None:
    """Streams ``prompt``, aborts it once ``held`` blocks are reserved for its incoming KV, and checks that
    they stay held after the abort (the transfer still runs)."""
    async def run():
        async for chunk in client.stream(prompt, request_id="aborted", max_tokens=20, temperature=0, **session):
            last = chunk
        assert last.finish_reason == "abort"

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await _wait_used(client, held, role)
        assert await client.abort("aborted")
    await anyio.sleep(0.3)
    assert await _used_blocks(client, role) == held, "the aborted request's blocks were freed mid-transfer"


@pytest.mark.anyio
async def test_an_abort_during_a_kvcache_load_holds_its_blocks_until_the_load_landed(tiny_model_dir, tmp_path,
                                                                                    hf_greedy):
    mesh = start_mesh(tiny_model_dir, tmp_path / "logs", mode="colocated", http=False,
                      scheduler_args=["--no-prefix-caching", "--kv-read-policy", "pe-read"],
                      worker_args=["--kv-cache-bytes", str(14 * _BLOCK_BYTES)],
                      kvcache_args=["--storage-gbps", str(_SLOW_GBPS)])
    try:
        async with AsyncClient(mesh.grpc_address) as client:
            prompt = random_prompts([100], seed=41)[0]
            first = await client.generate(prompt, max_tokens=6, temperature=0, session_id="s")
            await _wait_used(client, 0)  # its 6 full blocks reached kvcache
            # The next turn loads those 6 blocks into 6 reserved ones: aborted meanwhile.
            await _abort_mid_transfer(client, prompt + first.token_ids + [5, 6, 7], 6, session_id="s")
            # 8 blocks are free, this one needs 10: it runs once the load landed and its blocks came back.
            other = random_prompts([150], seed=42)[0]
            out = await client.generate(other, max_tokens=8, temperature=0)
            assert out.token_ids == hf_greedy(other, 8)
            await _wait_used(client, 0)
        paths = {p.path: p.num_loads for p in _kv_stats(mesh.kvcache_address).paths}
        assert paths.get(kvcache_pb2.KV_READ_PATH_PE_READ, 0) == 1, paths
    finally:
        mesh.stop()


@pytest.mark.anyio
async def test_an_abort_during_a_hand_off_holds_the_decode_workers_blocks_until_the_pull_ended(
        tiny_model_dir, tmp_path, hf_greedy):
    mesh = start_mesh(tiny_model_dir, tmp_path / "logs", http=False,
                      worker_args=["--kv-cache-bytes", str(14 * _BLOCK_BYTES), "--compute-gbps", str(_SLOW_GBPS)])
    decode = worker_pb2.WORKER_ROLE_DECODE
    try:
        async with AsyncClient(mesh.grpc_address) as client:
            # The prompt's 96 tokens hand off into 6 blocks on the decode worker: aborted during the pull.
            await _abort_mid_transfer(client, random_prompts([96], seed=43)[0], 6, role=decode)
            other = random_prompts([150], seed=44)[0]
            out = await client.generate(other, max_tokens=8, temperature=0)
            assert out.token_ids == hf_greedy(other, 8)
            await _wait_used(client, 0)
    finally:
        mesh.stop()
