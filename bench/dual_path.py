"""DualPath on the live mesh: agentic multi-turn sessions with shaped storage NICs, PE-read vs dual.

Workload: ``--sessions`` agentic sessions of up to ``--turns`` turns (``seawall.workloads.multiturn``, DualPath's
64K shape scaled by ``--scale`` to the built-in model's context), all sessions at once, each closed-loop: a
turn is sent when the previous one finished, and its prompt is the previous prompt + the tokens the model
generated for it + a short append (``SessionPlan.next_turn``). Every finished turn is stored to kvcache; the
next turn loads its prefix.

The mesh (``--prefill`` prefill + ``--decode`` decode workers, 1 + 1 by default, + kvcache, disaggregated,
workers' own prefix caches off so that every reused token comes through kvcache) runs with each node's storage
traffic shaped to ``--storage-gbps`` and compute traffic to ``--compute-gbps`` (4x by default, as in the
issue), once per read policy, same workload. With PE-read every load crosses the prefill node's storage NIC;
``dual`` also uses the decode node's. ``dual+recompute`` also computes a cached prefix instead of loading it
when that is measured to end sooner; ``no-kvcache`` runs the mesh without kvcache (every prompt computed).

Prints per policy: wall time (JCT of the whole job), output tokens/s, TTFT mean and p99, the hit rate and
ratios to the first policy. The hit rate is the mesh's own count: prompt tokens it did not compute (loaded
from kvcache or found in a prefix cache, ``usage.cached_prompt_tokens``) over all prompt tokens, turn 1
included; "ideal" is what the workload allows (the previous context, whole blocks). Greedy decoding makes
every policy generate the same tokens, so every policy runs the same prompts (checked). Timings are
reported, never asserted.

    .venv/bin/python bench/dual_path.py [--storage-gbps 0.02] [--sessions 6] [--turns 32] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seawall.client import build_request  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402
from seawall.v1 import kvcache_pb2, kvcache_pb2_grpc, scheduler_pb2_grpc  # noqa: E402
from seawall.workloads.multiturn import AgenticConfig, SessionPlan, session_plans  # noqa: E402
from services.common.grpc_server import CHANNEL_OPTIONS  # noqa: E402
from services.engine.builtin_model import ensure_default_model  # noqa: E402

# A policy name for the mesh without kvcache: every prompt computed in full, the baseline of no reuse.
NO_KVCACHE = "no-kvcache"


def workload(args) -> list[SessionPlan]:
    cfg = AgenticConfig.preset("64k", sessions=args.sessions, turns=args.turns, seed=args.seed).scaled(args.scale)
    return session_plans(cfg)


async def run_sessions(address: str, plans: list[SessionPlan], block_size: int) -> dict:
    ttfts, outputs = [], hashlib.sha256()
    n = {"turns": 0, "prompt": 0, "cached": 0, "ideal": 0, "later_prompt": 0, "later_cached": 0, "out": 0}
    finished: dict[str, list[int]] = {}

    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)

        async def session(plan: SessionPlan) -> None:
            turn = plan.first_turn()
            while turn is not None:
                msg = build_request(list(turn.prompt_token_ids), turn.request_id,
                                    {"max_tokens": turn.max_tokens, "temperature": 0, "ignore_eos": True,
                                     "session_id": turn.session_id})
                t0, first, generated, last = time.perf_counter(), None, [], None
                async for reply in stub.Generate(msg):
                    if first is None and reply.token_ids:
                        first = time.perf_counter() - t0
                    generated.extend(reply.token_ids)
                    last = reply
                ttfts.append(first or 0.0)
                cached = last.usage.cached_prompt_tokens
                n["turns"] += 1
                n["prompt"] += turn.prompt_len
                n["cached"] += cached
                n["out"] += len(generated)
                if turn.prev_request_id is not None:
                    # The mesh stores every computed full block (prompt + output but the last token, whose KV
                    # is never computed); one prompt token always runs.
                    n["ideal"] += min(turn.shared_prefix_tokens - 1, turn.prompt_len - 1) // block_size * block_size
                    n["later_prompt"] += turn.prompt_len
                    n["later_cached"] += cached
                finished[turn.request_id] = generated
                turn = plan.next_turn(turn, generated)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for plan in plans:
                tg.start_soon(session, plan)
        wall = time.perf_counter() - start
    for rid in sorted(finished):
        outputs.update(f"{rid}:{finished[rid]}".encode())
    return {"wall_s": wall, "ttft_mean": statistics.mean(ttfts), "ttft_p99": _p(ttfts, 0.99),
            "turns": n["turns"], "tokens": n["out"], "prompt_tokens": n["prompt"], "cached_tokens": n["cached"],
            "hit_rate": n["cached"] / n["prompt"], "ideal_hit_rate": n["ideal"] / n["prompt"],
            "later_turns_hit_rate": n["later_cached"] / max(n["later_prompt"], 1),
            "outputs_sha256": outputs.hexdigest()}


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def kvcache_hits(mesh: LocalMesh) -> tuple[int, int]:
    with grpc.insecure_channel(mesh.kvcache_address) as ch:
        stats = kvcache_pb2_grpc.KVCacheStub(ch).Stats(kvcache_pb2.KVCacheStatsRequest())
    return stats.hit_blocks, stats.miss_blocks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", default=f"pe-read,dual,{NO_KVCACHE}",
                   help=f"--kv-read-policy values (dual+recompute: load-or-recompute), or {NO_KVCACHE}")
    p.add_argument("--storage-gbps", type=float, default=0.02,
                   help="per node; 0.02: storage-bound, yet loading beats recomputing the built-in model")
    p.add_argument("--compute-gbps", type=float, default=None, help="default: 4x --storage-gbps")
    p.add_argument("--sessions", type=int, default=6)
    p.add_argument("--turns", type=int, default=32, help="at most, per session (fewer turns: a lower hit rate, "
                   "as turn 1's context is always computed)")
    p.add_argument("--scale", type=float, default=1 / 16)
    p.add_argument("--prefill", type=int, default=1, help="prefill workers (each its own node)")
    p.add_argument("--decode", type=int, default=1, help="decode workers (each its own node)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (the workers' --block-size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    compute = args.compute_gbps or 4 * args.storage_gbps
    model = str(ensure_default_model())
    plans = workload(args)
    print(f"{len(plans)} sessions of up to {max(p.turns for p in plans)} turns, closed loop; {args.prefill}P"
          f"{args.decode}D, storage {args.storage_gbps} GB/s, compute {compute} GB/s per node", flush=True)
    results = {}
    logs = Path(tempfile.mkdtemp(prefix="seawall-dualpath-"))
    for policy in args.policies.split(","):
        cached = policy != NO_KVCACHE
        opts = MeshOptions(model=model, num_prefill=args.prefill, num_decode=args.decode, grpc_port=0,
                           http_port=None, log_dir=logs / policy, kvcache=cached,
                           scheduler_args=["--chunk-size", "256", "--no-prefix-caching",
                                           *(["--kv-read-policy", policy] if cached else [])],
                           worker_args=["--compute-gbps", str(compute), "--block-size", str(args.block_size)],
                           kvcache_args=["--storage-gbps", str(args.storage_gbps)])
        with LocalMesh(opts) as mesh:
            r = anyio.run(run_sessions, mesh.grpc_address, plans, args.block_size)
            if cached:
                r["kvcache_hit_blocks"], r["kvcache_miss_blocks"] = kvcache_hits(mesh)
        r["tok_s"] = r["tokens"] / r["wall_s"]
        results[policy] = r
        print(f"{policy}: {r['wall_s']:.1f} s, {r['turns']} turns", flush=True)
    base = next(iter(results.values()))
    print(f"{'policy':<16}{'JCT s':>9}{'tok/s':>9}{'TTFT mean':>11}{'TTFT p99':>10}{'hit':>7}{'ideal':>7}"
          f"{'JCT gain':>10}{'TTFT gain':>11}")
    for policy, r in results.items():
        print(f"{policy:<16}{r['wall_s']:>9.2f}{r['tok_s']:>9.1f}{r['ttft_mean']:>11.3f}{r['ttft_p99']:>10.3f}"
              f"{r['hit_rate']:>7.1%}{r['ideal_hit_rate']:>7.1%}{base['wall_s'] / r['wall_s']:>9.2f}x"
              f"{base['ttft_mean'] / r['ttft_mean']:>10.2f}x")
        if r["outputs_sha256"] != base["outputs_sha256"]:
            print(f"  {policy} generated other tokens than {next(iter(results))}: not the same workload")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
