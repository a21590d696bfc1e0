"""A prompt's prefix read from a decode worker's prefix cache (services/scheduler/peer_prefix.py), in the mesh:
which decode worker holds the most of it, what the read holds there while it runs (blocks, a pinned state
checkpoint), that it waits for the decode worker's plans in flight, and that a failed read computes the
prompt and lets go of everything. Real cores and real gRPC clients; the workers are not listening, so each
pull fails fast once it is tried, which is what the tests watch for."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from seawall.launcher import free_port
from services.common.block_hash import extend_hashes
from services.common.sampling_params import SamplingParams
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.mesh import Mesh
from services.scheduler.worker_link import WorkerLink
from tests.scheduler.links import add_link, worker_info

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PROMPT = [3 + i for i in range(120)]  # 7 full blocks of 16 a later request could take


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _mesh(mode: str = "disaggregated", **config) -> Mesh:
    return Mesh(SchedulerServiceConfig(mode=mode, transfer_timeout_s=5, **config))


def _link(mesh: Mesh, worker_id: str, role: str, checkpoints: int = 0) -> WorkerLink:
    link = add_link(mesh, worker_id, role, blocks=32, address=f"127.0.0.1:{free_port()}")  # nothing listens
    if checkpoints:  # a model with linear-attention layers, keeping that many states for prefix caching
        info = worker_info(role, 32)
        info.recurrent_state, info.state_checkpoints = True, checkpoints
        link = mesh.links[worker_id] = WorkerLink.connect(worker_id, link.address, info, mesh.config.core)
    return link


def _req(rid: str = "r", tokens: list[int] = PROMPT) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=8), 0.0)


def _cache(link: WorkerLink, tokens: int, state_at: int | None = None) -> None:
    """Puts PROMPT's first ``tokens`` in ``link``'s prefix cache (as a finished request leaves them), with a
    saved state where block ``state_at`` ends."""
    core = link.core
    core.reserve_arrival(Request(f"cached{tokens}", PROMPT[:tokens], SamplingParams(), 0.0,
                                 num_computed_tokens=tokens))
    core.cache_arrival(f"cached{tokens}")
    if state_at is not None:
        hashes = extend_hashes([], PROMPT, 16, core.seed_of(_req()))
        core.checkpoints.assign(hashes[state_at - 1])
        core.checkpoints.end_plan()
        core.checkpoints.confirm(hashes[state_at - 1])


async def test_the_decode_worker_caching_the_most_beyond_the_prefill_worker_and_kvcache_holds_it():
    mesh = _mesh()
    prefill, d1, d2 = _link(mesh, "p", "prefill"), _link(mesh, "d1", "decode"), _link(mesh, "d2", "decode")
    _cache(prefill, 32)
    _cache(d1, 64)
    _cache(d2, 96)
    assert mesh.peer.holder(_req(), prefill) == (d2, 96)
    assert mesh.peer.holder(_req(), prefill, beyond=96) is None  # kvcache holds as much: a storage read
    mesh.config = replace(mesh.config, peer_prefix=False)  # --no-peer-prefix
    assert mesh.peer.holder(_req(), prefill) is None
    mesh.config = replace(mesh.config, peer_prefix=True)
    _cache(prefill, 112)
    assert mesh.peer.holder(_req(), prefill) is None  # the prefill worker's own cache holds more
    colocated = _mesh("colocated")
    a = _link(colocated, "a", "hybrid")
    _cache(_link(colocated, "b", "hybrid"), 96)
    assert colocated.peer.holder(_req(), a) is None  # no hand-off to send the prefix back


async def test_a_hybrid_prefix_reaches_only_as_far_as_a_saved_state():
    mesh = _mesh()
    prefill, decode = _link(mesh, "p", "prefill", checkpoints=4), _link(mesh, "d", "decode", checkpoints=4)
    _cache(prefill, 96)  # blocks, but no state: worth nothing
    _cache(decode, 112, state_at=4)
    assert mesh.peer.holder(_req(), prefill) == (decode, 64)
    _cache(prefill, 48, state_at=3)
    assert mesh.peer.holder(_req(), prefill) == (decode, 64)
    _cache(prefill, 80, state_at=5)
    assert mesh.peer.holder(_req(), prefill) is None


@pytest.mark.parametrize("hybrid", [False, True], ids=["attention", "hybrid"])
async def test_a_failed_read_computes_the_prompt_and_lets_go_of_what_it_held(hybrid):
    mesh = _mesh()
    n = 4 if hybrid else 0
    prefill, decode = _link(mesh, "p", "prefill", checkpoints=n), _link(mesh, "d", "decode", checkpoints=n)
    _cache(decode, 112, state_at=7 if hybrid else None)
    req = _req()
    with anyio.fail_after(10):
        assert await mesh.peer.admit(req, prefill)
    # The pull failed (nothing listens): the prompt runs whole on the prefill worker, queued first.
    assert req.status is RequestStatus.WAITING and req.num_computed_tokens == 0 and prefill.core.waiting[0] is req
    assert mesh.peer.reads == {"done": 0, "failed": 1} and mesh.peer.tokens == 0 and not mesh.decode_for
    # The decode worker holds nothing for it: no staging entry, every block free and still cached.
    core = decode.core
    assert not core.arriving and not core.requests and core.blocks.num_free == 32 and core.blocks.num_cached == 7
    if hybrid:  # the checkpoint the read pinned can make room again
        for h in (1, 2, 3, 4):  # one plan's saves each
            core.checkpoints.assign(h)
            core.checkpoints.end_plan()
        assert mesh.peer.holder(_req("again"), prefill) is None


async def test_the_read_waits_for_the_decode_workers_plans_in_flight():
    """A block is cached as soon as the plan computing it is sent: it is read only once that plan ran."""
    mesh = _mesh()
    prefill, decode = _link(mesh, "p", "prefill"), _link(mesh, "d", "decode")
    _cache(decode, 64)
    decode.note_sent(7)  # a plan still running there
    req = _req()
    async with anyio.create_task_group() as tg:
        tg.start_soon(mesh.peer.admit, req, prefill)
        await anyio.sleep(0.3)
        assert req.status is RequestStatus.ARRIVING and "r#peer" in decode.core.arriving  # held, not read
        assert mesh.where["r"] is prefill
        decode.note_done(7)
    assert req.status is RequestStatus.WAITING and not decode.core.arriving  # read (failed), let go


async def test_an_abort_during_the_read_frees_every_block_once_the_read_ended():
    """Aborted while its read waits: the prefill worker keeps the blocks the pull writes into until it ended
    (landing), then frees them; the decode worker's staging entry goes too. Nothing leaks on either side."""
    from tokenizers import Tokenizer

    from services.engine.builtin_model import ensure_default_model
    from services.scheduler.tracked import TrackedRequest

    mesh = _mesh()
    prefill, decode = _link(mesh, "p", "prefill"), _link(mesh, "d", "decode")
    _cache(decode, 64)
    decode.note_sent(3)
    req = _req()
    tokenizer = Tokenizer.from_file(str(ensure_default_model() / "tokenizer.json"))
    mesh.tracked["r"] = TrackedRequest(req, tokenizer, 0.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mesh.peer.admit, req, prefill)
        await anyio.sleep(0.3)
        assert mesh.abort("r") and req in prefill.core.landing  # its blocks wait for the read to end
        decode.note_done(3)
    assert not prefill.core.landing and not prefill.core.requests
    assert prefill.core.blocks.num_free == 32 and decode.core.blocks.num_free == 32 and not decode.core.arriving
    prefill.core.check_integrity()
    decode.core.check_integrity()
