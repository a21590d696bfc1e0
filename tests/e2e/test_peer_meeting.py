"""Workers meet when they register (services/scheduler/peer_meeting.py): in a live mesh every NIXL worker has
loaded every other's metadata and opened its connections to it before the first request, and so has the
kvcache service; a restarted worker meets them all again, and outputs stay token-identical to transformers.
With ``--no-peer-meeting`` none meets before its first transfer."""

from __future__ import annotations

import time

import anyio
import grpc
import pytest

from seawall import AsyncClient
from seawall.v1 import kvcache_pb2, kvcache_pb2_grpc, worker_pb2
from tests.e2e.conftest import generate_all, random_prompts, start_mesh

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(240)]

def _wait_met(mesh, names, peers: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (met := {n: mesh.gauge("seawall_nixl_peers", n) for n in names}) != dict.fromkeys(names, peers):
        assert time.monotonic() < deadline, f"workers met {met} peers, not {peers} each"
        time.sleep(0.1)


async def test_workers_meet_every_peer_before_the_first_request_and_again_after_a_restart(
        tiny_model_dir, tmp_path, hf_greedy):
    mesh = start_mesh(tiny_model_dir, tmp_path, num_decode=2, scheduler_args=["--kv-transport", "nixl"],
                      kvcache_args=[])
    try:
        _wait_met(mesh, list(mesh.worker_addresses), 2)  # prefill-0, decode-1, decode-2
        async with grpc.aio.insecure_channel(mesh.kvcache_address) as channel:
            with anyio.fail_after(30):
                while len((await kvcache_pb2_grpc.KVCacheStub(channel).Stats(
                        kvcache_pb2.KVCacheStatsRequest())).nixl_peers) < 3:
                    await anyio.sleep(0.1)
        prompts = random_prompts([40, 90, 17, 64], seed=3)
        async with AsyncClient(mesh.grpc_address) as client:
            outputs = await generate_all(client, prompts, max_tokens=12, temperature=0)
        assert [o.token_ids for o in outputs] == [hf_greedy(p, 12) for p in prompts]

        mesh.kill("decode-2")
        mesh.respawn("decode-2", mesh.worker_addresses["decode-2"])
        _wait_met(mesh, ["decode-2"], 2)  # the new process met both; they met it (its metadata changed)
        async with AsyncClient(mesh.grpc_address) as client:
            with anyio.fail_after(60):
                while sum(w.role == worker_pb2.WORKER_ROLE_DECODE for w in (await client.stats()).workers) < 2:
                    await anyio.sleep(0.1)
            outputs = await generate_all(client, prompts, max_tokens=12, temperature=0)
        assert [o.token_ids for o in outputs] == [hf_greedy(p, 12) for p in prompts]
    finally:
        mesh.stop()


async def test_with_no_peer_meeting_each_pair_meets_on_its_first_transfer(tiny_model_dir, tmp_path, hf_greedy):
    mesh = start_mesh(tiny_model_dir, tmp_path, num_decode=2,
                      scheduler_args=["--kv-transport", "nixl", "--no-peer-meeting"])
    try:
        async with AsyncClient(mesh.grpc_address) as client:
            with anyio.fail_after(60):
                while len((await client.stats()).workers) < 3:
                    await anyio.sleep(0.1)
            await anyio.sleep(1)  # met within ~0.1 s of registering where meeting is on
            assert {n: mesh.gauge("seawall_nixl_peers", n) for n in mesh.worker_addresses} == dict.fromkeys(
                mesh.worker_addresses, 0)
            prompts = random_prompts([40, 90, 17, 64], seed=3)
            # Each transfer opens its pair's connections itself.
            outputs = await generate_all(client, prompts, max_tokens=12, temperature=0)
        assert [o.token_ids for o in outputs] == [hf_greedy(p, 12) for p in prompts]
    finally:
        mesh.stop()
