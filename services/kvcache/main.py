"""Process entry of the kvcache: ``python -m services.kvcache``.

Rebuilds the disk tier's index from its files, serves the KVCache service (plus health and reflection), and on
SIGTERM or SIGINT stops taking calls, lets the running ones finish (a grace period), writes DRAM-only blocks to
disk (``--no-flush-on-exit`` skips that) and exits 0.

Observability: ``--metrics-port`` serves Prometheus text, ``--otlp-endpoint`` (or the ``OTEL_*`` variables)
exports spans as ``seawall-kvcache`` (services/kvcache/observability.py). ``--storage-gbps`` shapes each worker
node's storage traffic to that bandwidth (services/common/shaper.py); off by default.
"""

from __future__ import annotations

import argparse
import logging
import os

import anyio
import anyio.to_thread

from seawall.v1 import kvcache_pb2, kvcache_pb2_grpc
from services.common import gc_pauses
from services.common import tracing as tr
from services.common.grpc_server import Server, run_service, wait_for_shutdown_signal
from services.common.heap import keep_freed_heap
from services.common.metrics import serve_metrics
from services.common.shaper import Shaper
from services.kvcache.config import KVCacheConfig
from services.kvcache.disk_tier import DiskTier
from services.kvcache.mover import Mover
from services.kvcache.observability import KVCacheMetrics
from services.kvcache.servicer import KVCacheServicer
from services.kvcache.store import KVStore

log = logging.getLogger(__name__)

_GRACE_S = 5.0


def parse_args(argv: list[str] | None) -> KVCacheConfig:
    d = KVCacheConfig()
    p = argparse.ArgumentParser(prog="python -m services.kvcache", description=__doc__)
    p.add_argument("--host", default=os.environ.get("SEAWALL_HOST", d.host), help="listen address")
    p.add_argument("--port", type=int, default=d.port, help="listen port (default: a free one, logged)")
    p.add_argument("--dram-bytes", type=int, default=d.dram_bytes,
                   help=f"bytes of the DRAM tier (default {d.dram_bytes})")
    p.add_argument("--state-bytes", type=int, default=d.state_bytes,
                   help="bytes of host memory for the recurrent states of models with linear-attention layers, "
                        f"stored with their blocks (default {d.state_bytes}; 0 = none)")
    p.add_argument("--state-disk-bytes", type=int, default=d.state_disk_bytes,
                   help="with --disk-dir: bytes of state files there (memory's evicted states, and the rest at exit; default "
                        f"{d.state_disk_bytes}; 0 = states in memory only)")
    p.add_argument("--disk-dir", default=None, help="directory of the disk tier (default: no disk tier)")
    p.add_argument("--disk-bytes", type=int, default=0, help="bytes the disk tier may fill (with --disk-dir)")
    p.add_argument("--io-threads", type=int, default=d.io_threads,
                   help=f"block files read or written at once (default {d.io_threads})")
    p.add_argument("--no-nixl", action="store_true", help="no NIXL agent: KV moves over the gRPC fallback")
    p.add_argument("--name", default="", help="NIXL agent name (default: kvcache-<host>-<pid>)")
    p.add_argument("--max-pin-ms", type=int, default=d.max_pin_ms, help="longest pin a Lookup may ask for")
    p.add_argument("--no-flush-on-exit", action="store_true",
                   help="on shutdown, do not write DRAM-only blocks to the disk tier")
    p.add_argument("--metrics-port", type=int, default=d.metrics_port, help="Prometheus text on this port (0 = off)")
    p.add_argument("--otlp-endpoint", default=None,
                   help="export traces over OTLP/gRPC here (default: $OTEL_EXPORTER_OTLP_ENDPOINT; unset = off)")
    p.add_argument("--storage-gbps", type=float, default=d.storage_gbps,
                   help="shape each worker node's storage traffic to this many GB/s (10^9 bytes/s) per direction, "
                        "loads and stores apart (default 0 = not shaped)")
    p.add_argument("--log-level", default=os.environ.get("SEAWALL_LOG_LEVEL", "INFO"))
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return KVCacheConfig(host=args.host, port=args.port, dram_bytes=args.dram_bytes, disk_dir=args.disk_dir,
                             state_bytes=args.state_bytes, state_disk_bytes=args.state_disk_bytes,
                             disk_bytes=args.disk_bytes, io_threads=args.io_threads, nixl=not args.no_nixl, name=args.name,
                             max_pin_ms=args.max_pin_ms, flush_on_exit=not args.no_flush_on_exit,
                             metrics_port=args.metrics_port, otlp_endpoint=args.otlp_endpoint,
                             storage_gbps=args.storage_gbps)
    except ValueError as exc:
        p.error(str(exc))


def build_store(config: KVCacheConfig) -> KVStore:
    """The store of a config, its disk index rebuilt from the files (blocking I/O)."""
    disk = DiskTier(config.disk_dir) if config.disk_dir is not None else None
    store = KVStore(config.dram_bytes, disk, config.disk_bytes, config.layout, max_pin_s=config.max_pin_ms / 1e3,
                    io_threads=config.io_threads, state_bytes=config.state_bytes,
                    state_disk_bytes=config.state_disk_bytes)
    store.recover()
    return store


async def start(config: KVCacheConfig) -> tuple[Server, KVCacheServicer]:
    """Builds the store and starts serving (in-process tests use this too); ``stop`` undoes it."""
    store = await anyio.to_thread.run_sync(build_store, config)
    mover = Mover(store, config.nixl, config.name, Shaper(storage_gbps=config.storage_gbps))
    metrics = KVCacheMetrics()
    servicer = KVCacheServicer(config, store, mover, metrics, tr.setup_tracing(tr.KVCACHE, config.otlp_endpoint))
    metrics.watch(servicer)
    server = Server()
    server.add(kvcache_pb2_grpc.add_KVCacheServicer_to_server, servicer,
               kvcache_pb2.DESCRIPTOR.services_by_name["KVCache"].full_name)
    await server.start(config.host, config.port)
    servicer.metrics_server = serve_metrics(metrics.registry, config.host, config.metrics_port)
    if config.storage_gbps:
        log.info("storage traffic shaped to %g GB/s per worker node and direction", config.storage_gbps)
    return server, servicer


async def stop(server: Server, servicer: KVCacheServicer, grace_s: float = _GRACE_S) -> None:
    await server.stop(grace_s)
    if servicer.config.flush_on_exit:
        written = await servicer.store.flush()
        if written:
            log.info("wrote %d DRAM-only blocks to the disk tier", written)
    await servicer.mover.close()
    servicer.store.close()
    if servicer.metrics_server is not None:
        servicer.metrics_server.shutdown()
        servicer.metrics_server.server_close()
    servicer.tracing.shutdown()


async def serve(config: KVCacheConfig) -> None:
    keep_freed_heap()  # the mover pushes and pulls KV chunks over gRPC: reuse their freed memory
    server, servicer = await start(config)
    gc_metrics = gc_pauses.after_startup(servicer.metrics.registry)
    log.info("kvcache serving on %s:%d (DRAM %d bytes, disk %s)", config.host, server.port, config.dram_bytes,
             f"{config.disk_bytes} bytes at {config.disk_dir}" if config.disk_dir else "none")
    try:
        await wait_for_shutdown_signal()
    finally:
        gc_metrics.close()
        with anyio.CancelScope(shield=True):
            await stop(server, servicer)


def main(argv: list[str] | None = None) -> int:
    return run_service(lambda: parse_args(argv), serve)
