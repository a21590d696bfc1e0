"""Hybrid models (Qwen3-Next: Gated DeltaNet linear attention in two layers of three; Granite 4.0-H: Mamba-2 in
two of three; LFM2: gated short convolutions, whose state is their window alone; Nemotron 3: Mamba-2 and
attention layers between expert layers; Falcon-H1: both in every layer; LFM3: convolutions beside sliding and
full attention; Kimi Linear: Kimi Delta Attention beside latent attention; Zamba2: Mamba-2 everywhere, shared
attention blocks in some layers) through the live mesh: in
the disaggregated topology each sequence's recurrent state follows its KV blocks from the prefill to the decode
worker (ReadState after the blocks, over NIXL or the gRPC fallback), with no request recomputed; colocated,
prompt chunks and decodes share steps. Greedy output equals transformers' for every request, and the pools end
empty."""

from __future__ import annotations

import anyio
import grpc
import httpx
import pytest
import torch

from seawall import AsyncClient
from seawall.v1 import kvcache_pb2, kvcache_pb2_grpc
from services.engine.checkpoint_report import kv_bytes_per_token, state_bytes_per_sequence
from services.engine.model_config import ModelConfig
from tests.e2e.conftest import generate_all, greedy_oracle, random_prompts, start_mesh

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

transformers = pytest.importorskip("transformers")

MAX_TOKENS = 16
PROMPTS = random_prompts([1, 17, 64, 65, 150, 40], seed=51)
# (model, mode, KV transport, whether a kvcache service runs: prompts then go through DualPath's admission)
# One case per kind of recurrent state and layout (Granite 4.0-H's and Falcon Mamba's states are Mamba-2's and
# Mamba's, whose models the offline and engine oracles check).
CASES = [("qwen3-next", "disaggregated", "nixl", False), ("qwen3-next", "disaggregated", "grpc", False),
         ("qwen3-next", "colocated", "nixl", False), ("lfm2", "disaggregated", "grpc", False),
         ("nemotron-h-moe", "disaggregated", "nixl", False), ("falcon-h1", "disaggregated", "nixl", True),
         ("lfm3", "colocated", "nixl", False), ("kimi-linear", "disaggregated", "grpc", False),
         ("mamba2", "disaggregated", "nixl", True), ("mamba", "disaggregated", "grpc", False),
         ("zamba2", "disaggregated", "nixl", True)]


@pytest.fixture(scope="module", params=CASES,
                ids=["-".join(c[:3]) + ("-kvcache" if c[3] else "") for c in CASES])
def case(request, hybrid_model_dir, tiny_model_dir, tmp_path_factory):
    """(checkpoint, its transformers model, mode, KV transport, kvcache)."""
    name, mode, transport, kvcache = request.param
    path = _checkpoint(name, hybrid_model_dir, tiny_model_dir, tmp_path_factory)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, mode, transport, kvcache


def _checkpoint(name, hybrid_model_dir, tiny_model_dir, tmp_path_factory):
    if name == "qwen3-next":
        return hybrid_model_dir
    from tests.engine.test_architectures import CASES as ARCHITECTURES
    from tests.engine.test_architectures import save_checkpoint
    from tests.engine.test_mamba import CASES as ATTENTION_FREE

    path = tmp_path_factory.mktemp(name)
    save_checkpoint({**ARCHITECTURES, **ATTENTION_FREE}[name](), path, tiny_model_dir)
    return path


@pytest.fixture(scope="module")
def mesh(case, tmp_path_factory):
    path, _, mode, transport, kvcache = case
    m = start_mesh(path, tmp_path_factory.mktemp("logs"), mode=mode,
                   scheduler_args=["--chunk-size", "16", "--kv-transport", transport],
                   kvcache_args=[] if kvcache else None)
    yield m
    assert all(code == 0 for code in m.stop().values())


def _transfer_bytes(mesh) -> float:
    """The scheduler's count of bytes its transfers moved (KV blocks and the states pulled after them)."""
    text = httpx.get(mesh.metrics_urls["scheduler"], timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("seawall_kv_transfer_bytes_total{") and 'status="done"' in line)


async def test_concurrent_requests_match_transformers_with_states_handed_off(mesh, case):
    path, hf_model, *_ = case
    greedy = greedy_oracle(hf_model)
    async with AsyncClient(mesh.grpc_address) as client:
        outs = await generate_all(client, PROMPTS, max_tokens=MAX_TOKENS, temperature=0)
        # The 150-token prompt again: its blocks up to the state saved at its last full block (144 tokens).
        again = await client.generate(PROMPTS[4], max_tokens=MAX_TOKENS, temperature=0)
        # The 64-token prompt again: disaggregated, the decode worker caches all 4 of its blocks, and still
        # needs the state after them (it starts from the prefill worker's, which ran the last 16 tokens).
        whole = await client.generate(PROMPTS[2], max_tokens=MAX_TOKENS, temperature=0)
        stats = await client.stats()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == greedy(prompt, MAX_TOKENS), f"the {len(prompt)}-token prompt diverged"
    assert again.token_ids == outs[4].token_ids and again.cached_prompt_tokens == 144
    assert whole.token_ids == outs[2].token_ids and whole.cached_prompt_tokens == 48
    assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)
    if mesh.options.mode == "disaggregated":  # every hand-off moved blocks and state; none was recomputed
        # 8 requests' KV (1 + 2 + 4 + 5 + 10 + 3 + 10 + 4 blocks of 16 tokens, less the 9 + 4 the repeats found
        # cached on the decode worker) and 8 states, fp32.
        config = ModelConfig.from_dir(path)
        assert _transfer_bytes(mesh) == ((39 - 13) * 16 * kv_bytes_per_token(config, "float32")
                                         + 8 * state_bytes_per_sequence(config, "float32"))
        logs = "".join(p.read_text() for p in mesh.options.log_dir.glob("*.log"))
        assert "recomputing" not in logs and "computed elsewhere" not in logs


async def test_a_next_turn_resumes_where_the_turn_before_left_its_state(mesh, case):
    """The 150-token prompt's conversation goes on (its prompt, its 16 outputs, a new message): the worker that
    decoded the turn before saved the state after 160 of its 165 computed tokens. Disaggregated, the prefill
    worker that runs the new prompt holds the turn before's prompt state only (after 144): it reads the last
    block and the state from the decode worker's cache (peer_prefix.py)."""
    _, hf_model, *_ = case
    async with AsyncClient(mesh.grpc_address) as client:
        before = await client.generate(PROMPTS[4], max_tokens=MAX_TOKENS, temperature=0)
        prompt = PROMPTS[4] + before.token_ids + PROMPTS[1]
        turn = await client.generate(prompt, max_tokens=MAX_TOKENS, temperature=0)
    assert turn.token_ids == greedy_oracle(hf_model)(prompt, MAX_TOKENS)
    assert turn.cached_prompt_tokens == 160
    # Prometheus sees each worker's saved states beside its 16 device slots (the default).
    text = httpx.get(mesh.metrics_urls["scheduler"], timeout=10).text
    if mesh.options.mode == "disaggregated":
        assert 'seawall_peer_prefix_reads_total{result="done"} 1.0' in text
        assert "seawall_peer_prefix_tokens_total 160.0" in text
    gauges = [line for line in text.splitlines() if line.startswith("seawall_state_checkpoints{")]
    slots = [float(g.rsplit(" ", 1)[1]) for g in gauges if 'state="slots"' in g]
    saved = [float(g.rsplit(" ", 1)[1]) for g in gauges if 'state="saved"' in g]
    assert slots and set(slots) == {16.0} and 0 < sum(saved) <= sum(slots)
    host_slots = [float(g.rsplit(" ", 1)[1]) for g in gauges if 'state="host_slots"' in g]
    assert set(host_slots) == {64.0}  # and 64 more in host memory, the default


async def test_prompts_sharing_a_system_prompt_resume_where_they_part(mesh, case):
    """The second prompt after a shared 100-token system prompt finds the first's blocks but no state after
    them: it saves one where they part (96, the system prompt's last full block); the third resumes there."""
    _, hf_model, *_ = case
    system, *tails = random_prompts([100, 20, 30, 5], seed=77)
    async with AsyncClient(mesh.grpc_address) as client:
        got = [await client.generate(system + tail, max_tokens=MAX_TOKENS, temperature=0) for tail in tails]
    assert [g.cached_prompt_tokens for g in got] == [0, 0, 96]
    greedy = greedy_oracle(hf_model)
    assert [g.token_ids for g in got] == [greedy(system + tail, MAX_TOKENS) for tail in tails]


async def test_next_turns_resume_from_states_the_decode_worker_moved_to_host_memory(hybrid_model_dir, tmp_path):
    """Workers with 2 device slots for saved states and 8 in host memory: three conversations' first turns, one
    after another, each leave their latest state on the decode worker (after 48, 64 and 64 of 40 + 16, 50 + 16
    and 60 + 16 tokens), the first of them pushed to host memory by the later ones; every next turn reads its
    own from there (a peer read of a host slot), and matches transformers."""
    mesh = start_mesh(hybrid_model_dir, tmp_path / "logs", http=False, scheduler_args=["--chunk-size", "16"],
                      worker_args=["--state-checkpoints", "2", "--host-state-checkpoints", "8"])
    try:
        firsts = random_prompts([40, 50, 60], seed=78)
        message = random_prompts([9], seed=79)[0]
        async with AsyncClient(mesh.grpc_address) as client:
            outs = [await client.generate(p, max_tokens=MAX_TOKENS, temperature=0) for p in firsts]
            seconds = [p + o.token_ids + message for p, o in zip(firsts, outs, strict=True)]
            got = [await client.generate(p, max_tokens=MAX_TOKENS, temperature=0) for p in seconds]
        greedy = greedy_oracle(transformers.AutoModelForCausalLM.from_pretrained(hybrid_model_dir,
                                                                                  dtype=torch.float32).eval())
        assert [g.token_ids for g in got] == [greedy(p, MAX_TOKENS) for p in seconds]
        assert [g.cached_prompt_tokens for g in got] == [48, 64, 64]
    finally:
        assert all(code == 0 for code in mesh.stop().values())


async def _stored(client) -> None:
    """Until the turn that just ended was stored: the store frees its blocks, and the saved state it read (lent
    meanwhile) may be replaced again; with one slot a worker would skip the next prompt's saves before that."""
    with anyio.fail_after(10):
        while any(w.num_device_blocks_used for w in (await client.stats()).workers):
            await anyio.sleep(0.05)


@pytest.mark.parametrize(("model", "mode", "side", "own_cache"), [
    ("qwen3-next", "disaggregated", "pe-read", True), ("qwen3-next", "disaggregated", "de-read", True),
    ("qwen3-next", "colocated", "pe-read", False),
    ("mamba2", "disaggregated", "pe-read", True)])
async def test_next_turns_resume_from_states_kvcache_stored_with_their_blocks(hybrid_model_dir, tiny_model_dir,
                                                                              tmp_path_factory, tmp_path, model, mode,
                                                                              side, own_cache):
    """Sessions through kvcache, with workers that keep one saved state each (and none in host memory): three
    conversations' first turns, one after another, each store their blocks and the state saved after the last
    of them (48, 64, 64 tokens) in kvcache, while each worker's one slot goes to the next conversation. Every
    next turn loads its blocks and state from kvcache, the state into the worker running its prompt (written
    with WriteState; on a DE-read alone, the blocks going to the decode worker), resumes there and matches
    transformers. Without the workers' own prefix caches (``own_cache``) their saved states count all the same,
    for kvcache to store. An attention-free model's blocks hold nothing: kvcache keeps their hashes, which key
    its states."""
    path = _checkpoint(model, hybrid_model_dir, tiny_model_dir, tmp_path_factory)
    mesh = start_mesh(path, tmp_path / "logs", mode=mode, http=False, kvcache_args=[],
                      scheduler_args=["--chunk-size", "16", "--kv-read-policy", side,
                                      *([] if own_cache else ["--no-prefix-caching"])],
                      worker_args=["--state-checkpoints", "1", "--host-state-checkpoints", "0",
                                   # DE-read: pools of 10 blocks, so the decode worker no longer caches a
                                   # conversation's blocks by its next turn, and they load there
                                   *(["--kv-cache-bytes", str(10 * 4096)] if side == "de-read" else [])])
    try:
        firsts = random_prompts([40, 50, 60], seed=80)
        message = random_prompts([9], seed=81)[0]
        async with AsyncClient(mesh.grpc_address) as client:
            outs, got = [], []
            for i, p in enumerate(firsts):
                outs.append(await client.generate(p, max_tokens=MAX_TOKENS, temperature=0, session_id=f"s{i}"))
                await _stored(client)
            seconds = [p + o.token_ids + message for p, o in zip(firsts, outs, strict=True)]
            for i, p in enumerate(seconds):
                got.append(await client.generate(p, max_tokens=MAX_TOKENS, temperature=0, session_id=f"s{i}"))
                await _stored(client)
        greedy = greedy_oracle(transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
        assert [g.token_ids for g in got] == [greedy(p, MAX_TOKENS) for p in seconds]
        assert [g.cached_prompt_tokens for g in got] == [48, 64, 64]
        with grpc.insecure_channel(mesh.kvcache_address) as channel:
            kv = kvcache_pb2_grpc.KVCacheStub(channel).Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)
        # Six turns stored, each with its state (the second turns' after 80, 96 and 96 tokens).
        config = ModelConfig.from_dir(path)
        assert (kv.num_states, kv.state_bytes) == (6, 6 * state_bytes_per_sequence(config, "float32"))
        # Three loads into the worker running the prompt: blocks and state; a DE-read's state alone, its blocks
        # into the decode worker.
        loads = {p.path: (p.num_loads, p.bytes) for p in kv.paths}
        pe, de = kvcache_pb2.KV_READ_PATH_PE_READ, kvcache_pb2.KV_READ_PATH_DE_READ
        if side == "de-read":
            assert loads[pe] == (3, 3 * state_bytes_per_sequence(config, "float32")) and loads[de][0] == 3
        else:
            assert loads[pe][0] == 3 and len(loads) == 1
    finally:
        assert all(code == 0 for code in mesh.stop().values())
