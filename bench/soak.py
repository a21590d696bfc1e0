"""Correctness under load: random concurrent requests against live meshes with a tight KV pool.

Each configuration (policy, mode, extra scheduler flags) starts a mesh whose workers hold a small KV pool
(``--kv-cache-bytes``, 32 blocks of the built-in model by default), so requests are preempted, swapped and
recomputed all the time. Requests arrive over ``--spread`` seconds with random prompt lengths (4-300
tokens), output lengths (1-120), priorities, and some are aborted after their second token. Then:

* every request that ran to its end produced exactly transformers' greedy tokens (the oracle);
* once all are done, no worker holds a block for a live sequence (device or host): nothing leaked.

    .venv/bin/python bench/soak.py                                   # every policy, both modes
    .venv/bin/python bench/soak.py --configs fastserve:colocated "sarathi:disaggregated:--kv-transport grpc"
    .venv/bin/python bench/soak.py --requests 120 --seed 7

Exit status 1 when any request differs or any block leaked. Too long for the default test suite (a minute
or so per configuration); run it after changing the scheduler core, the step loop or the KV paths.
"""

from __future__ import annotations

import argparse
import functools
import random
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seawall import AsyncClient  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402
from services.engine.runner import resolve_model_dir  # noqa: E402

DEFAULT_CONFIGS = [f"{p}:{m}" for p in ("sarathi", "vllm", "fcfs", "fastserve", "fastserve+sarathi")
                   for m in ("colocated", "disaggregated")]


@dataclass(frozen=True)
class SoakRequest:
    index: int
    prompt: tuple[int, ...]
    max_tokens: int
    priority: int
    abort: bool  # abort it after its second token
    delay: float


def make_requests(n: int, seed: int, spread: float) -> list[SoakRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(4, 40) if rng.random() < 0.5 else rng.randint(40, 300)
        out.append(SoakRequest(i, tuple(rng.randrange(3, 4096) for _ in range(length)), rng.randint(1, 120),
                               rng.choice((0, 0, 0, -1, 2)), rng.random() < 0.15, rng.random() * spread))
    return out


class Oracle:
    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])

    @functools.cache  # noqa: B019 - one oracle per run; its cache is the point
    def greedy(self, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
        with torch.no_grad():
            out = self.model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                      pad_token_id=0)
        ids = out[0, len(prompt):].tolist()
        return ids[: next((k + 1 for k, t in enumerate(ids) if t in self.eos), len(ids))]


async def _load(address: str, requests: list[SoakRequest], oracle: Oracle) -> tuple[list[str], int, int, list]:
    problems: list[str] = []
    finished = aborted = 0
    async with AsyncClient(address) as client:

        async def one(r: SoakRequest) -> None:
            nonlocal finished, aborted
            await anyio.sleep(r.delay)
            got: list[int] = []
            try:
                with anyio.fail_after(300):
                    async for chunk in client.stream(list(r.prompt), max_tokens=r.max_tokens, temperature=0,
                                                     priority=r.priority, request_id=f"soak-{r.index}"):
                        got += chunk.token_ids
                        if r.abort and len(got) >= 2:
                            await client.abort(f"soak-{r.index}")
                            aborted += 1
                            return
            except Exception as exc:  # noqa: BLE001 - reported as a problem, the soak goes on
                problems.append(f"request {r.index}: {type(exc).__name__}: {exc}")
                return
            want = oracle.greedy(r.prompt, r.max_tokens)
            if got != want:
                at = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                          min(len(got), len(want)))
                problems.append(f"request {r.index} (prompt {len(r.prompt)}, max_tokens {r.max_tokens}, priority "
                                f"{r.priority}): its {len(got)} tokens differ from transformers' {len(want)} "
                                f"from position {at}")
            finished += 1

        async with anyio.create_task_group() as tg:
            for r in requests:
                tg.start_soon(one, r)
        await anyio.sleep(0.5)  # the last drops reach the workers' cores
        stats = await client.stats()
    held = [(w.worker_id, w.num_device_blocks_used, w.num_host_blocks_used) for w in stats.workers]
    problems += [f"{w} holds {d} device and {h} host blocks after every request ended" for w, d, h in held if d or h]
    return problems, finished, aborted, [stats.num_preemptions]


def soak(config: str, args: argparse.Namespace, oracle: Oracle, model_dir: Path) -> list[str]:
    policy, mode, *flags = config.split(":", 2)
    extra = shlex.split(flags[0]) if flags else []
    log_dir = Path(tempfile.mkdtemp(prefix="seawall-soak-"))
    options = MeshOptions(model=str(model_dir), mode=mode, num_prefill=0 if mode == "colocated" else 1,
                          num_decode=1, grpc_port=0, http_port=None, scheduler_args=["--policy", policy, *extra],
                          worker_args=["--kv-cache-bytes", str(args.kv_bytes), "--swap-bytes",
                                       str(4 * args.kv_bytes)],
                          log_dir=log_dir, startup_timeout_s=180)
    mesh = LocalMesh(options)
    mesh.start()
    try:
        requests = make_requests(args.requests, args.seed, args.spread)
        problems, finished, aborted, (preemptions,) = anyio.run(_load, mesh.grpc_address, requests, oracle)
    finally:
        mesh.stop()
    verdict = "ok" if not problems else f"{len(problems)} PROBLEMS (logs: {log_dir})"
    print(f"{config:45} finished {finished:4} aborted {aborted:3} preemptions {preemptions:5}  {verdict}", flush=True)
    for p in problems[:10]:
        print(f"    {p}", flush=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS,
                   help="POLICY:MODE[:SCHEDULER FLAGS] each (default: every policy, colocated and disaggregated)")
    p.add_argument("--requests", type=int, default=40, help="requests per configuration (default 40)")
    p.add_argument("--spread", type=float, default=1.5, help="arrivals over this many seconds (default 1.5)")
    p.add_argument("--kv-bytes", type=int, default=2**20, help="KV pool per worker (default 1 MiB: 32 blocks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="checkpoint dir (default: the built-in model)")
    args = p.parse_args(argv)
    model_dir = Path(resolve_model_dir(args.model))
    oracle = Oracle(model_dir)
    problems = [x for k, config in enumerate(args.configs)
                for x in soak(config, argparse.Namespace(**{**vars(args), "seed": args.seed + k}), oracle, model_dir)]
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
