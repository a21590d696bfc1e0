"""Multi-turn conversations through the disaggregated mesh: a next turn's prefix read from the decode worker's
prefix cache (services/scheduler/peer_prefix.py) against computing what the prefill worker does not cache
(``--no-peer-prefix``), in one run, same weights, same conversations.

Each of ``--conversations`` conversations starts from a system prompt of its own; each turn's prompt is the
turn before's prompt, its output and a new message. The prefill worker caches each turn's prompt; the turn's
outputs were computed on the decode worker. Without the peer read a next turn computes them again (and for a
hybrid, everything after the prompt state the prefill worker saved); with it, the prefill worker pulls them.
Reports the prompt tokens computed and the mean time to first token of the turns after the first, and the
wall time of all;
outputs must be identical. No kvcache service runs (no sessions): the decode worker's cache is the only copy.

    .venv/bin/python bench/peer_prefix.py                       # the built-in model (attention)
    .venv/bin/python bench/hybrid_checkpoint.py /tmp/q35
    .venv/bin/python bench/peer_prefix.py --model /tmp/q35      # a hybrid: the saved state comes along
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seawall import AsyncClient  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402


async def _turn(client: AsyncClient, prompt: list[int], args, session_id: str = "") -> tuple[list[int], int, float]:
    """(output, cached prompt tokens, seconds to the first token) of one request."""
    started, first, tokens, cached = time.perf_counter(), None, [], 0
    async for chunk in client.stream(prompt, max_tokens=args.output_len, temperature=0, ignore_eos=True,
                                     session_id=session_id):
        first = first or time.perf_counter()
        tokens += chunk.token_ids
        cached = chunk.cached_prompt_tokens or cached
    return tokens, cached, first - started


async def conversations(address: str, args, sessions: bool = False) -> tuple[int, int, list[float], float,
                                                                            list[list[int]]]:
    """(prompt tokens computed in the turns after the first, prompt tokens cached, TTFTs of those turns,
    seconds, every output) of ``args.conversations`` conversations of ``args.turns`` turns, at once (or
    ``args.concurrency`` requests at a time, when the namespace has it); with
    ``sessions``, each conversation's turns are a session (their KV stored in kvcache)."""
    rng = random.Random(0)
    contexts = [[rng.randrange(3, 4000) for _ in range(args.system_len)] for _ in range(args.conversations)]
    computed = cached = 0
    ttfts, outputs = [], []
    started = time.perf_counter()
    limit = anyio.Semaphore(getattr(args, "concurrency", 0) or args.conversations)  # requests in flight at once
    async with AsyncClient(address) as client:
        for turn in range(args.turns):
            prompts = [c + [rng.randrange(3, 4000) for _ in range(args.message_len)] for c in contexts]
            results: list = [None] * len(prompts)

            async def one(i: int, prompts=prompts, results=results) -> None:
                async with limit:
                    results[i] = await _turn(client, prompts[i], args, f"c{i}" if sessions else "")

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            for prompt, (out, hit, ttft) in zip(prompts, results, strict=True):
                outputs.append(out)
                if turn:  # the first turn's prompts share nothing
                    computed += len(prompt) - hit
                    cached += hit
                    ttfts.append(ttft)
            contexts = [p + r[0] for p, r in zip(prompts, results, strict=True)]
    return computed, cached, ttfts, time.perf_counter() - started, outputs


def run(args, peer: bool):
    with tempfile.TemporaryDirectory() as logs:
        options = MeshOptions(model=args.model, grpc_port=0, http_port=None, log_dir=Path(logs),
                              scheduler_args=["--chunk-size", str(args.chunk_size),
                                              *([] if peer else ["--no-peer-prefix"])],
                              worker_args=["--dtype", "float32"])
        mesh = LocalMesh(options)
        mesh.start()
        try:
            return anyio.run(conversations, mesh.grpc_address, args)
        finally:
            mesh.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint dir (default: the built-in model)")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-len", type=int, default=512)
    p.add_argument("--message-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=512)
    args = p.parse_args()
    print(f"{args.conversations} conversations x {args.turns} turns: system {args.system_len}, "
          f"+{args.message_len} a turn, {args.output_len} out; model {args.model or 'built-in'}")
    base, peer = run(args, peer=False), run(args, peer=True)
    for name, (computed, cached, ttfts, seconds, _) in (("--no-peer-prefix", base), ("peer prefix", peer)):
        print(f"{name:16}: turns after the first: {computed:6d} prompt tokens computed, {cached:6d} cached, "
              f"mean TTFT {statistics.mean(ttfts) * 1e3:7.1f} ms; all turns {seconds:6.2f} s")
    ttft = statistics.mean(base[2]) / statistics.mean(peer[2])
    print(f"prompt tokens computed {base[0] / peer[0]:.2f}x fewer, TTFT {ttft:.2f}x lower, "
          f"{base[3] / peer[3]:.2f}x faster; outputs identical: {base[4] == peer[4]}")
    return 0 if base[4] == peer[4] else 1


if __name__ == "__main__":
    sys.exit(main())
