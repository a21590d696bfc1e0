"""Multi-turn sessions of a hybrid (linear-attention layers) through the disaggregated mesh with kvcache: each
stored turn's recurrent state kept beside its blocks (kvcache's ``--state-bytes``, the default) against blocks
alone (``--state-bytes 0``, which a hybrid cannot resume from), in one run, same weights, same conversations.

The workers keep ``--slots`` saved states each (and none in host memory): enough for the ``--concurrency``
turns running at once, not for all ``--conversations``, so a conversation's next turn, after every other
conversation's turn, finds its state gone from the workers: with states in kvcache it loads the turn before's
prefix and its state; without, it computes what the prefill worker cannot resume.
Reports the prompt tokens computed and the mean time to first token of the turns after the first, the wall time
of all; outputs must be identical.

    .venv/bin/python bench/hybrid_checkpoint.py /tmp/q35
    .venv/bin/python bench/hybrid_sessions.py --model /tmp/q35
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peer_prefix import conversations  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402


def run(args, state_bytes: int):
    with tempfile.TemporaryDirectory() as logs:
        options = MeshOptions(model=args.model, grpc_port=0, http_port=None, log_dir=Path(logs), kvcache=True,
                              kvcache_args=["--state-bytes", str(state_bytes)],
                              scheduler_args=["--chunk-size", str(args.chunk_size)],
                              worker_args=["--dtype", "float32", "--state-checkpoints", str(args.slots),
                                           "--host-state-checkpoints", "0"])
        mesh = LocalMesh(options)
        mesh.start()
        try:
            return anyio.run(conversations, mesh.grpc_address, args, True)
        finally:
            mesh.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a hybrid checkpoint dir (bench/hybrid_checkpoint.py makes one)")
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4, help="turns in flight at once")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--slots", type=int, default=4, help="saved states each worker keeps (device; none on host)")
    p.add_argument("--system-len", type=int, default=512)
    p.add_argument("--message-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--chunk-size", type=int, default=512)
    args = p.parse_args()
    print(f"{args.conversations} sessions ({args.concurrency} at once) x {args.turns} turns: system {args.system_len}, +{args.message_len} a "
          f"turn, {args.output_len} out; {args.slots} saved states a worker; model {args.model}")
    base, states = run(args, state_bytes=0), run(args, state_bytes=1 << 30)
    for name, (computed, cached, ttfts, seconds, _) in (("blocks alone", base), ("states in kvcache", states)):
        print(f"{name:17}: turns after the first: {computed:6d} prompt tokens computed, {cached:6d} cached, "
              f"mean TTFT {statistics.mean(ttfts) * 1e3:7.1f} ms; all turns {seconds:6.2f} s")
    ttft = statistics.mean(base[2]) / statistics.mean(states[2])
    print(f"prompt tokens computed {base[0] / max(states[0], 1):.2f}x fewer, TTFT {ttft:.2f}x lower, "
          f"{base[3] / states[3]:.2f}x faster; outputs identical: {base[4] == states[4]}")
    return 0 if base[4] == states[4] else 1


if __name__ == "__main__":
    sys.exit(main())
