"""Step pipelining: the live mesh with each ``--step-pipelining`` setting, in the same run.

``all`` plans a worker's next step right behind every plan, decodes included (async scheduling, the core's
``expect``); ``prompts`` behind every plan without a decode (its samples are first tokens); ``known`` only
behind a plan that samples nothing (prompt chunks short of the prompt's end); ``off`` waits for every result
(services/scheduler/mesh.py). The default, ``auto``, is ``all`` (on CPU workers it was ``prompts`` until 2026-11-30).

Workload: ``--num-requests`` (6) prompts of ``--prompt-len`` (1536) random token ids, ``--output-len`` (2)
tokens each, all submitted at once to the default disaggregated topology (one prefill worker, one decode
worker) with ``--chunk-size`` (128): a burst of long prompts, chunked on the prefill worker
(``--prompt-len 128 --output-len 64 --num-requests 32 --chunk-size 512`` makes it decode-heavy). The meshes
run side by side and are timed in interleaved rounds (``--repeats``, 3); the best wall time is the figure,
the median beside it. Outputs must be identical.

    .venv/bin/python bench/step_pipelining.py [--num-requests 6] [--prompt-len 1536] [--chunk-size 128]
"""

from __future__ import annotations

import argparse
import random
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
from services.engine.builtin_model import ensure_default_model  # noqa: E402


async def _burst(address: str, prompts, output_len: int) -> tuple[list[list[int]], list[float]]:
    outs: list = [None] * len(prompts)
    ttft: list = [None] * len(prompts)
    start = time.perf_counter()
    async with AsyncClient(address) as client:
        async def one(i):
            tokens = []
            async for chunk in client.stream(prompts[i], max_tokens=output_len, temperature=0, ignore_eos=True):
                if not tokens:
                    ttft[i] = time.perf_counter() - start
                tokens.extend(chunk.token_ids)
            outs[i] = tokens

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return outs, ttft


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=6)
    p.add_argument("--prompt-len", type=int, default=1536)
    p.add_argument("--output-len", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    model = str(ensure_default_model())
    rng = random.Random(0)
    logs = Path(tempfile.mkdtemp(prefix="seawall-pipelining-"))
    systems = {name: ["--step-pipelining", name] for name in ("all", "prompts", "known", "off")}
    meshes: dict[str, LocalMesh] = {}
    walls: dict[str, list[float]] = {name: [] for name in systems}
    ttfts: dict[str, list[float]] = {name: [] for name in systems}
    outputs: dict[str, list] = {}
    try:
        for i, (name, extra) in enumerate(systems.items()):
            meshes[name] = LocalMesh(MeshOptions(
                model=model, grpc_port=0, http_port=None, log_dir=logs / str(i),
                scheduler_args=["--chunk-size", str(args.chunk_size), "--no-prefix-caching", *extra]))
            meshes[name].start()
        warm = [[rng.randrange(3, 4096) for _ in range(200)]]
        for mesh in meshes.values():
            anyio.run(_burst, mesh.grpc_address, warm, 2)
        for _ in range(args.repeats):
            # Fresh prompts each round (the same for both systems), so no prefix is cached anywhere.
            prompts = [[rng.randrange(3, 4096) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]
            for name, mesh in meshes.items():
                start = time.perf_counter()
                outs, ttft = anyio.run(_burst, mesh.grpc_address, prompts, args.output_len)
                walls[name].append(time.perf_counter() - start)
                ttfts[name].append(statistics.mean(ttft))
                outputs.setdefault(name, []).append(outs)
    finally:
        for mesh in meshes.values():
            mesh.stop()
    tokens = args.num_requests * args.prompt_len
    print(f"{args.num_requests} prompts x {args.prompt_len} tokens at once, chunk {args.chunk_size}, "
          f"disaggregated (1 prefill + 1 decode worker), {args.repeats} rounds\n")
    print(f"{'system':22s} {'best s':>8s} {'median s':>9s} {'prompt tok/s':>13s} {'mean TTFT s (best)':>19s}")
    for name in systems:
        best = min(walls[name])
        print(f"{name:22s} {best:8.2f} {statistics.median(walls[name]):9.2f} {tokens / best:13.0f} "
              f"{min(ttfts[name]):19.2f}")
    base = min(walls["off"])
    print("\nwall time of off / each (best, median): " + ", ".join(
        f"{name} {base / min(walls[name]):.2f}x / {statistics.median(walls['off']) / statistics.median(walls[name]):.2f}x"
        for name in systems if name != "off"))
    same = all(outputs[name] == outputs["off"] for name in systems)
    print(f"outputs identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
