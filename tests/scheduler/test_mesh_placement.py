"""The mesh places by token load: its real per-worker cores, requests in them, and DualPath's read queues feed
``placement.py`` (no worker processes: placement reads only the scheduler's own state)."""

from __future__ import annotations

import anyio
import pytest

from services.common.sampling_params import SamplingParams
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request
from services.scheduler.dual_path import DualPath
from services.scheduler.mesh import Mesh
from services.scheduler.worker_link import WorkerLink
from tests.scheduler.links import add_link

pytestmark = pytest.mark.anyio

@pytest.fixture
def anyio_backend():
    return "asyncio"


def _link(mesh: Mesh, worker_id: str, role: str, blocks: int = 256) -> WorkerLink:
    return add_link(mesh, worker_id, role, blocks)


def _req(rid: str, prompt_len: int, outputs: int = 0, first: int = 3) -> Request:
    req = Request(rid, [first + i % 1000 for i in range(prompt_len)], SamplingParams(max_tokens=64), 0.0)
    req.output_token_ids.extend([5] * outputs)
    return req


async def test_the_prompt_goes_to_the_prefill_worker_with_the_fewest_tokens():
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated"))
    a, b = _link(mesh, "a", "prefill"), _link(mesh, "b", "prefill")
    _link(mesh, "d", "decode")
    a.core.add(_req("long", 900))  # one request, many tokens
    for i in range(5):
        b.core.add(_req(f"short{i}", 100))  # more requests, fewer tokens
    assert mesh.engine_load(a).tokens == 900 and mesh.engine_load(b).seqs == 5
    assert mesh.pick_prompt_worker(_req("new", 50)) is b
    mesh.place(_req("big", 600))  # b now holds 1100 tokens
    assert mesh.pick_prompt_worker(_req("next", 50)) is a


async def test_a_prefill_node_with_backed_up_storage_reads_is_avoided():
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated"))
    mesh.dual_path = DualPath(mesh, client=None)
    a, b = _link(mesh, "a", "prefill"), _link(mesh, "b", "prefill")
    b.core.add(_req("some", 300))
    reads = mesh.dual_path.reads["a"]
    now = anyio.current_time()
    reads.start(100, now - 1.0)
    reads.finish(100, now)  # a reads 100 tokens per second
    reads.start(1000, now)  # 10 s of reads queued on a's node
    assert mesh.pick_prompt_worker(_req("new", 50)) is b
    reads.finish(1000, now)
    assert mesh.pick_prompt_worker(_req("new", 50)) is a


async def test_tokens_being_admitted_count_until_the_core_holds_them():
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated"))
    mesh.dual_path = DualPath(mesh, client=None)
    a, b = _link(mesh, "a", "prefill"), _link(mesh, "b", "prefill")
    b.core.add(_req("queued", 200))
    mesh.dual_path.admitting["looking-up"] = ("a", 500)  # its kvcache lookup is in flight
    assert mesh.engine_load(a).tokens == 500 and mesh.pick_prompt_worker(_req("new", 50)) is b
    a.core.add(_req("looking-up", 500))
    assert mesh.engine_load(a).tokens == 500  # counted once


async def test_decode_placement_by_token_load_with_room():
    mesh = Mesh(SchedulerServiceConfig(mode="disaggregated"))
    _link(mesh, "p", "prefill")
    d1, d2 = _link(mesh, "d1", "decode"), _link(mesh, "d2", "decode", blocks=8)
    d1.core.add(_req("x", 700, outputs=40))
    assert mesh.pick_decode_worker(_req("small", 64)) is d2  # fewer tokens, and 8 blocks hold 64 tokens
    assert mesh.pick_decode_worker(_req("large", 400)) is d1  # d2 has no room for 400 tokens


@pytest.mark.parametrize(("setting", "ahead"), [
    ("auto", "all"), ("all", "all"), ("prompts", "prompts"), ("known", "known"), ("off", "off"),
])
async def test_step_pipelining_by_setting(setting, ahead):
    mesh = Mesh(SchedulerServiceConfig(mode="colocated", step_pipelining=setting))
    assert mesh._plans_ahead() == ahead  # auto: all, on a GPU and on a CPU alike
