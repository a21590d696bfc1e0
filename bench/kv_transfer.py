"""KV block transfer between two processes: NIXL (services/common/kv_transport.py) and the gRPC fallback
(services/common/grpc_kv.py), against a memcpy of the same bytes in the same run.

Two processes on this host, each with a ``PagedKVPool`` of ``--total-mib`` (default 256 MiB) of 16-token blocks
of a small model's layout (16 layers, 8 KV heads, head_dim 64, fp16: 512 KiB per block, 512 blocks). The
spawned peer holds a ``NixlKVAgent`` and a grpc.aio server with ReadKV/WriteKV; this process drives:

* ``memcpy`` — ``torch.Tensor.copy_`` of the whole pool into a preallocated (already touched) tensor, with
  torch's threads: the baseline every ratio is against; the same copy on one thread (NIXL's UCX copies on
  one core); ``index copy`` — ``dst[perm2] = src[perm]`` over block rows, for scattered ids;
* ``nixl write`` / ``nixl read`` — every block, ids in order on both sides (coalesced into one descriptor);
  ``nixl write, 1 desc/block`` — the same ids with coalescing off; ``nixl write, scattered ids`` — a random
  permutation on both sides (nothing coalesces);
* ``grpc push`` (WriteKV) / ``grpc pull`` (ReadKV) — every block, ``--chunk-mib`` chunks;
* a new pair's first transfer (``--first-trials`` fresh agents here, each writing ``--first-blocks`` blocks):
  loading the peer and opening connections inside it (``add_peer`` then the write), as a pair that meets in
  its first transfer, against the same write after ``meet`` (as workers that met when they registered), and
  the pair's next write.

Each method runs ``--rounds`` times (after one warm-up transfer that also opens the connection); the best and
the median are printed, in GB/s (10^9 bytes/s) of KV moved, wall time from the call to its outcome. The
peer's pool is zeroed before a method's first round and its bytes are checked against the source after the
method's last round (reads are checked here).

    .venv/bin/python bench/kv_transfer.py [--total-mib 256] [--layers 16] [--kv-heads 8] [--head-dim 64]
        [--block-size 16] [--dtype float16] [--rounds 5] [--chunk-mib 4] [--first-trials 5] [--first-blocks 8]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import anyio.to_thread  # noqa: E402
import grpc  # noqa: E402
import grpc.aio  # noqa: E402
import torch  # noqa: E402

from seawall.v1 import common_pb2  # noqa: E402
from services.common.grpc_kv import (  # noqa: E402
    GRPC_KV_OPTIONS,
    KVBytesServicer,
    add_worker_servicer,
    pull_blocks,
    push_blocks,
)
from services.common.heap import keep_freed_heap  # noqa: E402
from services.common.kv_transport import NixlKVAgent  # noqa: E402
from services.engine.kv_pool import KVLayout, PagedKVPool  # noqa: E402


def _pool(layout: KVLayout, num_blocks: int, seed: int) -> PagedKVPool:
    pool = PagedKVPool(layout, num_blocks, 0, torch.device("cpu"))
    pool.device_kv.copy_(torch.randn(pool.device_kv.shape, generator=torch.Generator().manual_seed(seed)))
    return pool


def _digest(pool: PagedKVPool, ids: list[int]) -> str:
    flat = pool.device_kv.view(torch.uint8).reshape(pool.num_blocks, -1).numpy()
    h = hashlib.blake2b(digest_size=16)
    for i in ids:
        h.update(memoryview(flat[i]))
    return h.hexdigest()


def _peer(conn, layout: KVLayout, num_blocks: int) -> None:
    keep_freed_heap()  # as a worker process does

    async def serve() -> None:
        pool = _pool(layout, num_blocks, seed=2)
        agent = NixlKVAgent("bench-peer", pool)
        server = grpc.aio.server(options=GRPC_KV_OPTIONS)
        add_worker_servicer(KVBytesServicer(pool), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        conn.send((agent.metadata().SerializeToString(), agent.kv_layout().SerializeToString(), port))
        while True:
            cmd, arg = await anyio.to_thread.run_sync(conn.recv)
            if cmd == "stop":
                break
            if cmd == "zero":
                pool.device_kv.zero_()
                conn.send(None)
            elif cmd == "digest":
                conn.send(_digest(pool, arg))
        await server.stop(grace=None)
        agent.close()

    anyio.run(serve)


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


async def _bench(args: argparse.Namespace, layout: KVLayout, num_blocks: int) -> dict:  # noqa: C901, PLR0915
    keep_freed_heap()
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_peer, args=(child_conn, layout, num_blocks), daemon=True)
    proc.start()

    async def ask(cmd: str, arg=None):
        conn.send((cmd, arg))
        return await anyio.to_thread.run_sync(conn.recv)

    meta, layout_msg, port = await anyio.to_thread.run_sync(conn.recv)
    address = f"127.0.0.1:{port}"
    local = _pool(layout, num_blocks, seed=1)
    nbytes = num_blocks * layout.bytes_per_block
    ids = list(range(num_blocks))
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    perm2 = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(1)).tolist()
    results: dict[str, list[float]] = {}

    # memcpy baselines, in this process, same bytes
    src = local.device_kv
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page first
    permt, perm2t = torch.tensor(perm), torch.tensor(perm2)
    src_rows, dst_rows = src.view(num_blocks, -1), dst.view(num_blocks, -1)
    threads = torch.get_num_threads()
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        dst.copy_(src)
        results.setdefault("memcpy (torch copy_)", []).append(time.perf_counter() - t0)
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        dst.copy_(src)
        results.setdefault("memcpy, 1 thread", []).append(time.perf_counter() - t0)
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        dst_rows[perm2t] = src_rows[permt]
        results.setdefault("index copy, scattered ids", []).append(time.perf_counter() - t0)
    del dst, dst_rows

    async with grpc.aio.insecure_channel(address, options=GRPC_KV_OPTIONS) as channel:
        with NixlKVAgent("bench-driver", local) as agent:
            agent.add_peer(common_pb2.NixlAgentMetadata.FromString(meta), common_pb2.KVLayout.FromString(layout_msg))
            warm = await agent.write("warm", "bench-peer", [0], [0], timeout_s=30)
            assert warm.ok, warm
            warm = await push_blocks(channel, local, [0], [0], "warm", timeout_s=30)
            assert warm.ok, warm

            async def nixl(label: str, op: str, src_ids: list[int], dst_ids: list[int], coalesce: bool = True):
                agent.coalesce = coalesce
                if op == "write":  # zero the destination, so that the check below sees this method's bytes
                    await ask("zero")
                else:
                    local.device_kv.zero_()
                for r in range(args.rounds):
                    fn = agent.write if op == "write" else agent.read
                    out = await fn(f"{label}-{r}", "bench-peer", src_ids, dst_ids, timeout_s=120)
                    assert out.ok, out
                    results.setdefault(label, []).append(out.seconds)
                agent.coalesce = True

            await nixl("nixl write", "write", ids, ids)
            assert await ask("digest", ids) == _digest(local, ids), "nixl write: the peer's bytes differ"
            await nixl("nixl write, 1 desc/block", "write", ids, ids, coalesce=False)
            await nixl("nixl write, scattered ids", "write", perm, perm2)
            assert await ask("digest", perm2) == _digest(local, perm), "nixl scattered write: bytes differ"
            peer_digest = await ask("digest", ids)
            await nixl("nixl read", "read", ids, ids)
            assert _digest(local, ids) == peer_digest, "nixl read: the local bytes differ"

            # gRPC: the peer now holds what the read brought here, so restore distinct local bytes first
            local.device_kv.copy_(torch.randn(local.device_kv.shape, generator=torch.Generator().manual_seed(5)))
            chunk = args.chunk_mib << 20
            await ask("zero")
            for r in range(args.rounds):
                out = await push_blocks(channel, local, ids, ids, f"push-{r}", timeout_s=120, max_chunk_bytes=chunk)
                assert out.ok, out
                results.setdefault("grpc push (WriteKV)", []).append(out.seconds)
            assert await ask("digest", ids) == _digest(local, ids), "grpc push: the peer's bytes differ"
            local.device_kv.zero_()
            for r in range(args.rounds):
                out = await pull_blocks(channel, local, ids, ids, f"pull-{r}", timeout_s=120, max_chunk_bytes=chunk)
                assert out.ok, out
                results.setdefault("grpc pull (ReadKV)", []).append(out.seconds)
            assert await ask("digest", ids) == _digest(local, ids), "grpc pull: the local bytes differ"
        first = await _first_transfers(args, local, meta, layout_msg, ids[: args.first_blocks])
    conn.send(("stop", None))
    await anyio.to_thread.run_sync(proc.join, 30)
    return {"bytes": nbytes, "seconds": results, "first": first}


async def _first_transfers(args: argparse.Namespace, local: PagedKVPool, meta: bytes, layout_msg: bytes,
                           ids: list[int]) -> dict[str, list[float]]:
    """Seconds of a new pair's first write of ``ids``: loading and connecting inside it ("in the transfer"),
    after ``meet`` ("met before"), and its second write ("next")."""
    peer_meta, peer_layout = common_pb2.NixlAgentMetadata.FromString(meta), common_pb2.KVLayout.FromString(layout_msg)
    out: dict[str, list[float]] = {}
    for t in range(args.first_trials):
        for met in (False, True):
            with NixlKVAgent(f"bench-first-{t}-{int(met)}", local) as agent:
                if met:
                    t0 = time.perf_counter()
                    await agent.meet(peer_meta, peer_layout)
                    out.setdefault("meeting", []).append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                agent.add_peer(peer_meta, peer_layout)  # nothing to do once met
                first = await agent.write(f"first-{t}-{int(met)}", "bench-peer", ids, ids, timeout_s=30)
                out.setdefault("met before" if met else "in the transfer", []).append(time.perf_counter() - t0)
                nxt = await agent.write(f"next-{t}-{int(met)}", "bench-peer", ids, ids, timeout_s=30)
                assert first.ok and nxt.ok, (first, nxt)
                out.setdefault("next", []).append(nxt.seconds)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-mib", type=int, default=256, help="bytes moved per transfer (whole blocks)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunk-mib", type=int, default=4, help="gRPC chunk size")
    ap.add_argument("--first-trials", type=int, default=5, help="new pairs timed for their first transfer")
    ap.add_argument("--first-blocks", type=int, default=8, help="blocks of a new pair's first transfer")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    layout = KVLayout(args.layers, args.block_size, args.kv_heads, args.head_dim, getattr(torch, args.dtype))
    num_blocks = max(1, (args.total_mib << 20) // layout.bytes_per_block)
    nbytes = num_blocks * layout.bytes_per_block
    print(f"layout: {args.layers} layers, {args.kv_heads} KV heads, head_dim {args.head_dim}, block {args.block_size}, "
          f"{args.dtype}: {layout.bytes_per_block / 1024:.0f} KiB/block; {num_blocks} blocks = {nbytes / 2**20:.0f} MiB "
          f"per transfer; {args.rounds} rounds; torch threads {torch.get_num_threads()}\n")
    res = anyio.run(_bench, args, layout, num_blocks)

    secs = res["seconds"]
    base = _gbps(nbytes, min(secs["memcpy (torch copy_)"]))
    print(f"{'method':30} {'best GB/s':>10} {'median GB/s':>12} {'best vs memcpy':>15}")
    summary = {}
    for label, times in secs.items():
        best, med = _gbps(nbytes, min(times)), _gbps(nbytes, statistics.median(times))
        summary[label] = {"best_gbps": best, "median_gbps": med, "vs_memcpy": best / base}
        print(f"{label:30} {best:10.2f} {med:12.2f} {best / base:14.2f}x")
    one = _gbps(nbytes, min(secs["memcpy, 1 thread"]))
    nixl_min = min(summary["nixl write"]["best_gbps"], summary["nixl read"]["best_gbps"])
    grpc_min = min(summary["grpc push (WriteKV)"]["best_gbps"], summary["grpc pull (ReadKV)"]["best_gbps"])
    print(f"\ntarget NIXL >= 50% of memcpy (the slower of write and read, best runs): {nixl_min / base:.0%} of torch "
          f"copy_ -> {'OK' if nixl_min >= 0.5 * base else 'NOT MET'}; {nixl_min / one:.0%} of a 1-thread copy -> "
          f"{'OK' if nixl_min >= 0.5 * one else 'NOT MET'}")
    print(f"target gRPC >= 1 GB/s (the slower of push and pull, best runs): {grpc_min:.2f} GB/s -> "
          f"{'OK' if grpc_min >= 1 else 'NOT MET'}")
    first = res["first"]
    cold, met = statistics.median(first["in the transfer"]), statistics.median(first["met before"])
    print(f"\na new pair's first transfer ({args.first_blocks} blocks, median of {args.first_trials} pairs): "
          f"{cold * 1e3:.1f} ms meeting in it, {met * 1e3:.1f} ms met before ({met / cold:.2f}x; the meeting took "
          f"{statistics.median(first['meeting']) * 1e3:.1f} ms), the next one {statistics.median(first['next']) * 1e3:.1f} ms")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "bytes": nbytes,
                                         "seconds": secs, "summary": summary, "first_transfer": first}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
