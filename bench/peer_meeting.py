"""Workers meeting at registration (services/scheduler/peer_meeting.py) against ``--no-peer-meeting``, through
fresh disaggregated meshes (one prefill, one decode worker, NIXL), alternating, in one run.

UCX opens a lane's connection to a peer on its first request. Where the workers met when the decode worker
registered, the first request's hand-off pulls over open connections; where they did not, that pull opens
them. Each mesh serves one request after its workers registered (and a pause in which the meeting ends);
reported per setting: the median of the first hand-off's KV transfer (``seawall_kv_transfer_seconds``) and of
the request's time to first token and latency, with the ratio of meeting to not.

    .venv/bin/python bench/peer_meeting.py [--meshes 3] [--prompt-len 512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall import AsyncClient  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402

SETTINGS = {"meeting": [], "no meeting": ["--no-peer-meeting"]}


async def first_request(address: str, prompt: list[int]) -> tuple[float, float]:
    """(time to first token, latency) of one request, once the mesh has its two workers."""
    async with AsyncClient(address) as client:
        with anyio.fail_after(120):
            while len((await client.stats()).workers) < 2:
                await anyio.sleep(0.05)
        await anyio.sleep(1.0)  # the meeting, where on, ends within ~0.1 s of the decode worker registering
        started = time.perf_counter()
        first = None
        async for _ in client.stream(prompt, max_tokens=8, temperature=0, ignore_eos=True):
            first = first or time.perf_counter() - started
        return first, time.perf_counter() - started


def one_mesh(flags: list[str], prompt: list[int], logs: Path) -> dict[str, float]:
    mesh = LocalMesh(MeshOptions(mode="disaggregated", num_prefill=1, num_decode=1, grpc_port=0, http_port=0,
                                 log_dir=logs, scheduler_args=["--kv-transport", "nixl", *flags],
                                 worker_args=["--dtype", "float32"]))
    mesh.start()
    try:
        ttft, latency = anyio.run(first_request, mesh.grpc_address, prompt)
        count, seconds = mesh.histogram("seawall_kv_transfer_seconds")
        assert count == 1, f"{count} transfers for one request"
        return {"transfer ms": seconds * 1e3, "ttft ms": ttft * 1e3, "latency ms": latency * 1e3}
    finally:
        mesh.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--meshes", type=int, default=3, help="fresh meshes per setting (default 3)")
    parser.add_argument("--prompt-len", type=int, default=512, help="prompt tokens (default 512: 32 blocks)")
    args = parser.parse_args()
    prompt = [3 + (i * 7919) % 4000 for i in range(args.prompt_len)]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.meshes):
            names = list(SETTINGS) if k % 2 == 0 else list(reversed(SETTINGS))  # alternate which starts first
            for name in names:
                runs[name].append(one_mesh(SETTINGS[name], prompt, Path(tmp) / f"{name}-{k}"))
                print(f"{name:>10} mesh {k}: " + ", ".join(f"{f} {v:.1f}" for f, v in runs[name][-1].items()),
                      flush=True)
    medians = {name: {f: statistics.median(r[f] for r in rs) for f in rs[0]} for name, rs in runs.items()}
    print(f"\nmedians over {args.meshes} fresh meshes each, {args.prompt_len}-token prompt:")
    for f in medians["meeting"]:
        met, cold = medians["meeting"][f], medians["no meeting"][f]
        print(f"  {f:>10}: meeting {met:.1f}, no meeting {cold:.1f} ({met / cold:.2f}x)")


if __name__ == "__main__":
    main()
