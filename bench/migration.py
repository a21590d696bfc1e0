"""Live migration (services/scheduler/migrator.py) against none (``--migration-headroom 0``), through two live
colocated meshes of two workers each, paired request sets, in one run.

Placement cannot know how long an output will run. Each request set is ``--long`` requests with long outputs
and ``--short`` with short ones, the same prompt length, in a seeded random order; they arrive at once, in order,
and token-load placement alternates them between the workers (by prompt tokens, equal for all), so
a set puts more long outputs on one worker than on the other about half of the time. Each worker's pool holds
``--pool-longs`` long requests; the long outputs of a set fit in both pools together. Without migration the
worker that drew more of them preempts one (recompute, sarathi's default), which waits for memory there while
the other worker idles with free blocks; with it, the worker moves a decode over with its KV before it runs
out. Placement also depends on timing (a request's tokens count once its first step ran), so which sets
stack long outputs differs a little between the meshes: counts are summed over the sets. Every set runs on
both meshes, the order of the two alternating. Reports per setting the preemptions and migrations, and the
means over the sets of the longest gap between two tokens of a request, the slowest request's latency, the
mean latency and the set's wall time; outputs must be identical (greedy, ``ignore_eos``).

    .venv/bin/python bench/migration.py [--sets 12] [--long 4] [--short 4]
    .venv/bin/python bench/migration.py --bursts [--rounds 3]
    .venv/bin/python bench/migration.py --precopy [--sets 12]

``--precopy``: both meshes migrate; one copies a mover's full blocks ahead while it keeps decoding (the
default), the other stops it for the whole copy (``--no-migration-precopy``). Each mesh's
``seawall_migration_pause_seconds`` says how long its moves held their requests still.

``--bursts``: Pareto outputs arriving in bursts of 16 that fill both workers' pools (``seawall bench``), where
a move has nowhere to go most of the time: what migration costs when it cannot help.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall import AsyncClient  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402

BYTES_PER_TOKEN = 2048  # the built-in model in fp32
FIGURES = ("preempted", "migrated", "queue moves", "copied ahead", "longest gap s", "slowest s", "mean s", "wall s")
COUNTS = ("preempted", "migrated", "queue moves", "copied ahead")


async def one_set(address: str, prompts: list[list[int]], max_tokens: list[int]) -> tuple[dict, list[list[int]]]:
    outputs: list[list[int]] = [[] for _ in prompts]
    latency, gaps = [0.0] * len(prompts), [0.0] * len(prompts)
    async with AsyncClient(address) as client:
        before = await client.stats()
        started = time.perf_counter()

        async def run(i: int) -> None:
            last = sent = time.perf_counter()
            async for chunk in client.stream(prompts[i], max_tokens=max_tokens[i], temperature=0, ignore_eos=True):
                now = time.perf_counter()
                if outputs[i]:
                    gaps[i] = max(gaps[i], now - last)
                last = now
                outputs[i] += chunk.token_ids
            latency[i] = time.perf_counter() - sent

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):  # in order, at once: placed before any step ran, by prompt tokens alone
                tg.start_soon(run, i)
        wall = time.perf_counter() - started
        after = await client.stats()
    figures = {"preempted": after.num_preemptions - before.num_preemptions,
               "migrated": after.num_migrations - before.num_migrations,
               "queue moves": after.num_queued_moves - before.num_queued_moves,
               "copied ahead": after.num_precopied_blocks - before.num_precopied_blocks, "longest gap s": max(gaps),
               "slowest s": max(latency), "mean s": statistics.mean(latency), "wall s": wall}
    return figures, outputs


def start(args, flags: list[str], logs: Path) -> LocalMesh:
    pool = int(args.pool_longs * (args.prompt_len + args.long_output)) * BYTES_PER_TOKEN
    mesh = LocalMesh(MeshOptions(mode="colocated", num_decode=2, grpc_port=0, http_port=0, log_dir=logs,
                                 scheduler_args=["--chunk-size", "256", *flags],
                                 worker_args=["--dtype", "float32", "--kv-cache-bytes", str(pool)]))
    mesh.start()
    return mesh


BURSTS = ["--mode", "colocated", "--workers", "2", "--lengths", "pareto", "--prompt-len", "64", "--pareto-min", "64",
          "--pareto-alpha", "1.1", "--max-output-len", "900", "--arrival", "bursts", "--burst-size", "16",
          "--burst-interval", "3", "--num-requests", "96", "--kv-cache-bytes", str(2 << 20), "--policies", "sarathi"]
BURST_FIGURES = {"preempted": "preemptions", "migrated": "migrations", "queue moves": "queued_moves",
                 "TBT p99 s": "tbt_p99",
                 "longest gap s": "tbt_max", "E2E mean s": "e2e_mean", "E2E p99 s": "e2e_p99", "tok/s": "throughput_tok_s"}


def bursts(args, settings: dict[str, list[str]]) -> int:
    """Pareto outputs in bursts that fill both workers (``seawall bench --spawn``, one mesh per setting and
    round, alternating): where every worker is short of memory, migration has nowhere to go."""
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in (list(settings) if r % 2 else list(settings)[::-1]):
                out = Path(tmp) / "result.json"
                subprocess.run([sys.executable, "-m", "seawall", "bench", "--spawn", *BURSTS, *settings[name],
                                "--no-progress", "--json", str(out)], check=True,
                               capture_output=True)
                runs[name].append(json.loads(out.read_text())["results"]["sarathi"])
    base = list(settings)[0]
    print(f"(seawall bench --spawn {' '.join(BURSTS)}; median of {args.rounds} rounds, ratio to {base})")
    print(f"{'setting':14} " + " ".join(f"{h:>18}" for h in BURST_FIGURES))
    for name, results in runs.items():
        cells = []
        for key in BURST_FIGURES.values():
            value, ref = (statistics.median(run[key] for run in r) for r in (results, runs[base]))
            cells.append(f"{value:9.3g} ({value / ref:4.2f}x)" if ref else f"{value:18.3g}")
        print(f"{name:14} " + " ".join(f"{c:>18}" for c in cells))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", type=int, default=12, help="request sets, each run on both meshes")
    p.add_argument("--long", type=int, default=4)
    p.add_argument("--short", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--long-output", type=int, default=700)
    p.add_argument("--short-output", type=int, default=48)
    p.add_argument("--pool-longs", type=float, default=2.5, help="long requests a worker's KV pool holds")
    p.add_argument("--headroom", type=int, default=32, help="--migration-headroom of the migrating mesh")
    p.add_argument("--bursts", action="store_true", help="bursts that fill both workers instead")
    p.add_argument("--rounds", type=int, default=3, help="--bursts: rounds per setting")
    p.add_argument("--precopy", action="store_true", help="copying ahead against stopping for the whole copy")
    args = p.parse_args()
    migrate = ["--migration-headroom", str(args.headroom)]
    settings = ({"stop-and-copy": [*migrate, "--no-migration-precopy"], "copy ahead": migrate} if args.precopy
                else {"no migration": ["--migration-headroom", "0"], f"headroom {args.headroom}": migrate})
    if args.bursts:
        return bursts(args, settings)
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    same = 0
    with tempfile.TemporaryDirectory() as tmp:
        meshes = {name: start(args, flags, Path(tmp) / str(i)) for i, (name, flags) in enumerate(settings.items())}
        try:
            for s in range(args.sets):
                rng = random.Random(s)
                kinds = [args.long_output] * args.long + [args.short_output] * args.short
                rng.shuffle(kinds)
                prompts = [[rng.randrange(3, 4000) for _ in range(args.prompt_len)] for _ in kinds]
                outputs = {}
                for name in (list(settings) if s % 2 else list(settings)[::-1]):
                    figures, outputs[name] = anyio.run(one_set, meshes[name].grpc_address, prompts, kinds)
                    runs[name].append(figures)
                same += len({str(o) for o in outputs.values()}) == 1
                print(f"set {s}: " + "; ".join(f"{n}: {f['preempted']} preempted, {f['migrated']} migrated, "
                                                f"longest gap {f['longest gap s']:.2f} s"
                                                for n, f in ((n, runs[n][-1]) for n in settings)), flush=True)
        finally:
            pauses = {name: mesh.histogram("seawall_migration_pause_seconds") for name, mesh in meshes.items()}
            for mesh in meshes.values():
                mesh.stop()
    base = list(settings)[0]
    print(f"({args.sets} sets of {args.long} x ({args.prompt_len} + {args.long_output}) and {args.short} x "
          f"({args.prompt_len} + {args.short_output}) tokens, two colocated workers holding {args.pool_longs} long "
          f"requests each, built-in model; counts summed over the sets, times their means, ratio to {base})")
    print(f"{'setting':14} " + " ".join(f"{h:>18}" for h in FIGURES))
    for name, figures in runs.items():
        cells = []
        for key in FIGURES:
            total = sum if key in COUNTS else statistics.mean
            value, ref = total(f[key] for f in figures), total(f[key] for f in runs[base])
            cells.append(f"{value:9.3g} ({value / ref:4.2f}x)" if ref else f"{value:18.3g}")
        print(f"{name:14} " + " ".join(f"{c:>18}" for c in cells))
    for name, (count, total) in pauses.items():
        if count:
            print(f"{name}: {count:.0f} moves held their request still {1e3 * total / count:.1f} ms on average "
                  "(seawall_migration_pause_seconds: stopped being scheduled -> KV landed)")
    print(f"outputs identical in {same} of {args.sets} sets")
    return 0 if same == args.sets else 1


if __name__ == "__main__":
    sys.exit(main())
