"""One benchmark end to end: for each system, start its mesh (``--spawn``) or use the given one, warm it up,
run the workload at each rate (and the capacity search), stop it; then the transformers baseline; then the
summaries, ratios to the first system, request-by-request comparisons and the issue's targets.

Every system gets the same workload: the same seed gives the same arrivals, lengths and prompts. Runs on one
mesh differ only in their prompts' salt, so a later run never hits an earlier run's prefix cache.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from seawall.bench import capacity as cap
from seawall.bench import targets as tg
from seawall.bench.arrivals import describe
from seawall.bench.metrics import RequestRecord, control_metrics, control_tokens, paired, ratios, summarize
from seawall.bench.runner import GrpcBackend, HttpBackend, RunResult, run_load, warm_up
from seawall.bench.workload import Workload, WorkloadSpec, build, nominal_rate, with_rate, without_bursts
from services.common.errors import InvalidArgument
from services.common.grpc_server import uvloop_available

log = logging.getLogger(__name__)
HF_NAME = "hf-transformers"


@dataclass
class BenchOptions:
    workload: WorkloadSpec
    address: str | None = None  # gRPC of a running mesh
    http: str | None = None  # OpenAI API of a running mesh (or use it on the spawned one: "spawn")
    policies: list[str] = field(default_factory=list)  # with a mesh factory: one mesh per policy
    rates: list[float] = field(default_factory=list)  # empty: the workload's own rate
    capacity: bool = False
    start_rate: float = 1.0
    capacity_probes: int = 8
    capacity_tolerance: float = 0.1
    slo_ttft: float | None = None
    slo_tbt: float | None = None
    max_concurrency: int | None = None
    warmup: int = 4
    progress: bool = True
    # --workload burst: also run the workload without its burst on the same mesh, for the steady state at the
    # burst's own tokens (metrics.control_metrics says why)
    burst_control: bool = True
    hf_baseline: bool = False
    hf_max_batch: int = 64
    model_dir: str | None = None  # weights for the transformers baseline
    mesh_flags: list[str] = field(default_factory=list)  # recorded in the report
    repeats: int = 1  # rounds of every system; with more than one the targets are judged on their medians


@dataclass
class System:
    name: str
    summaries: list[dict] = field(default_factory=list)  # one per rate
    records: list[RequestRecord] = field(default_factory=list)  # of the first rate
    control: list[RequestRecord] = field(default_factory=list)  # the burst workload's run without its burst
    capacity: dict | None = None


MeshFactory = Callable[[str], object]  # policy -> a started LocalMesh-like object (grpc_address, http_url, stop)


def _run(fn):
    # The load generator shares the cores with the mesh here: its per-token work is cheaper on uvloop, the
    # services' loop too (services/common/grpc_server.py).
    return anyio.run(fn, backend_options={"use_uvloop": uvloop_available()})


def _backend(opts: BenchOptions, address: str | None, http: str | None):
    if http:
        return HttpBackend(http, stats_address=address)
    return GrpcBackend(address)


def _measure(opts: BenchOptions, address: str | None, http: str | None, spec: WorkloadSpec, tag: str,
             control: dict[int, int] | None = None) -> tuple[Workload, RunResult]:
    """One run of ``spec``; with ``control`` (tokens needed per request), its control run instead."""
    workload = without_bursts(build(spec), control) if control is not None else build(spec)

    async def go() -> RunResult:
        backend = _backend(opts, address, http)
        try:
            return await run_load(backend, workload, max_concurrency=opts.max_concurrency, tag=tag,
                                  progress=opts.progress)
        finally:
            await backend.close()

    return workload, _run(go)


def _warm(opts: BenchOptions, address: str | None, http: str | None, workload: Workload) -> str | None:
    """Warms the mesh up; returns the policy it reports (gRPC only)."""

    async def go() -> str | None:
        backend = _backend(opts, address, http)
        try:
            await warm_up(backend, workload, opts.warmup)
            return await backend.policy() if address else None
        finally:
            await backend.close()

    return _run(go)


def _summary(opts: BenchOptions, workload: Workload, result: RunResult, rate: float | None) -> dict:
    s = summarize(result.records, bursts=workload.bursts, slo_ttft=opts.slo_ttft, slo_tbt=opts.slo_tbt,
                  stats=result.stats)
    return {"rate": rate, "wall_s": result.wall_s, **s}


def _run_system(opts: BenchOptions, name: str, address: str | None, http: str | None, salt: int) -> System:
    spec = opts.workload
    first = build(spec)
    reported = _warm(opts, address, http, first)
    system = System(name if name != "mesh" or not reported else reported)
    rates = opts.rates or [nominal_rate(spec)]
    for k, rate in enumerate(rates):
        spec_k = dataclasses.replace(with_rate(spec, rate) if opts.rates else spec, prompt_salt=salt + k)
        workload, result = _measure(opts, address, http, spec_k, f"{system.name}@{rate or 'run'}")
        system.summaries.append(_summary(opts, workload, result, rate))
        if k == 0:
            system.records = result.records
            control_wanted = opts.burst_control and spec.kind == "burst"
            needed = control_tokens(result.records, workload.bursts) if control_wanted else {}
            if needed:
                spec_c = dataclasses.replace(spec_k, prompt_salt=salt + len(rates))
                _, control = _measure(opts, address, http, spec_c, f"{system.name} control", control=needed)
                system.control = control.records
                system.summaries[0].update(control_metrics(result.records, control.records, workload.bursts))
    if opts.capacity:
        counter = iter(range(salt + len(rates) + 1, salt + len(rates) + 10_000))

        def probe(rate: float) -> dict:
            spec_p = dataclasses.replace(with_rate(spec, rate), prompt_salt=next(counter))
            workload, result = _measure(opts, address, http, spec_p, f"{system.name} capacity@{rate:.3g}/s")
            return _summary(opts, workload, result, rate)

        system.capacity = cap.capacity_search(probe, slo_ttft=opts.slo_ttft, slo_tbt=opts.slo_tbt,
                                              start_rate=opts.start_rate, tolerance=opts.capacity_tolerance,
                                              max_probes=opts.capacity_probes)
    return system


def _hf_system(opts: BenchOptions) -> tuple[System, str]:
    from seawall.bench.hf_baseline import run_hf
    from services.engine.checkpoint import resolve_model_dir

    workload = build(opts.workload)
    records, api = run_hf(resolve_model_dir(opts.model_dir), workload, max_batch=opts.hf_max_batch,
                          progress=opts.progress)
    summary = summarize(records, bursts=workload.bursts, slo_ttft=opts.slo_ttft, slo_tbt=opts.slo_tbt)
    return System(HF_NAME, [{"rate": nominal_rate(opts.workload), **summary}], records), api


def run_bench(opts: BenchOptions, mesh_factory: MeshFactory | None = None
              ) -> tuple[dict, dict[str, list[RequestRecord]], dict[str, list[RequestRecord]]]:
    """Runs every system (``opts.repeats`` rounds of them); returns the report (JSON-ready), the first round's
    records of each system and those of its control run (burst workload; the systems that had one)."""
    if opts.policies and mesh_factory is None:
        raise InvalidArgument("--policies needs --spawn: the benchmark starts one mesh per policy")
    if mesh_factory is None and not (opts.address or opts.http):
        raise InvalidArgument("say where the mesh is: --address HOST:PORT, --http URL, or --spawn")
    if opts.rates and nominal_rate(opts.workload) is None:
        raise InvalidArgument("--rates needs a rate-driven workload (poisson, gamma, onoff, bursts or trace arrivals)")
    if opts.repeats < 1:
        raise InvalidArgument(f"--repeats must be at least 1, got {opts.repeats}")
    notes: list[str] = []
    # Prompts for a mesh someone else started are salted at random: it may hold an earlier run's prefixes.
    salt = 0 if mesh_factory else random.randrange(1, 2**31)
    rounds = [_round(opts, mesh_factory, k, salt + k * ROUND_SALT) for k in range(opts.repeats)]
    systems = rounds[0]
    if opts.hf_baseline:
        try:
            system, api = _hf_system(opts)
            systems.append(system)
            notes.append(f"{HF_NAME}: transformers {api}, in the benchmark's process, same weights and requests"
                         + (" (it has no priorities: every class runs as one)" if opts.workload.priority_mix else ""))
        except Exception as exc:  # noqa: BLE001 - the baseline is a row; its failure is reported, not fatal
            log.exception("transformers baseline failed")
            notes.append(f"{HF_NAME}: failed: {type(exc).__name__}: {exc}")
    report = _report(opts, systems, notes)
    if opts.repeats > 1:
        later = [_report(opts, r, []) for r in rounds[1:]]
        report["rounds"] = [_round_entry(report, k=0)] + [_round_entry(r, k) for k, r in enumerate(later, 1)]
        report["targets"] = tg.over_rounds([tg.figures(r) for r in [report, *later]])
    return (report, {s.name: s.records for s in systems},
            {s.name: s.control for s in systems if s.control})


# A round's prompts are salted apart from every other round's (a run inside a round salts up to 10,000 apart).
ROUND_SALT = 100_000


def _round(opts: BenchOptions, mesh_factory: MeshFactory | None, k: int, salt: int) -> list[System]:
    """One round: each system once, in the given order on even rounds and reversed on odd ones, so that a box
    slowing down over the rounds does not always favour the same policy; returned in the given order."""
    if mesh_factory is None:
        return [_run_system(opts, "mesh", opts.address, opts.http, salt)]
    order = opts.policies if k % 2 == 0 else opts.policies[::-1]
    ran: dict[str, System] = {}
    label = f" (round {k + 1} of {opts.repeats})" if opts.repeats > 1 else ""
    for policy in order:
        print(f"seawall bench: starting a mesh with --policy {policy}{label}", file=sys.stderr, flush=True)
        mesh = mesh_factory(policy)
        try:
            http = mesh.http_url if opts.http else None
            ran[policy] = _run_system(opts, policy, mesh.grpc_address, http, salt)
        finally:
            mesh.stop()
    return [ran[p] for p in opts.policies]


def _round_entry(report: dict, k: int) -> dict:
    return {"round": k + 1, "results": report["results"], "ratios": report["ratios"], "paired": report["paired"],
            "capacity": report["capacity"], "targets": report["targets"]}


def _report(opts: BenchOptions, systems: list[System], notes: list[str]) -> dict:
    first_rate = opts.rates[0] if opts.rates else None
    workload = build(with_rate(opts.workload, first_rate) if first_rate else opts.workload)
    results = {s.name: s.summaries[0] for s in systems}
    base = systems[0]
    for s in systems:
        errors = s.summaries[0]["num_errors"]
        if errors:
            first = next(r.error for r in s.records if r.error)
            notes.append(f"{s.name}: {errors} requests failed (first: {first})")
    report = {
        "version": "seawall-bench/v1",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "command": " ".join(sys.argv),
        "target": {"address": opts.address, "http": opts.http, "mesh_flags": opts.mesh_flags},
        "workload": {"description": workload.description, "spec": dataclasses.asdict(opts.workload),
                     "num_requests": len(workload.requests), "output_tokens": workload.num_output_tokens,
                     "bursts": [b for b, _ in workload.bursts],
                     "arrivals_measured": describe([r.arrival for r in workload.requests])},
        "slo": {"ttft": opts.slo_ttft, "tbt": opts.slo_tbt},
        "baseline": base.name,
        "repeats": opts.repeats,
        "results": results,
        "ratios": ratios(results, base.name),
        "paired": {s.name: paired(s.records, base.records) for s in systems[1:]},
        "sweep": {s.name: s.summaries for s in systems},
        "capacity": {s.name: s.capacity for s in systems if s.capacity is not None},
        "requests": {s.name: [r.as_dict() for r in s.records] for s in systems},
        "notes": notes,
    }
    report["targets"] = tg.judge(tg.figures(report))
    return report


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
