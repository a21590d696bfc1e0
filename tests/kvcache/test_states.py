"""Recurrent states stored with blocks (models with linear-attention layers): a real kvcache in-process and real
hybrid workers behind their gRPC servers. A Store with a state checkpoint reads the state the source saved after
the blocks (Worker.ReadState); a Lookup says how far a stored state resumes; a Load with a sequence writes the
state into the target for it (Worker.WriteState), after the blocks or alone, and the target goes on from there
exactly as the source goes on from its checkpoint."""

from __future__ import annotations

import grpc
import pytest
import torch
from prometheus_client import generate_latest

from seawall.v1 import common_pb2, kvcache_pb2, worker_pb2, worker_pb2_grpc
from services.common.sampling_params import SamplingParams
from services.common.step import NewSequence, StepPlan
from tests.common.served_worker import assert_resumes_like_the_source, served, small_runner
from tests.kvcache.conftest import chain
from tests.kvcache.test_observability import samples, value

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]

GRPC = common_pb2.KV_TRANSPORT_GRPC
DONE, NOT_FOUND, FAILED = (common_pb2.TRANSFER_STATUS_DONE, common_pb2.TRANSFER_STATUS_NOT_FOUND,
                           common_pb2.TRANSFER_STATUS_FAILED)
PARAMS = SamplingParams(max_tokens=8, temperature=0, logprobs=0)


def _store(endpoint, ids, hashes, checkpoint=None, tokens=0, tid="s") -> kvcache_pb2.StoreRequest:
    request = kvcache_pb2.StoreRequest(transfer_id=tid, source=endpoint, source_block_ids=ids, block_hashes=hashes,
                                       timeout_ms=20_000, transport=GRPC, state_tokens=tokens)
    if checkpoint is not None:
        request.state_checkpoint = checkpoint
    return request


def _load(endpoint, hashes, ids, seq_id="", after=0, tid="l") -> kvcache_pb2.LoadRequest:
    return kvcache_pb2.LoadRequest(transfer_id=tid, target=endpoint, block_hashes=hashes, target_block_ids=ids,
                                   timeout_ms=20_000, transport=GRPC, state_seq_id=seq_id, state_block_hash=after)


def _prompt_with_state_saved(runner, seed: int) -> tuple[list[int], int]:
    """A 40-token prompt run on ``runner`` as sequence "s" in blocks 0-2, its state saved after 32 tokens (two
    blocks) into checkpoint slot 3; the prompt and the token it sampled."""
    prompt = torch.randint(3, 4096, (40,), generator=torch.Generator().manual_seed(seed)).tolist()
    out = runner.execute(StepPlan(1, new=[NewSequence("s", prompt, 40, 0, [0, 1, 2], PARAMS)],
                                  num_scheduled_tokens={"s": 40}, state_saves={"s": (32, 3)}))
    return prompt, out.sampled["s"][0].token_id


async def test_a_state_stored_with_its_blocks_resumes_the_prefix_on_another_worker(make_kvcache, hybrid_model_dir):
    src, dst = small_runner(hybrid_model_dir), small_runner(hybrid_model_dir)
    prompt, first = _prompt_with_state_saved(src, seed=6)
    state_bytes = src.states.nbytes_per_slot()
    hashes = chain(2)
    kv = await make_kvcache()
    async with served(src) as source, served(dst) as target:
        r = await kv.stub.Store(_store(source, [0, 1], hashes, checkpoint=3, tokens=32), timeout=30)
        assert (r.status, r.num_blocks_stored, r.state_bytes) == (DONE, 2, state_bytes), r.error
        assert r.bytes == 2 * 4096 + state_bytes
        again = await kv.stub.Store(_store(source, [0, 1], hashes, checkpoint=3, tokens=32), timeout=30)
        assert (again.status, again.num_blocks_present, again.bytes) == (DONE, 2, 0)  # one hash, one state

        found = await kv.stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=[*hashes, *chain(1, 2)]), timeout=10)
        assert (found.num_cached_blocks, found.num_state_blocks) == (2, 2)
        first_only = await kv.stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=hashes[:1]), timeout=10)
        assert (first_only.num_cached_blocks, first_only.num_state_blocks) == (1, 0)  # no state after block 0

        r = await kv.stub.Load(_load(target, hashes, [5, 6], "t", hashes[1]), timeout=30)
        assert (r.status, r.num_blocks_loaded, r.state_bytes, r.bytes) == (DONE, 2, state_bytes,
                                                                          2 * 4096 + state_bytes), r.error
        # The target caches the blocks already: the state alone.
        alone = await kv.stub.Load(_load(target, [], [], "v", hashes[1]), timeout=30)
        assert (alone.status, alone.bytes) == (DONE, state_bytes), alone.error
        # A state never stored: nothing moves, the blocks included.
        missing = await kv.stub.Load(_load(target, hashes, [9, 10], "w", hashes[0]), timeout=30)
        assert (missing.status, missing.bytes) == (NOT_FOUND, 0)
        assert f"no recurrent state is stored after block {hashes[0]:016x}" in missing.error

        stats = await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)
        assert (stats.num_states, stats.state_bytes, stats.state_capacity_bytes) == (1, state_bytes, 1 << 30)
        m = samples(generate_latest(kv.servicer.metrics.registry).decode())
        assert value(m, "seawall_kvcache_states", tier="dram") == 1
        assert value(m, "seawall_kvcache_state_bytes", tier="dram", kind="used") == state_bytes
        assert value(m, "seawall_kvcache_state_bytes", tier="dram", kind="capacity") == 1 << 30
        assert value(m, "seawall_kvcache_state_evictions_total", tier="dram") == 0
        assert value(m, "seawall_kvcache_states", tier="disk") == 0  # no disk tier
    # The prompt's last 8 tokens from the loaded prefix, and on the source from its checkpoint: its token.
    assert_resumes_like_the_source(src, dst, prompt, first, src_blocks=[0, 1, 4])


async def test_states_that_cannot_be_read_written_or_kept_are_refused_and_named(make_kvcache, hybrid_model_dir):
    src = small_runner(hybrid_model_dir)
    _prompt_with_state_saved(src, seed=7)
    hashes = chain(2)
    kv = await make_kvcache()
    async with served(src) as source:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kv.stub.Store(_store(source, [], [], checkpoint=3, tokens=32), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "needs the blocks the state follows" in refused.value.details()
        # A checkpoint the source never saved: the blocks are stored, the call fails naming the state.
        r = await kv.stub.Store(_store(source, [0, 1], hashes, checkpoint=7, tokens=32), timeout=30)
        assert r.status == FAILED and "reading the recurrent state of checkpoint 7" in r.error
        assert "state checkpoint 7 was never saved on this worker" in r.error
        found = await kv.stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=hashes), timeout=10)
        assert (found.num_cached_blocks, found.num_state_blocks) == (2, 0)

        assert (await kv.stub.Store(_store(source, [0, 1], hashes, checkpoint=3, tokens=32), timeout=30)).status == DONE
        no_address = _load(source, [], [], "t", hashes[1])
        no_address.target.grpc_address = ""
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kv.stub.Load(no_address, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "grpc_address" in refused.value.details()

        # A worker refuses a state that is not its model's, before any plan could trip on it.
        async with grpc.aio.insecure_channel(source.grpc_address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            layer = worker_pb2.RecurrentStateLayer(index=0, num_computed_tokens=32, conv=b"x" * 8, ssm=b"")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.WriteState(iter([worker_pb2.StateWrite(seq_id="z", layer=layer)]), timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "1 layers of recurrent state for a model with" in refused.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.WriteState(iter([worker_pb2.StateWrite(seq_id="z", layer=worker_pb2.RecurrentStateLayer(
                    index=1))]), timeout=10)
            assert "layer 1 came where 0 was due" in refused.value.details()


async def test_a_kvcache_without_room_for_states_stores_the_blocks_alone(make_kvcache, hybrid_model_dir):
    src = small_runner(hybrid_model_dir)
    _prompt_with_state_saved(src, seed=8)
    hashes = chain(2)
    kv = await make_kvcache(state_bytes=0)
    async with served(src) as source:
        r = await kv.stub.Store(_store(source, [0, 1], hashes, checkpoint=3, tokens=32), timeout=30)
        assert (r.status, r.num_blocks_stored, r.state_bytes, r.bytes) == (DONE, 2, 0, 2 * 4096)
        found = await kv.stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=hashes), timeout=10)
        assert (found.num_cached_blocks, found.num_state_blocks) == (2, 0)


async def test_a_restarted_kvcache_serves_the_states_its_disk_tier_kept(make_kvcache, hybrid_model_dir, tmp_path):
    src, dst = small_runner(hybrid_model_dir), small_runner(hybrid_model_dir)
    prompt, first = _prompt_with_state_saved(src, seed=9)
    hashes = chain(2)
    kv = await make_kvcache(disk_dir=tmp_path, disk_blocks=8)
    async with served(src) as source, served(dst) as target:
        r = await kv.stub.Store(_store(source, [0, 1], hashes, checkpoint=3, tokens=32), timeout=30)
        assert r.status == DONE and r.state_bytes, r.error
        stats = await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)
        assert (stats.num_states, stats.num_disk_states) == (1, 0)  # in memory: written on the way out
        await make_kvcache.stop(kv)
        kv = await make_kvcache(disk_dir=tmp_path, disk_blocks=8)
        stats = await kv.stub.Stats(kvcache_pb2.KVCacheStatsRequest(), timeout=10)
        assert (stats.num_states, stats.num_disk_states) == (0, 1) and stats.state_disk_bytes > r.state_bytes
        found = await kv.stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=hashes), timeout=10)
        assert (found.num_cached_blocks, found.num_state_blocks) == (2, 2)
        r = await kv.stub.Load(_load(target, hashes, [5, 6], "t", hashes[1]), timeout=30)
        assert (r.status, r.num_blocks_loaded, r.num_disk_blocks) == (DONE, 2, 2), r.error
    theirs = dst.execute(StepPlan(1, new=[NewSequence("t", prompt, 40, 32, [5, 6, 7], PARAMS)],
                                  num_scheduled_tokens={"t": 8}))
    assert not theirs.errors and theirs.sampled["t"][0].token_id == first
