"""kvcache throughput: the disk tier's files, and Load/Store through a real ``python -m services.kvcache`` process.

Not a test (pytest does not collect it); run it by hand::

    .venv/bin/python tests/kvcache/bench_kvcache.py [--total-mib 256] [--rounds 3] [--json OUT]

1. **Disk tier** (in this process, into a temp dir under ``--dir``): ``--total-mib`` of blocks written with
   ``DiskTier.write`` (one file per block, CRC-32, rename) and read back with ``DiskTier.read_into`` — warm
   (page cache) and cold (each file dropped from the page cache with ``posix_fadvise(DONTNEED)`` first, after
   an fsync so the pages can go) — at block sizes 64 KiB, 512 KiB and 4 MiB. Baselines from the same run: one
   append-only file of the same bytes written and read back sequentially (what an append log would do), and
   CRC-32 alone over the same bytes.
2. **Service** (two processes on this host): a worker here (a ``PagedKVPool`` of 512 KiB blocks with a NIXL
   agent and a grpc.aio ReadKV/WriteKV server) and the kvcache as a subprocess. Store of every block (NIXL
   READ), Load of every block from DRAM (NIXL WRITE), the same two over gRPC, and a Load served from the disk
   tier (a second kvcache whose DRAM holds an eighth of the data: every block is staged through DRAM in
   rounds), warm and cold. Baseline: ``torch`` memcpy of the same bytes. GB/s = 10^9 bytes / wall time of
   the RPC as the client sees it; best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import grpc  # noqa: E402
import grpc.aio  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from seawall.launcher import free_port  # noqa: E402
from seawall.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc, worker_pb2_grpc  # noqa: E402
from services.common.block_hash import extend_hashes, hash_seed  # noqa: E402
from services.common.grpc_kv import GRPC_KV_OPTIONS, serve_read_kv, serve_write_kv  # noqa: E402
from services.common.grpc_server import wait_healthy  # noqa: E402
from services.common.kv_transport import NixlKVAgent, kv_layout_proto  # noqa: E402
from services.engine.kv_pool import KVLayout, PagedKVPool  # noqa: E402
from services.kvcache.disk_tier import DiskTier  # noqa: E402

GB = 1e9


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / GB / seconds


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def bench_disk(root: Path, total: int, block_bytes: int, rounds: int) -> dict[str, float]:
    heads = max(1, block_bytes // (16 * 2 * 2 * 64 * 2))  # 2 layers, fp16, head_dim 64, block 16 → heads
    layout = KVLayout(num_layers=2, block_size=16, num_kv_heads=heads, head_dim=64, dtype=torch.float16)
    bpb = layout.bytes_per_block
    n = max(1, total // bpb)
    data = np.random.default_rng(0).integers(0, 256, (n, bpb), dtype=np.uint8)
    out = np.empty_like(data)
    res: dict[str, list[float]] = {k: [] for k in ("write", "read warm", "read cold", "log write", "log read cold",
                                                   "crc32")}
    for r in range(rounds):
        d = root / f"r{r}-{bpb}"
        disk = DiskTier(d)
        t = time.perf_counter()
        for i in range(n):
            disk.write(i, layout, memoryview(data[i]))
        res["write"].append(_gbps(n * bpb, time.perf_counter() - t))
        t = time.perf_counter()
        for i in range(n):
            disk.read_into(i, layout, memoryview(out[i]))
        res["read warm"].append(_gbps(n * bpb, time.perf_counter() - t))
        assert np.array_equal(out, data)
        for i in range(n):
            _drop_cache(disk.path(i))
        t = time.perf_counter()
        for i in range(n):
            disk.read_into(i, layout, memoryview(out[i]))
        res["read cold"].append(_gbps(n * bpb, time.perf_counter() - t))

        log = d / "append.log"
        t = time.perf_counter()
        with open(log, "wb", buffering=0) as f:
            for i in range(n):
                f.write(memoryview(data[i]))
        res["log write"].append(_gbps(n * bpb, time.perf_counter() - t))
        _drop_cache(log)
        t = time.perf_counter()
        with open(log, "rb", buffering=0) as f:
            for i in range(n):
                f.readinto(memoryview(out[i]))
        res["log read cold"].append(_gbps(n * bpb, time.perf_counter() - t))
        t = time.perf_counter()
        for i in range(n):
            zlib.crc32(data[i])
        res["crc32"].append(_gbps(n * bpb, time.perf_counter() - t))
        shutil.rmtree(d)
    return {k: max(v) for k, v in res.items()}


class _KVServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, pool: PagedKVPool) -> None:
        self.pool = pool

    async def ReadKV(self, request, context):
        async for chunk in serve_read_kv(self.pool, request):
            yield chunk

    async def WriteKV(self, request_iterator, context):
        return await serve_write_kv(self.pool, request_iterator)


def _spawn(port: int, dram: int, disk_dir: Path, disk_bytes: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "services.kvcache", "--port", str(port), "--dram-bytes", str(dram),
         "--disk-dir", str(disk_dir), "--disk-bytes", str(disk_bytes), "--no-flush-on-exit",
         "--log-level", "WARNING"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


async def bench_service(root: Path, total: int, rounds: int) -> dict[str, float]:
    layout = KVLayout(num_layers=16, block_size=16, num_kv_heads=8, head_dim=64, dtype=torch.float16)
    bpb = layout.bytes_per_block  # 512 KiB
    n = total // bpb
    src = PagedKVPool(layout, n, 0, torch.device("cpu"))
    src.device_kv.copy_(torch.randn(src.device_kv.shape, generator=torch.Generator().manual_seed(0)))
    dst = PagedKVPool(layout, n, 0, torch.device("cpu"))
    res: dict[str, list[float]] = {}

    t = time.perf_counter()
    dst.device_kv.copy_(src.device_kv)
    t = time.perf_counter()
    for _ in range(rounds):
        dst.device_kv.copy_(src.device_kv)
    res["memcpy"] = [_gbps(n * bpb * rounds, time.perf_counter() - t)]

    agent = NixlKVAgent("bench-worker", dst)  # loads land in dst, stores read from src through a second agent
    src_agent = NixlKVAgent("bench-source", src)
    server = grpc.aio.server(options=GRPC_KV_OPTIONS)
    worker_pb2_grpc.add_WorkerServicer_to_server(_KVServicer(dst), server)
    wport = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    src_server = grpc.aio.server(options=GRPC_KV_OPTIONS)
    worker_pb2_grpc.add_WorkerServicer_to_server(_KVServicer(src), src_server)
    sport = src_server.add_insecure_port("127.0.0.1:0")
    await src_server.start()

    def endpoint(a: NixlKVAgent, port: int) -> common_pb2.KVEndpoint:
        ep = common_pb2.KVEndpoint(agent_name=a.name, kv_layout=kv_layout_proto(layout),
                                   grpc_address=f"127.0.0.1:{port}")
        ep.agent_metadata.CopyFrom(a.metadata())
        return ep

    tokens = list(range(n * 16))
    hashes = extend_hashes([], tokens, 16, hash_seed("bench", 16))
    ids = list(range(n))
    procs = []
    try:
        for label, dram in (("dram", 2 * (rounds + 1) * total + (1 << 20)), ("disk", total // 8)):
            port = free_port()
            disk_dir = root / f"kv-{label}"
            procs.append(_spawn(port, dram, disk_dir, 2 * total + (1 << 20)))
            address = f"127.0.0.1:{port}"
            assert await wait_healthy(address, 60), f"kvcache ({label}) did not start"
            async with grpc.aio.insecure_channel(address) as channel:
                stub = kvcache_pb2_grpc.KVCacheStub(channel)
                for transport, tname in ((common_pb2.KV_TRANSPORT_NIXL, "nixl"), (common_pb2.KV_TRANSPORT_GRPC, "grpc")):
                    if label == "disk" and tname == "grpc":
                        continue
                    for r in range(rounds + 1):  # round 0 warms up (connections, first touch of DRAM)
                        hs = [h ^ (r << 48) ^ (transport << 56) for h in hashes]  # new blocks each round
                        t = time.perf_counter()
                        s = await stub.Store(kvcache_pb2.StoreRequest(
                            transfer_id=f"s{label}{tname}{r}", source=endpoint(src_agent, sport),
                            source_block_ids=ids, block_hashes=hs, transport=transport), timeout=120)
                        ts = time.perf_counter() - t
                        assert s.status == common_pb2.TRANSFER_STATUS_DONE and s.num_blocks_stored == n, s
                        if label == "disk":
                            for f in disk_dir.rglob("*.kv"):
                                _drop_cache(f)
                        dst.device_kv.zero_()
                        t = time.perf_counter()
                        lo = await stub.Load(kvcache_pb2.LoadRequest(
                            transfer_id=f"l{label}{tname}{r}", target=endpoint(agent, wport), block_hashes=hs,
                            target_block_ids=ids, transport=transport), timeout=120)
                        tl = time.perf_counter() - t
                        assert lo.status == common_pb2.TRANSFER_STATUS_DONE, lo
                        assert torch.equal(dst.device_kv, src.device_kv)
                        if r:
                            what = f"{label} {tname}"
                            res.setdefault(f"store → {what}", []).append(_gbps(n * bpb, ts))
                            res.setdefault(f"load ← {what} ({lo.num_dram_blocks} dram, {lo.num_disk_blocks} disk)",
                                           []).append(_gbps(n * bpb, tl))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
        await server.stop(None)
        await src_server.stop(None)
        agent.close()
        src_agent.close()
    return {k: max(v) for k, v in res.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total-mib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=None, help="where the disk tier lives (default: a temp dir)")
    p.add_argument("--skip-disk", action="store_true")
    p.add_argument("--skip-service", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    total = args.total_mib << 20
    root = Path(tempfile.mkdtemp(prefix="kvcache-bench-", dir=args.dir))
    results: dict[str, float] = {}
    try:
        if not args.skip_disk:
            for block in (64 << 10, 512 << 10, 4 << 20):
                for k, v in bench_disk(root, total, block, args.rounds).items():
                    results[f"disk {block >> 10} KiB blocks: {k}"] = v
        if not args.skip_service:
            results.update(anyio.run(bench_service, root, total, args.rounds))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for k, v in results.items():
        print(f"{k:60s} {v:7.2f} GB/s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
