"""Correctness under load: random concurrent requests against live meshes with a tight KV pool.

Each configuration (policy, mode, extra scheduler flags) starts a mesh whose workers hold a small KV pool
(``--kv-cache-bytes``, 32 blocks of the built-in model by default), so requests are preempted, swapped and
recomputed all the time. Requests arrive over ``--spread`` seconds with random prompt lengths (4-300
tokens), output lengths (1-120), priorities; some are aborted after their second token, and some
(``--early-aborts``) 0-100 ms after they were sent: while queued, admitted, loading a prefix. Then:

* every request that ran to its end produced exactly transformers' greedy tokens (the oracle), or left
  them only at a near-tie, where the two best logits are within 1e-4 of each other and fp32 rounding picks
  (transformers' own cached decode and its full forward disagree there too); near-ties are counted;
* once all are done, no worker holds a block for a live sequence (device or host): nothing leaked.

With ``--kvcache`` the mesh has the kvcache service too, and about half the requests are a later turn of an
earlier one (its prompt, its output, and new tokens, in the same session): their prefixes are stored after
each turn and loaded from kvcache (DualPath) while the pool is under the same pressure (the workers' own
prefix caches are off, so every hit is a kvcache load).

    .venv/bin/python bench/soak.py                                   # every policy, both modes
    .venv/bin/python bench/soak.py --configs fastserve:colocated "sarathi:disaggregated:--kv-transport grpc"
    .venv/bin/python bench/soak.py --requests 120 --seed 7

``--kill-at S`` adds a crash: S seconds into the load one worker, drawn from the seed, is killed (SIGKILL)
and started again ``--respawn-after`` seconds later. Its requests must be recomputed elsewhere (or once it is
back) and still match transformers; their streams must go on; no block may leak. ``--workers N`` gives the
mesh N decode (colocated: hybrid) workers, so another can take over at once.

    .venv/bin/python bench/soak.py --workers 2 --kill-at 1.0 --kvcache

An attention-free model's blocks hold no bytes (``--kv-bytes`` sizes nothing): its pool is ``--state-slots``
sequences of the served context, so ``--worker-args "--state-slots 1 --max-model-len 512"`` gives it 32 blocks.

Exit status 1 when any request differs or any block leaked. Too long for the default test suite (a minute
or so per configuration); run it after changing the scheduler core, the step loop or the KV paths.
"""

from __future__ import annotations

import argparse
import functools
import random
import shlex
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seawall import AsyncClient  # noqa: E402
from seawall.launcher import LocalMesh, MeshOptions  # noqa: E402
from services.common.errors import ResourceExhausted  # noqa: E402
from services.engine.checkpoint import resolve_model_dir  # noqa: E402

STREAM_TIMEOUT_S = 300
NEAR_TIE = 1e-4  # both tokens within this of the best logit: either is a right answer
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
    parent: int | None = None  # a later turn of this request: its prompt follows the parent's prompt and output
    abort_early: float | None = None  # abort it this many seconds after sending it, whatever it is doing then


def make_requests(n: int, seed: int, spread: float, sessions: bool = False,
                  early_aborts: float = 0.0) -> list[SoakRequest]:
    """``early_aborts``: the share of requests aborted 0-100 ms after they are sent (queued, being admitted,
    loading their prefix, computing it): drawn apart, so a seed's requests are the same with or without."""
    rng, early = random.Random(seed), random.Random(seed + 1_000_003)
    out = []
    for i in range(n):
        parent = rng.randrange(i) if sessions and i and rng.random() < 0.5 else None
        length = rng.randint(4, 40) if parent is not None or rng.random() < 0.5 else rng.randint(40, 300)
        out.append(SoakRequest(i, tuple(rng.randrange(3, 4096) for _ in range(length)), rng.randint(1, 120),
                               rng.choice((0, 0, 0, -1, 2)), rng.random() < 0.15, rng.random() * spread, parent,
                               early.uniform(0, 0.1) if early.random() < early_aborts else None))
    return out


class Oracle:
    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])

    def gaps(self, tokens: list[int], a: int, b: int) -> tuple[float, float]:
        """How far ``a`` and ``b`` are below the best logit after ``tokens``."""
        with torch.no_grad():
            logits = self.model(torch.tensor([tokens])).logits[0, -1]
        best = logits.max()
        return float(best - logits[a]), float(best - logits[b])

    @functools.cache  # noqa: B019 - one oracle per run; its cache is the point
    def greedy(self, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
        ids = torch.tensor([prompt])
        with torch.no_grad():  # every position attended: a later turn's prompt may hold any token, pad id included
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                      do_sample=False, pad_token_id=0)
        ids = out[0, len(prompt):].tolist()
        return ids[: next((k + 1 for k, t in enumerate(ids) if t in self.eos), len(ids))]


async def _load(address: str, requests: list[SoakRequest], oracle: Oracle, sessions: bool,
                chaos: Callable[[], Awaitable[None]] | None = None) -> tuple[list[str], int, int, list]:
    problems: list[str] = []
    finished = aborted = refused = 0
    # The requests that ran to their end, compared with transformers once the load is over: its generate, run
    # here, would hold the event loop (every stream's reading) and a core for seconds per request on a slow
    # model (Kimi Linear's torch KDA), starving the mesh it checks.
    ended_runs: list[tuple[SoakRequest, tuple[int, ...], list[int], str | None]] = []
    ended = {r.index: anyio.Event() for r in requests}
    history: dict[int, tuple[int, ...]] = {}  # a request's prompt and output: what a later turn starts with
    async with AsyncClient(address) as client:
        stats = await client.stats()
        pool_tokens = min(w.num_device_blocks for w in stats.workers) * 16

        async def one(r: SoakRequest) -> None:
            try:
                await turn(r)
            finally:
                ended[r.index].set()

        async def turn(r: SoakRequest) -> None:
            nonlocal finished, aborted, refused
            await anyio.sleep(r.delay)
            prompt = r.prompt
            if r.parent is not None:
                await ended[r.parent].wait()
                prompt = history.get(r.parent, ()) + r.prompt
            # Every turn of a conversation, the first too, is in its session: its KV is kept for the next one.
            session = {"session_id": f"soak-session-{_root(requests, r.index)}"} if sessions else {}
            got: list[int] = []
            try:
                finish = await _stream(client, r, prompt, session, got)
                if finish == "abort":
                    aborted += 1
                    return
            except ResourceExhausted as exc:
                # A later turn can outgrow the tight pool: refusing it at once is right (it could never finish).
                if not got and len(prompt) + r.max_tokens > pool_tokens:
                    refused += 1
                else:
                    problems.append(f"request {r.index}: refused though it fits the pool: {exc}")
                return
            except Exception as exc:  # noqa: BLE001 - reported as a problem, the soak goes on
                problems.append(f"request {r.index}: {type(exc).__name__}: {exc}")
                return
            history[r.index] = prompt + tuple(got)
            ended_runs.append((r, prompt, got, finish))
            finished += 1

        async with anyio.create_task_group() as tg:
            for r in requests:
                tg.start_soon(one, r)
            if chaos is not None:
                tg.start_soon(chaos)
        await anyio.sleep(0.5)  # the last drops reach the workers' cores
        stats = await client.stats()
    verdicts = [_compare(oracle, *run) for run in ended_runs]  # "" exact, "tie", or the problem
    held = [(w.worker_id, w.num_device_blocks_used, w.num_host_blocks_used) for w in stats.workers]
    problems += [f"{w} holds {d} device and {h} host blocks after every request ended" for w, d, h in held if d or h]
    problems += [v for v in verdicts if v and v != "tie"]
    return problems, finished, aborted, [stats.num_preemptions, refused, verdicts.count("tie")]


async def _stream(client: AsyncClient, r: SoakRequest, prompt: tuple[int, ...], session: dict,
                  got: list[int]) -> str | None:
    """Streams one request into ``got``, aborting it as ``r`` says; its finish reason. A stream that does not
    end in ``STREAM_TIMEOUT_S`` (an abort that did not end it, a request stuck) raises TimeoutError."""
    state = {"finish": None, "asked": False}
    try:
        with anyio.fail_after(STREAM_TIMEOUT_S):
            await _read(client, r, prompt, session, got, state)
    except TimeoutError:
        raise TimeoutError(f"its stream did not end in {STREAM_TIMEOUT_S} s ({len(got)} tokens, "
                           f"{'aborted' if state['asked'] else 'not aborted'} by the soak)") from None
    return state["finish"]


async def _read(client: AsyncClient, r: SoakRequest, prompt: tuple[int, ...], session: dict, got: list[int],
                state: dict) -> None:
    rid, error = f"soak-{r.index}", None

    async def abort(delay: float = 0.0) -> None:
        await anyio.sleep(delay)
        state["asked"] = await client.abort(rid) or state["asked"]

    async with anyio.create_task_group() as tg:
        if r.abort_early is not None:
            tg.start_soon(abort, r.abort_early)
        try:
            async for chunk in client.stream(list(prompt), max_tokens=r.max_tokens, temperature=0,
                                             priority=r.priority, request_id=rid, **session):
                got += chunk.token_ids
                state["finish"] = chunk.finish_reason or state["finish"]
                if r.abort and len(got) >= 2 and state["finish"] is None and not state["asked"]:
                    await abort()
        except Exception as exc:  # noqa: BLE001 - raised as itself below, not in an exception group
            error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error


def _compare(oracle: Oracle, r: SoakRequest, prompt: tuple[int, ...], got: list[int], finish: str | None) -> str:
    """"" when ``got`` is transformers' greedy output, "tie" when it left it at a near-tie, else the problem."""
    want = oracle.greedy(prompt, r.max_tokens)
    if got == want:
        return ""
    at = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    gaps = "-"
    if at < min(len(got), len(want)):
        ours, theirs = oracle.gaps(list(prompt) + got[:at], got[at], want[at])
        # A random model has near-ties where fp32 rounding decides the argmax (transformers' own cached decode
        # and its full forward disagree there too): both continuations are right.
        if max(ours, theirs) <= NEAR_TIE:
            return "tie"
        gaps = f"{ours:.3g} / {theirs:.3g}"
    return (f"request {r.index} (prompt {len(prompt)}, max_tokens {r.max_tokens}, priority {r.priority}"
            f"{', a later turn' if r.parent is not None else ''}): its {len(got)} tokens (finish {finish}) differ "
            f"from transformers' {len(want)} from position {at} (logits below the best there, ours / theirs: "
            f"{gaps})")


def _kvcache_loads(address: str) -> int:
    """Prefixes the kvcache service loaded into workers (either read path): later turns that hit."""
    import grpc

    from seawall.v1 import kvcache_pb2, kvcache_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stats = kvcache_pb2_grpc.KVCacheStub(channel).Stats(kvcache_pb2.KVCacheStatsRequest())
    return sum(p.num_loads for p in stats.paths)


def _root(requests: list[SoakRequest], index: int) -> int:
    """The first turn of the conversation ``index`` belongs to: its session."""
    while requests[index].parent is not None:
        index = requests[index].parent
    return index


def soak(config: str, args: argparse.Namespace, oracle: Oracle, model_dir: Path) -> list[str]:
    policy, mode, *flags = config.split(":", 2)
    extra = shlex.split(flags[0]) if flags else []
    log_dir = Path(tempfile.mkdtemp(prefix="seawall-soak-"))
    options = MeshOptions(model=str(model_dir), mode=mode, num_prefill=0 if mode == "colocated" else 1,
                          # the HTTP API for /metrics: how many requests a killed worker's death moved
                          num_decode=args.workers, grpc_port=0, http_port=0 if args.kill_at is not None else None,
                          # Without the workers' own prefix cache every later turn's prefix comes from kvcache.
                          scheduler_args=["--policy", policy, *(["--no-prefix-caching"] if args.kvcache else []),
                                          *extra],
                          worker_args=["--kv-cache-bytes", str(args.kv_bytes), "--swap-bytes",
                                       str(4 * args.kv_bytes), *shlex.split(args.worker_args)],
                          log_dir=log_dir, startup_timeout_s=180, kvcache=args.kvcache)
    mesh = LocalMesh(options)
    mesh.start()
    killed: list[str] = []
    try:
        requests = make_requests(args.requests, args.seed, args.spread, sessions=args.kvcache,
                                 early_aborts=args.early_aborts)
        chaos = None
        if args.kill_at is not None:
            workers = [c.name for c in mesh.children if c.name.startswith(("prefill-", "decode-"))]
            victim = random.Random(args.seed + 2_000_003).choice(workers)

            async def chaos() -> None:
                await anyio.sleep(args.kill_at)
                await anyio.to_thread.run_sync(mesh.kill, victim)
                killed.append(victim)
                await anyio.sleep(args.respawn_after)
                await anyio.to_thread.run_sync(mesh.respawn, victim)

        problems, finished, aborted, (preemptions, refused, ties) = anyio.run(
            _load, mesh.grpc_address, requests, oracle, args.kvcache, chaos)
        loads = _kvcache_loads(mesh.kvcache_address) if args.kvcache else None
        moved = mesh.counter("seawall_requests_moved") if killed else None
    finally:
        mesh.stop()
    verdict = "ok" if not problems else f"{len(problems)} PROBLEMS (logs: {log_dir})"
    print(f"{config:45} finished {finished:4} (near-ties {ties}) aborted {aborted:3} refused {refused:2} "
          f"preemptions {preemptions:5}"
          + (f" kvcache loads {loads:3}" if loads is not None else "")
          + (f" killed {killed[0]} (moving {moved:.0f} requests)" if killed else "") + f"  {verdict}", flush=True)
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
    p.add_argument("--kvcache", action="store_true",
                   help="start the kvcache service and make about half the requests later turns of earlier ones")
    p.add_argument("--early-aborts", type=float, default=0.1,
                   help="share of requests aborted 0-100 ms after they are sent, whatever they are doing then "
                        "(default 0.1)")
    p.add_argument("--workers", type=int, default=1,
                   help="decode workers (colocated: hybrid workers) per mesh (default 1)")
    p.add_argument("--kill-at", type=float, default=None, metavar="S",
                   help="kill one worker (drawn from the seed) S seconds into the load, with SIGKILL")
    p.add_argument("--respawn-after", type=float, default=1.0, metavar="S",
                   help="with --kill-at: start the killed worker again this many seconds later (default 1)")
    p.add_argument("--model", default=None, help="checkpoint dir (default: the built-in model)")
    p.add_argument("--worker-args", default="", help="more worker flags, one string (an attention-free model's pool "
                                                      "is --state-slots sequences of --max-model-len tokens: "
                                                      "'--state-slots 1 --max-model-len 512' makes 32 blocks)")
    args = p.parse_args(argv)
    # A SIGTERM (timeout, kill) unwinds like Ctrl-C, so each mesh's finally stops its processes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model_dir = Path(resolve_model_dir(args.model))
    oracle = Oracle(model_dir)
    problems = [x for k, config in enumerate(args.configs)
                for x in soak(config, argparse.Namespace(**{**vars(args), "seed": args.seed + k}), oracle, model_dir)]
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
