"""The scheduler's scrape-time metrics over real per-worker cores (no worker processes)."""

from __future__ import annotations

import pytest

from services.common.sampling_params import SamplingParams
from services.common.step import LoraRef
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request
from services.scheduler.mesh import Mesh
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.worker_drain import Drain
from tests.scheduler.links import add_link


@pytest.fixture
def anyio_backend():
    return "asyncio"  # worker links open grpc.aio channels, which need the running loop


@pytest.mark.anyio
async def test_live_requests_are_counted_per_lora_adapter_and_state():
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))
    link = add_link(mesh, "w", "hybrid", blocks=4)  # room for one 40-token request at a time
    sql = LoraRef("sql", "/loras/sql")
    for i, lora in enumerate((sql, sql, None, LoraRef("chat", "/loras/chat"))):
        link.core.add(Request(f"r{i}", list(range(3, 43)), SamplingParams(max_tokens=8), 0.0, lora=lora))
    link.core.schedule(0.0)  # r0 starts; the others wait for blocks
    metrics = SchedulerMetrics()
    metrics.watch(mesh)

    def value(name: str, state: str) -> float | None:
        return metrics.registry.get_sample_value("seawall_lora_requests", {"lora_name": name, "state": state})

    assert (value("sql", "running"), value("sql", "waiting"), value("chat", "waiting")) == (1, 1, 1)
    assert value("chat", "running") is None
    assert metrics.registry.get_sample_value("seawall_requests", {"state": "waiting"}) == 3


@pytest.mark.anyio
async def test_draining_workers_are_counted_among_the_live_ones():
    mesh = Mesh(SchedulerServiceConfig())
    add_link(mesh, "p", "prefill")
    add_link(mesh, "d0", "decode").drain = Drain()
    add_link(mesh, "d1", "decode")
    metrics = SchedulerMetrics()
    metrics.watch(mesh)

    def value(name: str, role: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"role": role})

    assert (value("seawall_workers", "decode"), value("seawall_workers_draining", "decode")) == (2, 1)
    assert (value("seawall_workers", "prefill"), value("seawall_workers_draining", "prefill")) == (1, 0)
