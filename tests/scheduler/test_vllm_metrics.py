"""The mesh's load under vLLM's metric names (services/scheduler/vllm_metrics.py), over real per-worker cores."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from services.common.sampling_params import SamplingParams
from services.common.step import LoraRef
from services.scheduler.config import SchedulerServiceConfig
from services.scheduler.core.request import Request
from services.scheduler.mesh import Mesh
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.vllm_metrics import VllmMetrics
from tests.scheduler.links import add_link

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"  # worker links open grpc.aio channels, which need the running loop


def _registry(mesh, loras=None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(VllmMetrics(mesh, "tiny", loras=loras, clock=lambda: 1234.5))
    return registry


async def test_the_queue_the_running_requests_and_the_kv_pools_read_as_vllm_names_them():
    mesh = Mesh(SchedulerServiceConfig(mode="colocated"))
    a, b = add_link(mesh, "a", "hybrid", blocks=4), add_link(mesh, "b", "hybrid", blocks=12)
    sql = LoraRef("sql", "/loras/sql")
    for i, lora in enumerate((sql, None, LoraRef("chat", "/loras/chat"))):  # 40 tokens: 3 of a's 4 blocks
        a.core.add(Request(f"r{i}", list(range(3, 43)), SamplingParams(max_tokens=8), 0.0, lora=lora))
    a.core.schedule(0.0)  # r0 runs; the others wait for blocks
    registry = _registry(mesh, lambda: ["sql", "chat", "idle"])

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model_name": "tiny", **labels})

    assert value("vllm:num_requests_waiting") == 2 and value("vllm:num_requests_running") == 1
    assert value("vllm:kv_cache_usage_perc") == value("vllm:gpu_cache_usage_perc") == 3 / 16
    assert registry.get_sample_value("vllm:cache_config_info", {"block_size": "16", "num_gpu_blocks": "16"}) == 1
    assert registry.get_sample_value("vllm:lora_requests_info", {
        "max_lora": "3", "running_lora_adapters": "sql", "waiting_lora_adapters": "chat"}) == 1234.5
    assert b.core.blocks.num_free == 12  # the idle worker's pool counts as free
    assert value("vllm:num_preemptions_total") == 0
    # r0's 40-token prompt: two full blocks looked up, none cached yet (as vLLM counts them: tokens).
    assert value("vllm:prefix_cache_queries_total") == 32 and value("vllm:prefix_cache_hits_total") == 0
    assert b'vllm:lora_requests_info{max_lora="3"' in generate_latest(registry)  # the whole scrape renders


async def test_no_lora_series_without_adapters_and_no_pool_without_workers():
    registry = _registry(Mesh(SchedulerServiceConfig()))
    names = {m.name for m in registry.collect()}
    assert "vllm:lora_requests_info" not in names
    assert registry.get_sample_value("vllm:kv_cache_usage_perc", {"model_name": "tiny"}) == 0
    assert not [s for m in registry.collect() if m.name == "vllm:cache_config_info" for s in m.samples]


async def test_request_latencies_and_counts_read_as_vllm_names_them_summed_over_seawalls_labels():
    metrics = SchedulerMetrics()
    m = metrics.requests
    m.ttft.labels("high").observe(0.004)
    m.ttft.labels("normal").observe(0.2)
    m.ttft.labels("normal").observe(3.0)
    m.tbt.observe(0.02)
    m.prompt_tokens.inc(37)
    m.generation_tokens.inc(12)
    m.finished.labels("stop").inc(2)
    m.finished.labels("length").inc()
    registry = CollectorRegistry()
    registry.register(VllmMetrics(Mesh(SchedulerServiceConfig()), "tiny", m))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model_name": "tiny", **labels})

    assert value("vllm:time_to_first_token_seconds_count") == 3
    assert value("vllm:time_to_first_token_seconds_sum") == pytest.approx(3.204)
    assert value("vllm:time_to_first_token_seconds_bucket", le="0.005") == 1  # both classes' buckets
    assert value("vllm:time_to_first_token_seconds_bucket", le="+Inf") == 3
    assert value("vllm:inter_token_latency_seconds_count") == 1
    assert value("vllm:e2e_request_latency_seconds_count") is None  # nothing observed yet: no series
    assert value("vllm:prompt_tokens_total") == 37 and value("vllm:generation_tokens_total") == 12
    assert value("vllm:request_success_total", finished_reason="stop") == 2
    assert value("vllm:request_success_total", finished_reason="length") == 1
