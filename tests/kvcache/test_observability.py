"""kvcache metrics and traces: a real ``python -m services.kvcache`` process scraped over HTTP (parsed with
prometheus_client's parser) and exporting spans to a real OTLP/gRPC receiver; in-process, the counters that
need a particular state (a refused call, evictions, a queue).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import grpc
import grpc.aio
import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from seawall.launcher import free_port
from seawall.trace_receiver import TraceReceiver
from seawall.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc
from services.common import tracing as tr
from services.common.grpc_server import wait_healthy
from tests.kvcache.conftest import BPB, chain

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
GRPC = common_pb2.KV_TRANSPORT_GRPC
DONE = common_pb2.TRANSFER_STATUS_DONE
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
METADATA = (("traceparent", f"00-{TRACE_ID}-{CALLER_SPAN}-01"),)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} of a Prometheus text exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(found: dict, name: str, **labels) -> float:
    return found[(name, tuple(sorted(labels.items())))]


async def _wait_spans(receiver: TraceReceiver, names: set[str], timeout_s: float = 20.0):
    with anyio.move_on_after(timeout_s):
        while not names <= {s.name for s in receiver.trace(TRACE_ID)}:
            await anyio.sleep(0.1)
    return {s.name: s for s in receiver.trace(TRACE_ID)}


async def test_a_kvcache_process_serves_metrics_and_exports_spans_in_the_callers_trace(make_worker, tmp_path):
    worker = await make_worker(seed=3, nixl=False)
    hashes = chain(4)
    port, metrics_port = free_port(), free_port()
    with TraceReceiver() as receiver:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.kvcache", "--port", str(port), "--metrics-port", str(metrics_port),
             "--otlp-endpoint", receiver.endpoint, "--dram-bytes", str(8 * BPB), "--disk-dir", str(tmp_path),
             "--disk-bytes", str(64 * (BPB + 64)), "--no-nixl", "--log-level", "WARNING"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "OTEL_BSP_SCHEDULE_DELAY": "100"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            address = f"127.0.0.1:{port}"
            assert await wait_healthy(address, 30, service="seawall.v1.KVCache"), proc
            async with grpc.aio.insecure_channel(address) as channel:
                stub = kvcache_pb2_grpc.KVCacheStub(channel)
                r = await stub.Store(kvcache_pb2.StoreRequest(
                    transfer_id="s1", source=worker.endpoint(nixl=False), source_block_ids=[0, 1, 2],
                    block_hashes=hashes[:3], transport=GRPC), timeout=20, metadata=METADATA)
                assert r.status == DONE, r.error
                r = await stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=hashes, pin_ms=500), timeout=10,
                                      metadata=METADATA)
                assert r.num_cached_blocks == 3
                r = await stub.Load(kvcache_pb2.LoadRequest(
                    transfer_id="l1", target=worker.endpoint(nixl=False), block_hashes=hashes[:3],
                    target_block_ids=[10, 11, 12], transport=GRPC, path=kvcache_pb2.KV_READ_PATH_DE_READ),
                    timeout=20, metadata=METADATA)
                assert (r.status, r.bytes) == (DONE, 3 * BPB), r.error
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)).text
            spans = await _wait_spans(receiver, {tr.SPAN_KVCACHE_LOOKUP, tr.SPAN_KVCACHE_LOAD, tr.SPAN_KVCACHE_STORE})
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out.decode(errors="replace")

    m = samples(text)
    assert value(m, "seawall_kvcache_lookups_total") == 1
    assert value(m, "seawall_kvcache_lookup_blocks_total", result="dram") == 3
    assert value(m, "seawall_kvcache_lookup_blocks_total", result="miss") == 1
    assert value(m, "seawall_kvcache_hit_ratio", tier="all") == pytest.approx(0.75)
    assert value(m, "seawall_kvcache_hit_ratio", tier="disk") == 0
    assert value(m, "seawall_kvcache_load_bytes_total", path="de_read", transport="grpc") == 3 * BPB
    assert value(m, "seawall_kvcache_store_bytes_total", transport="grpc") == 3 * BPB
    assert value(m, "seawall_kvcache_tier_read_bytes_total", tier="dram") == 3 * BPB
    assert value(m, "seawall_kvcache_tier_written_bytes_total", tier="dram") == 3 * BPB
    assert value(m, "seawall_kvcache_tier_used_bytes", tier="dram") == 3 * BPB
    assert value(m, "seawall_kvcache_tier_capacity_bytes", tier="dram") == 8 * BPB
    assert value(m, "seawall_kvcache_tier_capacity_bytes", tier="disk") == 64 * (BPB + 64)
    assert value(m, "seawall_kvcache_evictions_total", tier="dram") == 0
    for method, status in (("lookup", "ok"), ("load", "done"), ("store", "done")):
        assert value(m, "seawall_kvcache_requests_total", method=method, status=status) == 1
        assert value(m, "seawall_kvcache_request_seconds_count", method=method) == 1
    assert value(m, "seawall_kvcache_queue_depth") == 0
    assert value(m, "seawall_gc_frozen_objects") > 10_000  # start-up objects out of the collector's reach

    assert {s.service for s in spans.values()} == {tr.KVCACHE}
    assert all(s.parent_span_id == CALLER_SPAN for s in spans.values())  # children of the caller's span
    lookup, load, store = spans[tr.SPAN_KVCACHE_LOOKUP].attributes, spans[tr.SPAN_KVCACHE_LOAD].attributes, \
        spans[tr.SPAN_KVCACHE_STORE].attributes
    assert (lookup[tr.KV_REQUESTED_BLOCKS], lookup[tr.KV_BLOCKS], lookup[tr.KV_DRAM_BLOCKS],
            lookup[tr.KV_DISK_BLOCKS], lookup[tr.KV_TIER], lookup[tr.KV_STATUS]) == (4, 3, 3, 0, "dram", "ok")
    assert (load[tr.KV_BLOCKS], load[tr.KV_BYTES], load[tr.KV_READ_PATH], load[tr.KV_PATH], load[tr.KV_STATUS],
            load[tr.KV_TRANSFER_ID], load[tr.KV_ROUNDS]) == (3, 3 * BPB, "de_read", "grpc", "done", "l1", 1)
    assert load[tr.KV_GBPS] > 0 and load[tr.KV_ENDPOINT] == worker.endpoint(nixl=False).agent_name
    assert (store[tr.KV_BLOCKS], store[tr.KV_PRESENT_BLOCKS], store[tr.KV_BYTES], store[tr.KV_PATH],
            store[tr.KV_STATUS]) == (3, 0, 3 * BPB, "grpc", "done")


async def test_refused_calls_evictions_and_disk_hits_are_counted(make_kvcache, make_worker, tmp_path):
    kv = await make_kvcache(dram_blocks=4, disk_dir=tmp_path, disk_blocks=32)
    worker = await make_worker(seed=5)
    hashes = chain(8)
    r = await kv.stub.Store(kvcache_pb2.StoreRequest(transfer_id="s", source=worker.endpoint(),
                                                     source_block_ids=list(range(8)), block_hashes=hashes),
                            timeout=30)
    assert r.status == DONE, r.error
    r = await kv.stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=hashes), timeout=10)
    assert (r.num_dram_blocks, r.num_disk_blocks) == (4, 4)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kv.stub.Load(kvcache_pb2.LoadRequest(transfer_id="bad", target=worker.endpoint(),
                                                   block_hashes=hashes[:2], target_block_ids=[1]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    m = samples(generate_latest(kv.servicer.metrics.registry).decode())
    assert value(m, "seawall_kvcache_requests_total", method="load", status="invalid_argument") == 1
    assert value(m, "seawall_kvcache_evictions_total", tier="dram") == 4
    assert value(m, "seawall_kvcache_tier_blocks", tier="disk") == 4
    assert value(m, "seawall_kvcache_lookup_blocks_total", result="disk") == 4
    assert value(m, "seawall_kvcache_hit_ratio", tier="dram") == pytest.approx(0.5)
    assert value(m, "seawall_kvcache_hit_ratio", tier="disk") == pytest.approx(0.5)
    assert value(m, "seawall_kvcache_corrupt_blocks_total") == 0
    assert not any(name.startswith("seawall_shaper") for name, _ in m)  # shaping is off


async def test_a_load_in_flight_shows_in_its_endpoints_queue_and_the_shaper_backlog(make_kvcache, make_worker):
    rate_gbps = 16 * BPB / 0.5 / 1e9  # 16 blocks take about 0.5 s past the burst
    kv = await make_kvcache(dram_blocks=64, storage_gbps=rate_gbps)
    worker = await make_worker(seed=6, num_blocks=64)
    hashes = chain(32)
    r = await kv.stub.Store(kvcache_pb2.StoreRequest(transfer_id="s", source=worker.endpoint(),
                                                     source_block_ids=list(range(32)), block_hashes=hashes),
                            timeout=30)
    assert r.status == DONE, r.error
    registry = kv.servicer.metrics.registry
    node = worker.endpoint().agent_name
    async with anyio.create_task_group() as tg:
        async def load():
            r = await kv.stub.Load(kvcache_pb2.LoadRequest(
                transfer_id="l", target=worker.endpoint(), block_hashes=hashes, target_block_ids=list(range(32, 64)),
                path=kvcache_pb2.KV_READ_PATH_PE_READ), timeout=30)
            assert r.status == DONE, r.error

        tg.start_soon(load)
        start = time.monotonic()
        while True:
            m = samples(generate_latest(registry).decode())
            if ("seawall_kvcache_queued_loads", (("endpoint", node),)) in m or time.monotonic() - start > 5:
                break
            await anyio.sleep(0.01)
        assert value(m, "seawall_kvcache_queued_loads", endpoint=node) == 1
        assert value(m, "seawall_kvcache_queued_bytes", endpoint=node) == 32 * BPB
        assert value(m, "seawall_kvcache_queue_depth") == 1
        assert value(m, "seawall_shaper_backlog_seconds", **{"class": "storage", "node": node,
                                                              "direction": "in"}) > 0.1
    m = samples(generate_latest(registry).decode())
    assert ("seawall_kvcache_queued_loads", (("endpoint", node),)) not in m
    shaped = {"class": "storage", "node": node}
    assert value(m, "seawall_shaper_bytes_total", **shaped, direction="in") == 32 * BPB
    assert value(m, "seawall_shaper_bytes_total", **shaped, direction="out") == 32 * BPB
    assert value(m, "seawall_shaper_wait_seconds_total", **shaped, direction="in") > 0.4  # less a 16-block burst
    assert value(m, "seawall_shaper_rate_bytes_per_second", **{"class": "storage"}) == pytest.approx(rate_gbps * 1e9)
    assert value(m, "seawall_kvcache_load_bytes_total", path="pe_read", transport="nixl") == 32 * BPB
