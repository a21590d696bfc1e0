"""Memory over a long run: does any service grow with the number of requests it has served?

Starts the default topology (one prefill and one decode worker) with the kvcache service and the HTTP API, then
sends waves of the requests a long-lived server sees: gRPC streams and final-only calls, streams left after two
tokens (aborted), OpenAI chat streams continuing sessions (their KV stored in kvcache and loaded back), and
Responses API turns (stored then deleted, background ones polled, cancelled ones). After each wave it waits
until the mesh is idle and reads every process's resident memory (``VmRSS`` in /proc/PID/status). A service
that keeps something per request grows in step with the requests served; one that does not levels off once
its caches and allocator arenas are warm.

    .venv/bin/python bench/memory_soak.py                      # 12 waves of 200 requests
    .venv/bin/python bench/memory_soak.py --waves 30 --wave-size 300

Prints a row per wave, then per process the growth from the end of the warm-up waves to the last one, per
1000 requests. Exit status 1 when a process grew more than ``--max-growth-mb`` per 1000 requests.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seawall import AsyncClient  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402
from services.engine.checkpoint import resolve_model_dir  # noqa: E402

SESSIONS = 40  # chat sessions the waves continue, round robin
CONCURRENCY = 24  # requests in flight at once (below the scheduler's queue bound)
KV_BYTES = 16 << 20  # per worker: 512 blocks of the built-in model


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Traffic:
    """One wave's requests, each of a kind drawn from the seed."""

    def __init__(self, client: AsyncClient, http: httpx.AsyncClient, rng: random.Random) -> None:
        self.client, self.http, self.rng = client, http, rng
        self.turns = 0
        self.kinds: list[tuple[str, float, Callable]] = [
            ("grpc stream", 0.25, self.grpc_stream), ("grpc generate", 0.15, self.grpc_generate),
            ("grpc abort", 0.10, self.grpc_abort), ("chat session", 0.25, self.chat_session),
            ("response", 0.10, self.response), ("background", 0.10, self.background),
            ("cancelled", 0.05, self.cancelled)]

    def prompt(self, lo: int = 4, hi: int = 200) -> list[int]:
        return [self.rng.randrange(3, 4096) for _ in range(self.rng.randint(lo, hi))]

    async def one(self) -> str:
        name, _, run = self.rng.choices(self.kinds, weights=[w for _, w, _ in self.kinds])[0]
        await run()
        return name

    async def grpc_stream(self) -> None:
        async for _ in self.client.stream(self.prompt(), max_tokens=self.rng.randint(1, 48), temperature=0):
            pass

    async def grpc_generate(self) -> None:
        await self.client.generate(self.prompt(), max_tokens=self.rng.randint(1, 48))

    async def grpc_abort(self) -> None:
        n = 0
        async for _ in self.client.stream(self.prompt(), max_tokens=400, ignore_eos=True):
            n += 1
            if n == 2:
                break  # leaving the stream aborts the request

    async def chat_session(self) -> None:
        self.turns += 1
        body = {"messages": [{"role": "user", "content": f"turn {self.turns}: " + "burst " * self.rng.randint(1, 30)}],
                "max_tokens": self.rng.randint(1, 32), "stream": True, "session_id": f"s{self.turns % SESSIONS}"}
        async with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for _ in r.aiter_lines():
                pass

    async def response(self) -> None:
        first = await self._post({"input": "tell me " * self.rng.randint(1, 20), "max_output_tokens": 8})
        second = await self._post({"input": "and?", "previous_response_id": first["id"], "max_output_tokens": 4})
        for rid in (first["id"], second["id"]):
            (await self.http.delete(f"/v1/responses/{rid}")).raise_for_status()

    async def background(self) -> None:
        rid = (await self._post({"input": "later " * 5, "max_output_tokens": 16, "background": True}))["id"]
        while (await self.http.get(f"/v1/responses/{rid}")).json()["status"] in ("queued", "in_progress"):
            await anyio.sleep(0.05)
        (await self.http.delete(f"/v1/responses/{rid}")).raise_for_status()

    async def cancelled(self) -> None:
        rid = (await self._post({"input": "long", "max_output_tokens": 400, "background": True,
                                 "ignore_eos": True}))["id"]
        await anyio.sleep(0.05)
        (await self.http.post(f"/v1/responses/{rid}/cancel")).raise_for_status()
        (await self.http.delete(f"/v1/responses/{rid}")).raise_for_status()

    async def _post(self, body: dict) -> dict:
        r = await self.http.post("/v1/responses", json=body)
        r.raise_for_status()
        return r.json()


async def wave(mesh: LocalMesh, traffic: Traffic, size: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    limit = anyio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with limit:
            name = await traffic.one()
            counts[name] = counts.get(name, 0) + 1

    async with anyio.create_task_group() as tg:
        for _ in range(size):
            tg.start_soon(one)
    with anyio.fail_after(60):  # idle: nothing running, no block held, the last turns' KV stored
        while True:
            stats = await traffic.client.stats()
            if stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers):
                break
            await anyio.sleep(0.1)
    await anyio.sleep(0.5)
    return counts


async def run(args: argparse.Namespace) -> int:
    model = resolve_model_dir(args.model)
    log_dir = Path(tempfile.mkdtemp(prefix="seawall-memory-soak-"))
    # Small KV pools: the prefix caches (their hash maps grow with the blocks they hold) and the kvcache store
    # fill up in the warm-up waves, so what grows after them is what the services keep per request.
    options = MeshOptions(model=str(model), grpc_port=0, http_port=0, kvcache=True, log_dir=log_dir,
                          startup_timeout_s=180, worker_args=["--kv-cache-bytes", str(KV_BYTES), "--swap-bytes",
                                                             str(KV_BYTES)],
                          kvcache_args=["--dram-bytes", str(4 * KV_BYTES)])
    mesh = LocalMesh(options)
    mesh.start()
    print(f"mesh up; logs in {log_dir}")
    names = [c.name for c in mesh.children]
    rows: list[list[float]] = []
    try:
        # Idle connections close before the server's keep-alive timeout (5 s) can close one as it is reused.
        async with AsyncClient(mesh.grpc_address) as client, \
                httpx.AsyncClient(base_url=mesh.http_url, timeout=120,
                                  limits=httpx.Limits(keepalive_expiry=2.0)) as http:
            traffic = Traffic(client, http, random.Random(args.seed))
            print(f"{'wave':>4} {'requests':>8}  " + "  ".join(f"{n:>12}" for n in names) + "   (RSS, MB)")
            for k in range(args.waves):
                counts = await wave(mesh, traffic, args.wave_size)
                rows.append([rss_mb(mesh.child(n).proc.pid) for n in names])
                print(f"{k + 1:>4} {(k + 1) * args.wave_size:>8}  " + "  ".join(f"{v:>12.1f}" for v in rows[-1])
                      + ("   " + ", ".join(f"{n} {c}" for n, c in sorted(counts.items())) if k == 0 else ""),
                      flush=True)
    finally:
        mesh.stop()
    base = min(args.warmup, args.waves - 1)
    served = (args.waves - 1 - base) * args.wave_size
    print(f"\ngrowth from wave {base + 1} to wave {args.waves} ({served} requests), MB per 1000 requests:")
    failed = False
    for i, name in enumerate(names):
        per_1000 = (rows[-1][i] - rows[base][i]) / max(served, 1) * 1000
        over = per_1000 > args.max_growth_mb
        failed |= over
        print(f"  {name:<12} {per_1000:+.2f}{'  > ' + str(args.max_growth_mb) + ' MB: GROWS' if over else ''}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waves", type=int, default=12)
    parser.add_argument("--wave-size", type=int, default=200, help="requests per wave (default 200)")
    parser.add_argument("--warmup", type=int, default=3, help="waves before growth is counted (default 3)")
    parser.add_argument("--max-growth-mb", type=float, default=1.0,
                        help="most growth allowed per 1000 requests after the warm-up (default 1 MB)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="checkpoint dir (default: the built-in model)")
    return anyio.run(run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
