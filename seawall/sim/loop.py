"""The event loop: the real scheduler core (services/scheduler/core) driven by a step-time model.

One replica (a tensor-parallel group) runs one step at a time::

    t = 0
    loop:
        add every request that arrived by t to the core      (the core never reads a clock)
        plan = core.schedule()                                (passed now=t when the core takes it)
        dt   = cost.step_time(shape of the plan) (+ swap time unless overlapped with compute)
        t   += dt; tokens sampled in the step are emitted at t
        core.on_result(plan, sampled)                         (fixed non-EOS token; lengths via max_tokens)
        idle core: jump to the next arrival

The core's policies are selected by name (``SchedulerConfig.policy``): whatever ``POLICIES`` holds runs here,
with the same code a live scheduler uses.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from dataclasses import dataclass

from seawall.sim.cost_model import (
    MeasuredCostModel,
    RooflineCostModel,
    StepShape,
    host_pool_blocks,
    kv_pool_blocks,
)
from seawall.sim.hardware import GiB, get_gpu
from seawall.sim.metrics import RequestRecord, RunTotals, summarize
from seawall.sim.models import check_kv_cache_dtype, get_model, with_kv_cache_dtype
from seawall.sim.workloads import MOONCAKE_BLOCK, RequestSpec
from services.common.errors import InvalidArgument, SeawallError
from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken, StepPlan, StepResult
from services.scheduler.core import scheduler as core_scheduler
from services.scheduler.core.block_manager import BlockManager
from services.scheduler.core.request import Request, RequestStatus

SAMPLED = SampledToken(token_id=7)  # any id: requests run with ignore_eos and stop at max_tokens


class PolicyUnavailable(InvalidArgument):
    """The scheduler core in this checkout has no policy of that name (yet)."""


class SimulationStalled(SeawallError):
    """The core holds work but plans nothing and no request is due: a bug in a policy, or a request
    that can never fit. The message names what is stuck."""


def available_policies() -> tuple[str, ...]:
    return tuple(core_scheduler.POLICIES)


def is_chunked(policy: str) -> bool:
    """Policies that split prompts into chunks within a token budget (Sarathi-Serve's stall-free steps)."""
    return "sarathi" in policy


@dataclass(frozen=True)
class SimConfig:
    model: str = "Mistral-7B"
    gpu: str = "A100-80GB"
    tp: int = 1
    policy: str = "sarathi"
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 128  # as Sarathi-Serve's and vLLM's runs in papers.md §1.4
    # Prompt-token budget per step (tau) of chunked policies; default 512 (Sarathi-Serve's strict setting).
    chunk_size: int | None = None
    # Tokens per step; default tau for chunked policies, else max(max_model_len, 2048) (whole prompts).
    max_num_batched_tokens: int | None = None
    # "swap" or "recompute"; default swap for policies named fastserve*, else recompute (vLLM, Sarathi).
    preemption_mode: str | None = None
    swap_space_gib: float = 4.0  # pinned host memory per GPU for swapped-out KV (vLLM's default)
    # Whether KV swaps overlap compute (FastServe) or stall the step (vLLM); default: overlap for fastserve*.
    swap_overlap: bool | None = None
    enable_prefix_caching: bool = False
    # The KV pool's element type (the workers' --kv-cache-dtype): "auto" = 16-bit, "fp8" one byte an element: twice
    # the blocks, half the bytes a decode's attention reads and a swap moves.
    kv_cache_dtype: str = "auto"
    num_gpu_blocks: int | None = None  # override the pool computed from GPU memory
    cost_model: str = "roofline"  # or "measured"
    measured_file: str | None = None
    record_requests: bool = False
    # FastServe's MLFQ constants: "paper" (the core's defaults: profiled quantum, 3 s starvation) or "code"
    # (LLMServe/FastServe's released constants: 10 ms quantum, 3 s starvation every 1000 steps), or an
    # ``MLFQConfig`` of one's own.
    mlfq: str | core_scheduler.MLFQConfig = "paper"
    # The core's step-time model (skip-join levels, quanta); None: fitted to the cost model. A live
    # scheduler uses the core's default, so a simulation of one passes that.
    step_time: core_scheduler.StepTimeModel | None = None
    max_sim_time: float | None = None  # stop (and report what finished) at this simulated time

    def __post_init__(self) -> None:
        # A block size of 0 divided by zero sizing the pool, a negative one read as "the model does not fit", and
        # a negative pool failed in the block manager with a traceback.
        if self.block_size < 1:
            raise InvalidArgument(f"--block-size must be >= 1, got {self.block_size}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 0:
            raise InvalidArgument(f"--num-gpu-blocks must be >= 1 (0: sized from GPU memory), got {self.num_gpu_blocks}")
        check_kv_cache_dtype(self.kv_cache_dtype)

    def resolved(self, max_model_len: int) -> dict:
        """Scheduler settings after policy defaults."""
        chunked = is_chunked(self.policy)
        chunk = self.chunk_size or (512 if chunked else None)
        budget = self.max_num_batched_tokens or (chunk if chunked else max(max_model_len, 2048))
        mode = self.preemption_mode or ("swap" if self.policy.startswith("fastserve") else "recompute")
        overlap = self.policy.startswith("fastserve") if self.swap_overlap is None else self.swap_overlap
        return {"chunk_size": chunk, "max_num_batched_tokens": budget, "preemption_mode": mode,
                "swap_overlap": overlap}


def build_cost_model(cfg: SimConfig):
    if cfg.cost_model == "measured":
        if not cfg.measured_file:
            raise InvalidArgument("--cost-model measured needs a step-time file: --cost-model measured FILE")
        return MeasuredCostModel.from_file(cfg.measured_file)
    if cfg.cost_model != "roofline":
        raise InvalidArgument(f"--cost-model must be roofline or measured, got {cfg.cost_model!r}")
    return RooflineCostModel(sim_model(cfg), get_gpu(cfg.gpu), cfg.tp, block_size=cfg.block_size)


def sim_model(cfg: SimConfig):
    """The model's shape with its KV as ``cfg`` stores it."""
    return with_kv_cache_dtype(get_model(cfg.model), cfg.kv_cache_dtype)


def fit_step_time(cost):
    """The core's linear step-time model (``base + per_token · tokens + per_seq · seqs``, used by FastServe's
    skip-join levels and quanta) fitted to the simulated hardware: a one-token step, the slope of prefill
    up to 2048 tokens, and the extra cost per decode of a 32-sequence batch at 1K context."""
    base = cost.step_time(StepShape.of([(1, 0)]))
    per_token = max(0.0, (cost.step_time(StepShape.of([(2048, 0)])) - base) / 2047)
    decode = cost.step_time(StepShape.of(decodes=[1024] * 32))
    per_seq = max(0.0, (decode - base - 31 * per_token) / 31)
    return core_scheduler.StepTimeModel(base_s=base, per_token_s=per_token, per_seq_s=per_seq)


def _scheduler_config(cfg: SimConfig, settings: dict, max_model_len: int,
                      cost=None) -> core_scheduler.SchedulerConfig:
    if cfg.policy not in core_scheduler.POLICIES:
        raise PolicyUnavailable(f"policy {cfg.policy!r} is not available in this scheduler core; it has "
                                f"{', '.join(core_scheduler.POLICIES)}")
    wanted = {
        "max_num_batched_tokens": settings["max_num_batched_tokens"],
        "chunk_size": settings["chunk_size"],
        "max_num_seqs": cfg.max_num_seqs,
        "max_model_len": max_model_len,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "policy": cfg.policy,
        "preemption_mode": settings["preemption_mode"],
    }
    names = {f.name for f in dataclasses.fields(core_scheduler.SchedulerConfig)}
    if "step_time" in names and (cfg.step_time or cost) is not None:
        wanted["step_time"] = cfg.step_time or fit_step_time(cost)
    if isinstance(cfg.mlfq, core_scheduler.MLFQConfig):
        wanted["mlfq"] = cfg.mlfq
    elif cfg.mlfq not in ("paper", "code"):
        raise InvalidArgument(f"--mlfq must be paper or code, got {cfg.mlfq!r}")
    elif "mlfq" in names and cfg.mlfq == "code":
        wanted["mlfq"] = core_scheduler.MLFQConfig.released_code()
    try:
        return core_scheduler.SchedulerConfig(**{k: v for k, v in wanted.items() if k in names})
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from exc


class Simulation:
    """One run of a workload through one replica. ``run()`` returns the metrics dict."""

    def __init__(self, cfg: SimConfig, workload: list[RequestSpec], cost=None) -> None:
        if not workload:
            raise InvalidArgument("the workload is empty")
        self.cfg = cfg
        self.specs = sorted(workload, key=lambda s: s.arrival)
        self.cost = cost or build_cost_model(cfg)
        model = sim_model(cfg)
        max_len = max(s.prompt_len + s.output_len for s in self.specs) + 1
        self.settings = cfg.resolved(max_len)
        budget = self.settings["max_num_batched_tokens"]
        self.num_gpu_blocks = cfg.num_gpu_blocks or kv_pool_blocks(
            model, get_gpu(cfg.gpu), cfg.tp, cfg.block_size, cfg.gpu_memory_utilization, budget)
        self.num_host_blocks = host_pool_blocks(model, cfg.tp, cfg.swap_space_gib * GiB, cfg.block_size)
        self.core = core_scheduler.Scheduler(
            _scheduler_config(cfg, self.settings, max_len, self.cost),
            BlockManager(self.num_gpu_blocks, cfg.block_size),
            BlockManager(self.num_host_blocks, cfg.block_size) if self.num_host_blocks > 0 else None,
        )
        self._pass_now = "now" in inspect.signature(self.core.schedule).parameters
        self.records: dict[str, RequestRecord] = {}
        self.rejected: list[str] = []
        self.totals = RunTotals()
        self.now = 0.0
        self._seen_preemptions = 0

    # --- arrivals ---

    def _tokens(self, idx: int, spec: RequestSpec) -> list[int]:
        """Prompt token ids. Only their equality matters (prefix caching): Mooncake's block ids become
        512-token runs of that id; other prompts are unique to their request."""
        if spec.prefix_ids and self.cfg.enable_prefix_caching:
            toks: list[int] = []
            for hid in spec.prefix_ids:
                toks.extend([hid] * MOONCAKE_BLOCK)
            toks = toks[: spec.prompt_len]
            return toks + [-(idx + 1)] * (spec.prompt_len - len(toks))
        return [-(idx + 1)] * spec.prompt_len

    def _add(self, idx: int, spec: RequestSpec) -> None:
        rid = f"r{idx}"
        blocks_needed = -(-(spec.prompt_len + spec.output_len) // self.cfg.block_size)
        if blocks_needed > self.num_gpu_blocks:
            self.rejected.append(rid)  # could never fit: a server refuses it up front
            return
        params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True, temperature=0.0)
        self.records[rid] = RequestRecord(spec.arrival, spec.prompt_len, spec.output_len,
                                          queued_since=spec.arrival, priority=spec.priority)
        self.core.add(Request(rid, self._tokens(idx, spec), params, spec.arrival, priority=spec.priority))

    # --- the loop ---

    def run(self) -> dict:
        started = time.perf_counter()
        specs, core = self.specs, self.core
        i, n = 0, len(specs)
        idle_plans = 0
        while i < n or core.has_work:
            if self.cfg.max_sim_time is not None and self.now >= self.cfg.max_sim_time:
                break
            while i < n and specs[i].arrival <= self.now:
                self._add(i, specs[i])
                i += 1
            if not core.has_work:
                if i < n:
                    self.now = max(self.now, specs[i].arrival)
                continue
            plan = core.schedule(now=self.now) if self._pass_now else core.schedule()
            if self._step(plan):
                idle_plans = 0
                continue
            idle_plans += 1
            if i < n:
                self.now = max(self.now, specs[i].arrival)  # nothing runnable until someone arrives
            elif idle_plans > 3:
                raise SimulationStalled(f"policy {self.cfg.policy!r} planned nothing for {idle_plans} steps with "
                                        f"{len(core.waiting)} waiting, {len(core.running)} running and "
                                        f"{len(core.swapped)} swapped requests and no arrivals left "
                                        f"(KV pool: {self.num_gpu_blocks} blocks)")
        metrics = summarize(self.records, self.totals, core.preemptions)
        metrics.update(self._describe(), rejected=len(self.rejected), sim_wall_s=time.perf_counter() - started)
        if self.cfg.record_requests:
            metrics["requests"] = [rec.as_dict(rid) for rid, rec in self.records.items()]
        return metrics

    def _step(self, plan: StepPlan) -> bool:
        """Times and applies one plan; False when it did nothing (no tokens, no swaps)."""
        core, records, now = self.core, self.records, self.now
        chunks_q = chunks_pairs = chunks_kv = 0
        decodes = decode_ctx = 0
        sampled: dict[str, list[SampledToken]] = {}  # one pass per step: the core here never plans multi-step
        for rid, q in plan.num_scheduled_tokens.items():
            req = core.requests[rid]
            c = req.num_computed_tokens
            rec = records[rid]
            if rec.queued_since is not None:
                rec.queueing += now - rec.queued_since
                rec.queued_since = None
            if rec.first_scheduled is None:
                rec.first_scheduled = now
            if c + q == req.num_tokens:
                sampled[rid] = [SAMPLED]
            if q == 1 and c >= len(req.prompt_token_ids):
                decodes += 1
                decode_ctx += c
            else:
                chunks_q += q
                chunks_pairs += q * (c + (q + 1) / 2)
                chunks_kv += c + q
        num_seqs = len(plan.num_scheduled_tokens)
        swap_blocks = len(plan.swap_out) + len(plan.swap_in)
        if num_seqs == 0 and swap_blocks == 0:
            self._note_preemptions()
            return False
        shape = StepShape(chunks_q + decodes, num_seqs, len(sampled), chunks_q, chunks_pairs, chunks_kv,
                          decodes, decode_ctx)
        compute = self.cost.step_time(shape)
        swap = self.cost.swap_time(swap_blocks)
        dt = max(compute, swap) if self.settings["swap_overlap"] else compute + swap
        running = len(core.running)
        self.now = now + dt
        events = core.on_result(plan, StepResult(plan.step_id, sampled=sampled))
        self._account(dt, swap, dt - compute, swap_blocks, running)
        t = self.now
        tbt, tbt_end = self.totals.tbt, self.totals.tbt_end
        for ev in events:
            rec = records[ev.request_id]
            if rec.first_token is None:
                rec.first_token = t
            else:
                gap = t - rec.last_token
                tbt.append(gap)
                tbt_end.append(t)
                if gap > rec.max_gap:
                    rec.max_gap = gap
            rec.last_token = t
            rec.num_output += 1
            if ev.finish_reason is not None:
                rec.finish = t
        self._note_preemptions()
        return True

    def _account(self, dt: float, swap: float, exposed: float, swap_blocks: int, running: int) -> None:
        """Step totals; ``running``: sequences holding KV during the step (counted before any finished)."""
        core, tot = self.core, self.totals
        tot.num_steps += 1
        tot.busy_s += dt
        tot.swap_s += swap
        tot.swap_exposed_s += exposed
        tot.swapped_blocks += swap_blocks
        tot.max_running = max(tot.max_running, running)
        tot.running_time += running * dt
        if core.waiting:
            tot.saturated_running_time += running * dt
            tot.saturated_s += dt
        # Blocks still held after the step against the tokens they hold (finished requests already freed).
        used = core.blocks.num_blocks - core.blocks.num_free
        tot.kv_used_slot_time += used * core.blocks.block_size * dt
        tot.kv_token_time += sum(r.num_computed_tokens for r in core.running) * dt

    def _note_preemptions(self) -> None:
        """Starts the queueing clock of requests that lost their place (recompute or swap preemption)."""
        total = sum(self.core.preemptions.values())
        if total == self._seen_preemptions:
            return
        self._seen_preemptions = total
        for req in [*self.core.waiting, *self.core.swapped]:
            rec = self.records.get(req.request_id)
            if rec is not None and rec.queued_since is None and req.status is not RequestStatus.RUNNING:
                rec.queued_since = self.now
                rec.num_preemptions += 1

    def _describe(self) -> dict:
        cfg = self.cfg
        return {"model": cfg.model, "gpu": cfg.gpu, "tp": cfg.tp, "policy": cfg.policy,
                "cost_model": cfg.cost_model, "num_gpu_blocks": self.num_gpu_blocks,
                "num_host_blocks": self.num_host_blocks, "kv_capacity_tokens": self.num_gpu_blocks * cfg.block_size,
                **{k: v for k, v in self.settings.items()}}


def simulate(cfg: SimConfig, workload: list[RequestSpec], cost=None) -> dict:
    return Simulation(cfg, workload, cost).run()
