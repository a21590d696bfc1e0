"""The mesh applies a step's result with its real per-worker cores and no worker processes: tokens stream to
their requests, and a request decoding on a prefill worker is handed off to a decode worker once one is
alive — never when the same result already ended it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tokenizers import Tokenizer

from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken, StepResult
from services.engine.builtin_model import ensure_default_model
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request
from services.scheduler.core.scheduler import SchedulerConfig
from services.scheduler.mesh import Mesh
from services.scheduler.tracked import TrackedRequest
from services.scheduler.worker_link import WorkerLink
from tests.scheduler.links import add_link

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _step(link: WorkerLink, token: int = 7) -> list:
    """One plan of ``link``'s core and a result where every sampling sequence gets ``token`` (several for a
    multi-step decode)."""
    plan = link.core.schedule()
    result = StepResult(plan.step_id)
    for rid, n in plan.num_scheduled_tokens.items():
        req = link.core.requests[rid]
        if (k := req.num_computed_tokens + n - req.num_tokens + 1) > 0:
            result.sampled[rid] = [SampledToken(token)] * k
    return plan, link.core.on_result(plan, result)


@pytest.mark.parametrize("max_tokens", [5, 9], ids=["group-ends-it", "goes-on"])
async def test_a_multi_step_result_on_a_prefill_worker_hands_off_at_most_once(max_tokens):
    core = SchedulerConfig(chunk_size=256, num_decode_steps=4)
    mesh = Mesh(replace(SchedulerServiceConfig(mode="disaggregated"), core=core))
    prefill = add_link(mesh, "p", "prefill")
    decode = add_link(mesh, "d", "decode")
    decode.alive = False  # the decode worker is gone: the prefill worker decodes
    tokenizer = Tokenizer.from_file(str(ensure_default_model() / "tokenizer.json"))
    tracked = TrackedRequest(Request("r", list(range(3, 40)), SamplingParams(max_tokens=max_tokens), 0.0),
                             tokenizer, 0.0)
    mesh.submit(tracked)
    assert mesh.where["r"] is prefill
    _, events = _step(prefill)  # the prompt: its first token, no decode worker to hand it to
    mesh._dispatch(prefill, events, now=1.0)
    assert mesh.where["r"] is prefill
    decode.alive = True  # back, while a 4-pass decode runs on the prefill worker
    plan, events = _step(prefill)
    assert plan.num_passes == 4 and len(events) == 4
    mesh._dispatch(prefill, events, now=1.0)
    if max_tokens == 5:  # the group's last token ended it: finished, not handed off
        assert tracked.finish_reason == "length" and "r" not in mesh.tracked
        assert not decode.arrivals and prefill.core.blocks.num_free == prefill.core.blocks.num_blocks
    else:  # handed off once, with every token of the group
        assert [a.request.request_id for a in decode.arrivals] == ["r"]
        assert tracked.request.output_token_ids == [7] * 5 and "r" not in mesh.where
