"""``python -m services.kvcache`` as a real process: flags, health, a store over gRPC, SIGTERM flushes DRAM to
disk and exits 0, and a restarted process serves what the disk tier holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import grpc.aio
import pytest

from seawall.launcher import free_port
from seawall.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc
from services.common.grpc_server import wait_healthy
from services.kvcache.main import parse_args
from tests.kvcache.conftest import BPB, chain

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def _spawn(port: int, disk: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "services.kvcache", "--port", str(port), "--dram-bytes", str(8 * BPB),
         "--disk-dir", str(disk), "--disk-bytes", str(64 * (BPB + 64)), "--no-nixl", "--log-level", "WARNING"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _terminate(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return proc.returncode, out.decode(errors="replace")


def test_flags_make_a_config_and_bad_combinations_exit_2(tmp_path):
    config = parse_args(["--dram-bytes", "4096", "--disk-dir", str(tmp_path), "--disk-bytes", "9999", "--no-nixl",
                         "--port", "1234"])
    assert (config.dram_bytes, config.disk_dir, config.disk_bytes, config.nixl, config.port) == \
        (4096, str(tmp_path), 9999, False, 1234)
    with pytest.raises(SystemExit) as exc:
        parse_args(["--disk-dir", str(tmp_path)])
    assert exc.value.code == 2
    config = parse_args(["--metrics-port", "9400", "--otlp-endpoint", "http://127.0.0.1:4317", "--storage-gbps",
                         "1.5"])
    assert (config.metrics_port, config.otlp_endpoint, config.storage_gbps) == (9400, "http://127.0.0.1:4317", 1.5)
    assert parse_args([]).storage_gbps == 0 and parse_args([]).metrics_port == 0  # off by default
    with pytest.raises(SystemExit) as exc:
        parse_args(["--storage-gbps", "-1"])
    assert exc.value.code == 2


async def test_the_process_serves_stores_and_survives_a_restart_from_disk(make_worker, tmp_path):
    worker = await make_worker(seed=4, nixl=False)
    hashes = chain(3)
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = _spawn(port, tmp_path)
    try:
        assert await wait_healthy(address, 30, service="seawall.v1.KVCache"), proc
        async with grpc.aio.insecure_channel(address) as channel:
            stub = kvcache_pb2_grpc.KVCacheStub(channel)
            r = await stub.Store(kvcache_pb2.StoreRequest(transfer_id="s", source=worker.endpoint(nixl=False),
                                                          source_block_ids=[5, 6, 7], block_hashes=hashes,
                                                          transport=common_pb2.KV_TRANSPORT_GRPC), timeout=20)
            assert (r.status, r.num_blocks_stored) == (common_pb2.TRANSFER_STATUS_DONE, 3), r.error
    finally:
        code, out = _terminate(proc)
    assert code == 0, out
    assert len(list((tmp_path / "blocks").rglob("*.kv"))) == 3  # flushed on SIGTERM

    proc = _spawn(port, tmp_path)
    try:
        assert await wait_healthy(address, 30), proc
        async with grpc.aio.insecure_channel(address) as channel:
            stub = kvcache_pb2_grpc.KVCacheStub(channel)
            r = await stub.Lookup(kvcache_pb2.LookupRequest(block_hashes=hashes), timeout=10)
            assert (r.num_cached_blocks, r.num_disk_blocks) == (3, 3)
            worker.pool.device_kv.zero_()
            r = await stub.Load(kvcache_pb2.LoadRequest(transfer_id="l", target=worker.endpoint(nixl=False),
                                                        block_hashes=hashes, target_block_ids=[5, 6, 7]), timeout=20)
            assert (r.status, r.num_disk_blocks) == (common_pb2.TRANSFER_STATUS_DONE, 3), r.error
            assert worker.pool.device_kv[[5, 6, 7]].abs().sum() > 0
    finally:
        code, out = _terminate(proc)
    assert code == 0, out
