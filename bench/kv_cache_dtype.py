"""What a float8 KV cache (``--kv-cache-dtype fp8``) buys and costs: the same workload in process, in the same
run, with the pool in the model's dtype (fp32 here) and in float8 e4m3, on a tight pool and on an ample one.

``--batch`` (32) requests of ``--prompt-len`` (512) random token ids generate ``--output-len`` (128) tokens
greedily (``ignore_eos``), chunked prefill of ``--chunk-size`` (256), no prefix caching. The tight pool is
``--tight-mib`` (2) MiB: 64 fp32 blocks of the built-in model, 3 requests at once, or 256 float8 blocks, 12;
the ample one (``--ample-mib``, 64) holds every request in either. A float8 pool runs the torch ops on the CPU
(kv_quant.py: the fused kernels' last-bit differences would turn into other tokens), so the fp32 pool is run
both with the kernels (the default) and with the torch ops, to separate what the ops cost from what the
rounding costs. Rounds alternate the settings; printed per setting and pool: the median tokens/s (ratio to
fp32 with the kernels), the most requests running in one step, the most blocks in use, the preemptions, and
how many requests' outputs equal fp32's (the rounding changes them: the built-in model's random weights
leave its choices near ties, so few stay equal; a trained model's stay far closer).

    .venv/bin/python bench/kv_cache_dtype.py [--batch 32] [--rounds 3]

``--mesh``: the burst instead, through live colocated meshes (``seawall bench --spawn --workload burst --policies
sarathi --kv-cache-bytes`` ``--mesh-pool-mib`` (4) MiB), one per setting and round, the settings alternating; per
setting the median of the rounds: preemptions, TTFT p99, the longest gap between two tokens of any request, mean
latency and tokens/s, with ratios to fp32 with the kernels.

    .venv/bin/python bench/kv_cache_dtype.py --mesh [--mesh-pool-mib 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.watched_run import alternating_rounds  # noqa: E402
from seawall.offline.engine import OfflineEngine  # noqa: E402
from services.common.sampling_params import SamplingParams  # noqa: E402
from services.engine.builtin_model import ensure_default_model  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.scheduler.core.scheduler import SchedulerConfig  # noqa: E402

MESH_FIGURES = {"preempted": "preemptions", "TTFT p99 s": "ttft_p99", "longest gap s": "tbt_max",
                "E2E mean s": "e2e_mean", "tok/s": "throughput_tok_s"}
SETTINGS = {  # name: (kv_cache_dtype, cpu_kernels)
    "fp32 kernels": ("auto", True),
    "fp32 torch ops": ("auto", False),
    "fp8 (torch ops)": ("fp8", True),  # the runner leaves the kernels off for a float8 pool
}


def mesh_burst(args: argparse.Namespace) -> int:
    """The burst workload through a live mesh per setting and round (``seawall bench --spawn``)."""
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in (list(SETTINGS) if r % 2 else list(SETTINGS)[::-1]):
                dtype, kernels = SETTINGS[name]
                out = Path(tmp) / "result.json"
                cmd = [sys.executable, "-m", "seawall", "bench", "--spawn", "--mode", "colocated", "--workload",
                       "burst", "--policies", "sarathi", "--kv-cache-bytes", str(args.mesh_pool_mib << 20),
                       "--kv-cache-dtype", dtype, "--no-progress", "--json", str(out)]
                subprocess.run(cmd + ([] if kernels else ["--no-cpu-kernels"]), check=True, capture_output=True)
                runs[name].append(json.loads(out.read_text())["results"]["sarathi"])
    print(f"(burst through a colocated mesh, sarathi, a {args.mesh_pool_mib} MiB pool; median of {args.rounds} "
          "rounds, ratio to fp32 with the kernels)")
    print(f"{'setting':16} " + " ".join(f"{h:>20}" for h in MESH_FIGURES))
    base = {key: statistics.median(run[key] for run in runs["fp32 kernels"]) for key in MESH_FIGURES.values()}
    for name, results in runs.items():
        cells = []
        for key in MESH_FIGURES.values():
            value = statistics.median(run[key] for run in results)
            cells.append(f"{value:11.4g} ({value / base[key]:5.2f}x)" if base[key] else f"{value:20.4g}")
        print(f"{name:16} " + " ".join(f"{c:>20}" for c in cells))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--tight-mib", type=int, default=2)
    p.add_argument("--ample-mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mesh", action="store_true", help="the burst workload through live meshes instead")
    p.add_argument("--mesh-pool-mib", type=int, default=4)
    args = p.parse_args()
    if args.mesh:
        return mesh_burst(args)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 4000) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    params = [SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)] * args.batch
    model = str(ensure_default_model())
    config = SchedulerConfig(chunk_size=args.chunk_size, enable_prefix_caching=False)
    print(f"({args.batch} x ({args.prompt_len} + {args.output_len}) tokens, chunk {args.chunk_size}, built-in model; "
          f"median of {args.rounds} rounds)")
    print(f"{'pool':>6} {'setting':16} {'blocks':>7} {'tok/s':>8} {'ratio':>7} {'running':>8} {'peak':>6} "
          f"{'preempted':>10} {'= fp32':>7}")
    for pool_name, mib in (("tight", args.tight_mib), ("ample", args.ample_mib)):
        engines = {name: OfflineEngine(EngineConfig(model=model, kv_cache_bytes=mib << 20, kv_cache_dtype=dtype,
                                                    cpu_kernels=kernels, swap_bytes=512 << 20), config)
                   for name, (dtype, kernels) in SETTINGS.items()}
        results, outputs = alternating_rounds(engines, prompts, params, args.rounds)
        if outputs["fp32 kernels"] != outputs["fp32 torch ops"]:
            print("fp32 outputs differ between the kernels and the torch ops", file=sys.stderr)
        base = statistics.median(f[0] for f in results["fp32 kernels"])
        for name, figures in results.items():
            rate = statistics.median(f[0] for f in figures)
            running, blocks, preempted = (max(f[i] for f in figures) for i in (1, 2, 3))
            same = sum(a == b for a, b in zip(outputs[name], outputs["fp32 kernels"], strict=True))
            print(f"{pool_name:>6} {name:16} {engines[name].runner.kv.num_blocks:7} {rate:8.0f} {rate / base:6.2f}x "
                  f"{running:8} {blocks:6} {preempted:10} {same:4}/{args.batch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
