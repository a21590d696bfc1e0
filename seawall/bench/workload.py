"""What a benchmark sends: ``BenchRequest``s with synthetic prompt token ids, arrival times and output lengths.

Three kinds of workload (``WorkloadSpec.kind``):

* ``custom``: lengths from ``lengths`` and arrivals from ``arrivals.ArrivalSpec``, or a trace's own
  timestamps (``arrival="trace"``, ``azure-conv``/``mooncake-conv``; stretched by ``time_scale`` or rescaled
  to ``rate`` when given). Lengths: ``fixed``; ``pareto`` (fixed prompts, Pareto outputs: a long tail);
  ``sharegpt``, ``longtail`` (ShareGPT prompts, Pareto outputs), ``azure-conv``, ``mooncake-conv`` (the
  traces in bench/traces, via ``seawall.sim.workloads``), each scaled by ``length_scale``.
* ``burst``: the seed's scenario. ``steady_users`` requests (``steady_prompt_len``, ``steady_output_len``)
  start over the first ``steady_ramp_s`` seconds and decode steadily; at ``burst_at`` seconds ``burst_size``
  long prompts (``burst_prompt_len``, ``burst_output_len``) arrive at once.
* ``mooncake``: the Mooncake conversation trace as multi-turn sessions (``seawall.workloads.multiturn``):
  turns share their prefix blocks and carry a ``session_id``; 512-token blocks scaled to ``block_tokens``.

``shared_prefix_len`` puts a system prompt of that many tokens in front of every prompt of ``custom`` and of
every burst prompt of ``burst`` (vLLM bench's ``--random-prefix-len``); ``shared_prefix_groups`` splits the
requests, in arrival order, into that many groups with a system prompt each (SGLang bench's
generated-shared-prefix groups), e.g. one per burst. Requests arriving together then share their first
blocks, which the prefix cache, and the scheduler's wait for blocks another request in the step is computing,
turn into work done once.

Prompts are random token ids in ``[3, vocab_size)`` (0-2 are left to special tokens), drawn from the seed and
the request's index, so every policy of a comparison gets the same prompts. Outputs run to exactly their
length (``ignore_eos``, greedy), so every policy does the same work.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field

from seawall.bench.arrivals import ArrivalSpec, arrival_times, burst_groups, count_for_duration
from seawall.sim.workloads import WorkloadConfig, make_workload
from services.common.errors import InvalidArgument

KINDS = ("custom", "burst", "mooncake")
LENGTHS = ("fixed", "pareto", "sharegpt", "longtail", "azure-conv", "mooncake-conv")
FIRST_TOKEN_ID = 3


@dataclass(frozen=True)
class BenchRequest:
    index: int
    arrival: float  # seconds from the start of the run
    prompt: tuple[int, ...]
    max_tokens: int
    role: str = ""  # burst workload: "steady" or "burst"
    session_id: str = ""
    priority: int = 0  # lower runs sooner (the API's meaning)
    model: str = ""  # a LoRA adapter's name; "" = the base model


@dataclass(frozen=True)
class Workload:
    requests: list[BenchRequest]
    # Each burst: (when it began, the indices of its requests), for the stall metrics.
    bursts: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    description: str = ""

    @property
    def num_output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str = "custom"
    arrivals: ArrivalSpec = ArrivalSpec()
    num_requests: int = 64
    duration: float | None = None  # send only requests arriving before this (seconds)
    seed: int = 0
    prompt_salt: int = 0  # changes the prompts only: runs on one mesh must not hit each other's prefix cache
    vocab_size: int = 4096
    max_model_len: int = 4096  # prompt + output of every request stays within this
    # custom lengths
    lengths: str = "fixed"
    prompt_len: int = 128
    output_len: int = 64
    pareto_alpha: float = 1.2
    pareto_min: int = 8
    max_output_len: int = 512
    length_scale: float = 1.0  # trace lengths are multiplied by this
    time_scale: float = 1.0  # trace timestamps are multiplied by this (without an explicit rate)
    trace_rate: float | None = None  # trace timestamps rescaled to this mean rate
    trace_offset: int = 0
    # the burst scenario
    steady_users: int = 16
    steady_prompt_len: int = 64
    steady_output_len: int = 512
    steady_ramp_s: float = 0.5
    burst_at: float = 3.0
    burst_size: int = 8
    burst_prompt_len: int = 1024
    burst_output_len: int = 16
    # mooncake sessions
    block_tokens: int = 16
    # custom and burst: a system prompt of this many tokens in front of every (burst) prompt, one per group
    shared_prefix_len: int = 0
    shared_prefix_groups: int = 1
    # every kind: (priority, share of the requests) pairs; the rest run at priority 0
    priority_mix: tuple[tuple[int, float], ...] = ()
    # every kind: each request runs one of these LoRA adapters, drawn from the seed (vLLM bench's
    # --lora-modules); none = the base model
    lora_names: tuple[str, ...] = ()


def prompt_ids(seed: int, index: int, length: int, vocab_size: int, salt: int = 0) -> tuple[int, ...]:
    rng = random.Random(f"seawall-bench:{seed}:{salt}:{index}")
    return tuple(rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(length))


def _prompt(spec: WorkloadSpec, index: int, length: int, group: int | None = None) -> tuple[int, ...]:
    """Request ``index``'s ``length`` prompt tokens; in a ``group``, its system prompt first (cut to leave at
    least one token of the request's own)."""
    k = min(spec.shared_prefix_len, length - 1) if group is not None else 0
    # Negative indices are no request's: a system prompt is drawn like a prompt, salted like the rest.
    prefix = prompt_ids(spec.seed, -1 - group, k, spec.vocab_size, spec.prompt_salt) if k else ()
    return prefix + prompt_ids(spec.seed, index, length - k, spec.vocab_size, spec.prompt_salt)


def _group(spec: WorkloadSpec, position: int, count: int) -> int:
    """The system-prompt group of the ``position``-th of ``count`` requests sharing them (arrival order)."""
    return position * spec.shared_prefix_groups // count


def build(spec: WorkloadSpec) -> Workload:
    return with_adapters(spec, with_priorities(spec, _build(spec)))


def _build(spec: WorkloadSpec) -> Workload:
    if spec.shared_prefix_len < 0 or spec.shared_prefix_groups < 1:
        raise InvalidArgument("--shared-prefix-len must be >= 0 and --shared-prefix-groups >= 1")
    if spec.shared_prefix_len and spec.kind == "mooncake":
        raise InvalidArgument("--shared-prefix-len is for the custom and burst workloads; the Mooncake trace "
                              "shares its own prefixes")
    if spec.kind == "burst":
        return _burst(spec)
    if spec.kind == "mooncake":
        return _mooncake(spec)
    if spec.kind != "custom":
        raise InvalidArgument(f"unknown workload {spec.kind!r}; known: {', '.join(KINDS)}")
    return _custom(spec)


def _custom(spec: WorkloadSpec) -> Workload:
    arr = spec.arrivals
    n = spec.num_requests
    if spec.duration is not None:
        n = count_for_duration(arr, spec.duration) if arr.process != "trace" else n
    if arr.process == "trace":
        times, lengths = _trace(spec, n)
    else:
        times = arrival_times(arr, n, spec.seed)
        lengths = _lengths(spec, n)
    if spec.duration is not None:
        keep = [i for i, t in enumerate(times) if t < spec.duration]
        times, lengths = [times[i] for i in keep], [lengths[i] for i in keep]
    if not times:
        raise InvalidArgument("the workload is empty: no request arrives within --duration")
    if spec.shared_prefix_len:
        lengths = [_fit(spec, spec.shared_prefix_len + p, o) for p, o in lengths]
    reqs = [BenchRequest(i, t, _prompt(spec, i, p, _group(spec, i, len(times))), o)
            for i, (t, (p, o)) in enumerate(zip(times, lengths, strict=True))]
    bursts = burst_groups(arr, times) if arr.process != "trace" else []
    where = f"{arr.process} arrivals" + (f" at {arr.rate:g}/s" if arr.process in ("poisson", "gamma", "onoff")
                                         else "")
    shared = f", {_system_prompts(spec)}" if spec.shared_prefix_len else ""
    return Workload(reqs, bursts, f"{len(reqs)} requests, {spec.lengths} lengths{shared}, {where}")


def _system_prompts(spec: WorkloadSpec) -> str:
    g = spec.shared_prefix_groups
    return f"{'one' if g == 1 else g} {spec.shared_prefix_len}-token system prompt{'s' if g > 1 else ''}"


def _fit(spec: WorkloadSpec, prompt: int, output: int) -> tuple[int, int]:
    """Lengths of at least one token each, with prompt + output within the model's context."""
    prompt, output = max(1, prompt), max(1, output)
    room = spec.max_model_len - 1
    if prompt + output > room:
        output = max(1, min(output, room // 4))
        prompt = min(prompt, room - output)
    return prompt, output


def _lengths(spec: WorkloadSpec, n: int) -> list[tuple[int, int]]:
    if spec.lengths == "fixed":
        return [_fit(spec, spec.prompt_len, spec.output_len)] * n
    if spec.lengths == "pareto":
        if spec.pareto_alpha <= 0 or spec.pareto_min < 1:
            raise InvalidArgument("--pareto-alpha must be > 0 and --pareto-min >= 1")
        rng = random.Random(f"seawall-bench-lengths:{spec.seed}")
        return [_fit(spec, spec.prompt_len, min(spec.max_output_len,
                                                math.ceil(spec.pareto_min * rng.paretovariate(spec.pareto_alpha))))
                for _ in range(n)]
    if spec.lengths not in LENGTHS:
        raise InvalidArgument(f"unknown lengths {spec.lengths!r}; known: {', '.join(LENGTHS)}")
    cfg = WorkloadConfig(lengths=spec.lengths, arrival="burst", num_requests=n, seed=spec.seed,
                         trace_offset=spec.trace_offset, pareto_alpha=spec.pareto_alpha,
                         pareto_min=spec.pareto_min, max_output_len=spec.max_output_len)
    return [_scaled(spec, r.prompt_len, r.output_len) for r in make_workload(cfg)]


def _scaled(spec: WorkloadSpec, prompt: int, output: int) -> tuple[int, int]:
    s = spec.length_scale
    return _fit(spec, round(prompt * s), round(output * s))


def _trace(spec: WorkloadSpec, n: int) -> tuple[list[float], list[tuple[int, int]]]:
    if spec.lengths not in ("azure-conv", "mooncake-conv"):
        raise InvalidArgument("trace arrivals need a timestamped trace: --lengths azure-conv or mooncake-conv")
    cfg = WorkloadConfig(lengths=spec.lengths, arrival="trace", num_requests=n, qps=spec.trace_rate,
                         seed=spec.seed, time_scale=spec.time_scale, trace_offset=spec.trace_offset)
    rows = make_workload(cfg)
    return [r.arrival for r in rows], [_scaled(spec, r.prompt_len, r.output_len) for r in rows]


def _burst(spec: WorkloadSpec) -> Workload:
    if spec.steady_users < 1 or spec.burst_size < 1:
        raise InvalidArgument("--steady-users and --burst-size must be >= 1")
    if spec.burst_at <= spec.steady_ramp_s:
        raise InvalidArgument("--burst-at must come after the steady users have started (--steady-ramp-s)")
    reqs = []
    for i in range(spec.steady_users):
        p, o = _fit(spec, spec.steady_prompt_len, spec.steady_output_len)
        t = spec.steady_ramp_s * i / spec.steady_users
        reqs.append(BenchRequest(i, t, _prompt(spec, i, p), o, role="steady"))
    for j in range(spec.burst_size):
        i = spec.steady_users + j
        p, o = _fit(spec, spec.shared_prefix_len + spec.burst_prompt_len, spec.burst_output_len)
        reqs.append(BenchRequest(i, spec.burst_at, _prompt(spec, i, p, _group(spec, j, spec.burst_size)), o,
                                 role="burst"))
    members = tuple(range(spec.steady_users, spec.steady_users + spec.burst_size))
    return Workload(reqs, [(spec.burst_at, members)],
                    f"burst: {spec.steady_users} users decoding {spec.steady_output_len} tokens, then "
                    f"{spec.burst_size} prompts of {spec.burst_prompt_len} tokens"
                    + (f" after {_system_prompts(spec)}" if spec.shared_prefix_len else "")
                    + f" at t={spec.burst_at:g}s")


def _mooncake(spec: WorkloadSpec) -> Workload:
    from seawall.workloads.multiturn import MooncakeReplayConfig, mooncake_conversation

    cfg = MooncakeReplayConfig(limit=spec.num_requests, offset=spec.trace_offset, block_tokens=spec.block_tokens,
                               vocab_size=spec.vocab_size, seed=spec.seed, time_scale=spec.time_scale,
                               max_model_len=spec.max_model_len)
    turns = mooncake_conversation(cfg)
    if spec.duration is not None:
        turns = [t for t in turns if t.arrival_s < spec.duration]
    if not turns:
        raise InvalidArgument("the Mooncake replay is empty (no record fits --max-model-len / --duration)")
    reqs = [BenchRequest(i, t.arrival_s, tuple(t.prompt_token_ids.tolist()), max(1, t.max_tokens),
                         session_id=t.session_id) for i, t in enumerate(turns)]
    return Workload(reqs, [], f"mooncake: {len(reqs)} turns of {len({t.session_id for t in turns})} sessions, "
                              f"{spec.block_tokens} tokens per 512-token block")


def parse_priority_mix(text: str) -> tuple[tuple[int, float], ...]:
    """``"-1:0.2,1:0.5"`` -> ``((-1, 0.2), (1, 0.5))``: 20 % of the requests at priority -1, half at 1."""
    mix = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        priority, sep, share = item.partition(":")
        try:
            if not sep:
                raise ValueError
            mix.append((int(priority), float(share)))
        except ValueError:
            raise InvalidArgument(f"--priority-mix: {item!r} is not PRIORITY:SHARE (e.g. -1:0.2, lower runs "
                                  "sooner)") from None
    return tuple(mix)


def with_priorities(spec: WorkloadSpec, workload: Workload) -> Workload:
    """Gives ``round(share * n)`` of the requests each priority of ``spec.priority_mix``, which ones drawn from
    the seed: every policy of a comparison sees the same requests in each class."""
    mix = spec.priority_mix
    if not mix:
        return workload
    shares = [s for _, s in mix]
    if any(not 0 < s <= 1 for s in shares) or sum(shares) > 1 + 1e-9:
        raise InvalidArgument(f"--priority-mix: each share must be in (0, 1] and together at most 1, got {shares}")
    if len({p for p, _ in mix}) < len(mix) or any(p == 0 for p, _ in mix):
        raise InvalidArgument("--priority-mix: name each priority once, and not 0 (the rest's priority)")
    order = list(range(len(workload.requests)))
    random.Random(f"seawall-bench-priority:{spec.seed}").shuffle(order)
    assigned: dict[int, int] = {}
    start = 0
    for priority, share in mix:
        count = round(share * len(order))
        assigned.update((k, priority) for k in order[start:start + count])
        start += count
    reqs = [dataclasses.replace(r, priority=assigned.get(k, 0)) for k, r in enumerate(workload.requests)]
    classes = ", ".join(f"{sum(r.priority == p for r in reqs)} at priority {p}" for p, _ in mix)
    return dataclasses.replace(workload, requests=reqs, description=f"{workload.description} ({classes})")


def with_adapters(spec: WorkloadSpec, workload: Workload) -> Workload:
    """Gives each request one of ``spec.lora_names``, drawn from the seed: every policy of a comparison sees
    the same request run the same adapter."""
    if not spec.lora_names:
        return workload
    rng = random.Random(f"seawall-bench-lora:{spec.seed}")
    reqs = [dataclasses.replace(r, model=rng.choice(spec.lora_names)) for r in workload.requests]
    return dataclasses.replace(workload, requests=reqs, description=f"{workload.description} (each request one of "
                               f"{len(spec.lora_names)} LoRA adapters)")


def without_bursts(workload: Workload, tokens_needed: dict[int, int] | None = None) -> Workload:
    """The burst run's control: the same requests (indices, arrivals, lengths) minus the bursts' own.
    ``tokens_needed`` (request index -> tokens, ``metrics.control_tokens``) cuts each request there and
    leaves out those it does not name: a control is read only up to the last tokens a burst overlapped,
    and a shorter run costs less (the issue's workload: ~700 of 2000 tokens a user)."""
    members = {i for _, group in workload.bursts for i in group}
    reqs = [r for r in workload.requests if r.index not in members]
    if tokens_needed is not None:
        reqs = [dataclasses.replace(r, max_tokens=min(r.max_tokens, tokens_needed[r.index]))
                for r in reqs if r.index in tokens_needed]
    return Workload(reqs, [], f"{workload.description} (control: without its bursts)")


def with_rate(spec: WorkloadSpec, rate: float) -> WorkloadSpec:
    """The same workload (same seed, same pattern) at another mean rate."""
    if spec.arrivals.process == "trace":
        return dataclasses.replace(spec, trace_rate=rate)
    if spec.arrivals.process == "bursts":
        interval = spec.arrivals.burst_size / rate
        return dataclasses.replace(spec, arrivals=dataclasses.replace(spec.arrivals, burst_interval=interval))
    if spec.arrivals.process not in ("poisson", "gamma", "onoff"):
        raise InvalidArgument(f"a rate sweep needs a rate-driven arrival process, not {spec.arrivals.process!r}")
    return dataclasses.replace(spec, arrivals=dataclasses.replace(spec.arrivals, rate=rate))


def nominal_rate(spec: WorkloadSpec) -> float | None:
    a = spec.arrivals
    if spec.kind != "custom":
        return None
    if a.process == "bursts":
        return a.burst_size / a.burst_interval if a.burst_interval > 0 else None
    if a.process == "trace":
        return spec.trace_rate
    return a.rate if a.process in ("poisson", "gamma", "onoff") else None
