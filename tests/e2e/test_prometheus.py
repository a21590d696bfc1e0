"""A real Prometheus server (Debian's ``prometheus``) scrapes every service of a live mesh, and the queried
series move as expected after a burst: requests are counted, and every block is free again afterwards."""

from __future__ import annotations

import shutil
import subprocess
import time
from urllib.parse import urlparse

import anyio
import httpx
import pytest

from seawall import AsyncClient
from seawall.launcher import free_port
from tests.e2e.conftest import random_prompts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

if shutil.which("prometheus") is None:
    pytest.skip("needs Debian's prometheus package (apt-get install prometheus)", allow_module_level=True)


@pytest.fixture
def prometheus(default_mesh, tmp_path):
    targets = {name: urlparse(url) for name, url in default_mesh.metrics_urls.items()}
    jobs = "\n".join(f"  - job_name: {name}\n    metrics_path: {u.path}\n    static_configs:\n"
                     f"      - targets: ['{u.netloc}']" for name, u in targets.items())
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 500ms\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}\n")
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _until(lambda: _up_targets(url) == set(targets), "every target up")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def _query(url: str, promql: str) -> list[dict]:
    reply = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


def _up_targets(url: str) -> set[str]:
    try:
        return {r["metric"]["job"] for r in _query(url, "up == 1")}
    except (httpx.HTTPError, ValueError):  # not listening yet, or a plain-text 503 while its TSDB opens
        return set()


def _until(check, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def _value(url: str, promql: str) -> float:
    result = _query(url, promql)
    return float(result[0]["value"][1]) if result else 0.0


def test_prometheus_sees_a_burst_counted_and_every_block_returned(default_mesh, prometheus):
    before = _value(prometheus, "sum(seawall_requests_finished_total{job='scheduler'})")

    async def burst():
        async with AsyncClient(default_mesh.grpc_address) as client:
            async with anyio.create_task_group() as tg:
                for prompt in random_prompts([30, 60, 90, 120, 150, 180], seed=41):
                    tg.start_soon(lambda p=prompt: client.generate(p, max_tokens=8, ignore_eos=True))

    anyio.run(burst)
    _until(lambda: _value(prometheus, "sum(seawall_requests_finished_total{job='scheduler'})") >= before + 6,
           "the six requests counted")
    # Tokens were streamed and steps ran on both workers, as each one reports it. Each target is scraped on its
    # own clock, so a worker's latest sample may predate the burst that the scheduler's already shows: wait.
    assert _value(prometheus, "sum(seawall_request_ttft_seconds_count)") >= 6
    for worker in ("prefill-0", "decode-1"):
        _until(lambda w=worker: _value(prometheus, f"sum(seawall_step_seconds_count{{job='{w}'}})") > 0,
               f"{worker}'s steps counted", timeout_s=10)
    _until(lambda: _value(prometheus, "sum(seawall_kv_transfer_bytes_total{job='decode-1'})") > 0,
           "decode-1's KV transfer counted", timeout_s=10)
    # Every block is free again (the scheduler's view, per worker pool).
    _until(lambda: _query(prometheus, "sum(seawall_kv_blocks{state='used'}) == 0"), "all blocks free")
    assert _value(prometheus, "sum(seawall_requests{state='running'})") == 0
    # The same under vLLM's names (vllm_metrics.py), which the Gateway API Inference Extension's endpoint
    # picker reads: a real Prometheus takes them as they are.
    _until(lambda: _query(prometheus, "vllm:kv_cache_usage_perc{job='scheduler'} == 0"), "vLLM's KV usage at 0")
    assert _value(prometheus, "vllm:num_requests_running") == 0 == _value(prometheus, "vllm:num_requests_waiting")
    (info,) = _query(prometheus, "vllm:cache_config_info{job='scheduler'}")
    assert info["metric"]["block_size"] == "16" and int(info["metric"]["num_gpu_blocks"]) > 0
    assert _value(prometheus, "vllm:time_to_first_token_seconds_count{job='scheduler'}") >= 6
    assert _value(prometheus, "vllm:generation_tokens_total{job='scheduler'}") >= 6 * 8
