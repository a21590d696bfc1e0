"""DualPath on the live mesh: agentic multi-turn sessions with shaped storage NICs, PE-read vs dual.

Workload: ``--sessions`` agentic sessions of ``--turns`` turns (``seawall.workloads.multiturn``, DualPath's
64K shape scaled by ``--scale`` to the built-in model's context), each session closed-loop (a turn is sent
when the previous one finished), all sessions at once. Every finished turn is stored to kvcache; the next
turn loads its prefix (hit rate printed).

The mesh (1 prefill + 1 decode worker + kvcache, disaggregated, workers' own prefix caches off so that every
reused token comes through kvcache) runs with each node's storage traffic shaped to ``--storage-gbps`` and
compute traffic to ``--compute-gbps`` (4x by default, as in the issue), once per read policy, same workload.
With PE-read every load crosses the prefill node's storage NIC; ``dual`` also uses the decode node's.

Prints per policy: wall time (JCT of the whole job), tokens/s, TTFT mean and p99, hit rate, and ratios to
the first policy. Timings are reported, never asserted.

    .venv/bin/python bench/dual_path.py [--storage-gbps 0.005] [--sessions 8] [--turns 12] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seawall import AsyncClient  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402
from seawall.workloads.multiturn import AgenticConfig, agentic_sessions  # noqa: E402
from services.engine.builtin_model import ensure_default_model  # noqa: E402


def workload(args) -> dict[str, list]:
    cfg = AgenticConfig.preset("64k", sessions=args.sessions, turns=args.turns, seed=args.seed).scaled(args.scale)
    sessions: dict[str, list] = {}
    for req in agentic_sessions(cfg):
        sessions.setdefault(req.session_id, []).append(req)
    return sessions


async def run_sessions(address: str, sessions: dict[str, list]) -> dict:
    ttfts, prompt_tokens, cached, out_tokens = [], 0, 0, 0

    async with AsyncClient(address) as client:
        async def session(turns):
            nonlocal prompt_tokens, cached, out_tokens
            for req in sorted(turns, key=lambda r: r.turn):
                t0 = time.perf_counter()
                first = None
                async for chunk in client.stream(req.prompt_token_ids.tolist(), max_tokens=req.max_tokens,
                                                 temperature=0, ignore_eos=True, session_id=req.session_id):
                    if first is None and chunk.token_ids:
                        first = time.perf_counter() - t0
                    out_tokens += len(chunk.token_ids)
                ttfts.append(first or 0.0)
                prompt_tokens += req.prompt_len

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for turns in sessions.values():
                tg.start_soon(session, turns)
        wall = time.perf_counter() - start
    return {"wall_s": wall, "ttft_mean": statistics.mean(ttfts), "ttft_p99": _p(ttfts, 0.99),
            "tokens": out_tokens, "prompt_tokens": prompt_tokens}


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def kvcache_hits(mesh: LocalMesh) -> tuple[int, int]:
    import grpc

    from seawall.v1 import kvcache_pb2, kvcache_pb2_grpc

    with grpc.insecure_channel(mesh.kvcache_address) as ch:
        stats = kvcache_pb2_grpc.KVCacheStub(ch).Stats(kvcache_pb2.KVCacheStatsRequest())
    return stats.hit_blocks, stats.miss_blocks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", default="pe-read,dual")
    p.add_argument("--storage-gbps", type=float, default=0.005)
    p.add_argument("--compute-gbps", type=float, default=None, help="default: 4x --storage-gbps")
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--scale", type=float, default=1 / 16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    compute = args.compute_gbps or 4 * args.storage_gbps
    model = str(ensure_default_model())
    sessions = workload(args)
    n = sum(len(v) for v in sessions.values())
    print(f"{len(sessions)} sessions, {n} turns; storage {args.storage_gbps} GB/s, compute {compute} GB/s per node")
    results = {}
    logs = Path(tempfile.mkdtemp(prefix="seawall-dualpath-"))
    for policy in args.policies.split(","):
        opts = MeshOptions(model=model, grpc_port=0, http_port=None, log_dir=logs / policy, kvcache=True,
                           scheduler_args=["--chunk-size", "256", "--no-prefix-caching", "--kv-read-policy", policy],
                           worker_args=["--compute-gbps", str(compute)],
                           kvcache_args=["--storage-gbps", str(args.storage_gbps)])
        with LocalMesh(opts) as mesh:
            r = anyio.run(run_sessions, mesh.grpc_address, sessions)
            hit, miss = kvcache_hits(mesh)
        r["hit_rate"] = hit / max(hit + miss, 1)
        r["tok_s"] = r["tokens"] / r["wall_s"]
        results[policy] = r
    base = next(iter(results.values()))
    print(f"{'policy':<10}{'JCT s':>9}{'tok/s':>9}{'TTFT mean':>11}{'TTFT p99':>10}{'hit':>7}{'JCT gain':>10}")
    for policy, r in results.items():
        print(f"{policy:<10}{r['wall_s']:>9.2f}{r['tok_s']:>9.1f}{r['ttft_mean']:>11.3f}{r['ttft_p99']:>10.3f}"
              f"{r['hit_rate']:>7.1%}{base['wall_s'] / r['wall_s']:>9.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
