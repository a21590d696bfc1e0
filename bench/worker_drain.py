"""A worker stopped while its requests decode: drained (SIGTERM: ``DrainWorker`` moves its decodes with their KV to
the worker that stays, services/scheduler/worker_drain.py) against killed (SIGKILL: the scheduler recomputes
them there, prompt and every token so far), through live colocated meshes of two workers, in one run.

Each round starts a fresh mesh per setting (the stopped worker does not come back), the order alternating,
and streams the same ``--requests`` prompts greedily (``ignore_eos``); once every request has
``--after`` tokens, the worker holding the most running requests is stopped. Reports per setting the
means over the rounds of: the longest gap between two tokens of any request (the stopped worker's requests'
pause), the requests recomputed (``seawall_requests_moved``) and moved with their KV (``seawall_migrations``),
how long the stopped process took to exit, and the wall time of the set; outputs must be identical.

    .venv/bin/python bench/worker_drain.py [--rounds 3] [--requests 8] [--prompt-len 1024] [--max-tokens 300]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall import AsyncClient  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402

FIGURES = ("longest gap s", "recomputed", "moved with KV", "exit s", "wall s")


async def one_round(mesh: LocalMesh, setting: str, prompts: list[list[int]], max_tokens: int,
                    after: int) -> tuple[dict, list[list[int]]]:
    outputs: list[list[int]] = [[] for _ in prompts]
    gaps = [0.0] * len(prompts)
    exit_s: list[float] = []
    async with AsyncClient(mesh.grpc_address) as client:
        started = time.perf_counter()

        async def run(i: int) -> None:
            last = time.perf_counter()
            async for chunk in client.stream(prompts[i], max_tokens=max_tokens, temperature=0, ignore_eos=True):
                now = time.perf_counter()
                if outputs[i]:
                    gaps[i] = max(gaps[i], now - last)
                last = now
                outputs[i] += chunk.token_ids

        async def stop() -> None:
            while min(len(o) for o in outputs) < after:
                await anyio.sleep(0.005)
            busiest = max((w for w in (await client.stats()).workers), key=lambda w: w.num_running)
            name = next(n for n, a in mesh.worker_addresses.items() if a == busiest.address)
            proc = mesh.child(name).proc
            sent = time.perf_counter()
            if setting == "drain":
                proc.send_signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(proc.wait, 120)
            else:
                await anyio.to_thread.run_sync(mesh.kill, name)
            exit_s.append(time.perf_counter() - sent)

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop)
            for i in range(len(prompts)):
                tg.start_soon(run, i)
        wall = time.perf_counter() - started
    figures = {"longest gap s": max(gaps), "recomputed": mesh.counter("seawall_requests_moved"),
               "moved with KV": mesh.counter("seawall_migrations"), "exit s": exit_s[0], "wall s": wall}
    return figures, outputs


def start(logs: Path) -> LocalMesh:
    mesh = LocalMesh(MeshOptions(mode="colocated", num_decode=2, grpc_port=0, http_port=0, log_dir=logs,
                                 worker_args=["--dtype", "float32", "--drain-timeout-s", "120"]))
    mesh.start()
    return mesh


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=300)
    p.add_argument("--after", type=int, default=50, help="tokens every request has when the worker is stopped")
    args = p.parse_args()
    settings = ("kill", "drain")
    runs: dict[str, list[dict]] = {s: [] for s in settings}
    same = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            prompts = [[(r * 7919 + i * 104729 + j * 31) % 3997 + 3 for j in range(args.prompt_len)]
                       for i in range(args.requests)]
            outputs = {}
            for setting in (settings if r % 2 else settings[::-1]):
                mesh = start(Path(tmp) / f"{r}-{setting}")
                try:
                    figures, outputs[setting] = anyio.run(one_round, mesh, setting, prompts, args.max_tokens,
                                                          args.after)
                finally:
                    mesh.stop()
                runs[setting].append(figures)
                print(f"round {r} {setting}: " + ", ".join(f"{k} {v:.3g}" for k, v in figures.items()), flush=True)
            same += len({str(o) for o in outputs.values()}) == 1
    print(f"({args.rounds} rounds of {args.requests} x ({args.prompt_len} + {args.max_tokens}) tokens on two "
          f"colocated workers, built-in model, one stopped after {args.after} tokens; means, ratio to kill)")
    print(f"{'setting':8} " + " ".join(f"{h:>20}" for h in FIGURES))
    for setting in runs:
        cells = []
        for key in FIGURES:
            value, ref = (statistics.mean(f[key] for f in runs[s]) for s in (setting, "kill"))
            cells.append(f"{value:10.3g} ({value / ref:5.2f}x)" if ref else f"{value:20.3g}")
        print(f"{setting:8} " + " ".join(f"{c:>20}" for c in cells))
    print(f"outputs identical in {same} of {args.rounds} rounds")
    return 0 if same == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
