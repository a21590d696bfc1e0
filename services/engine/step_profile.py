"""A worker's own step times, measured at start-up and fitted to the linear model the scheduler core assumes
(services/scheduler/core/step_time.py): ``t = base + per_token * tokens + per_seq * sequences``.

The core's default model stands for a 7B model on an A100; on any other hardware its quanta (FastServe) and
its token budget for a TBT target (Sarathi-Serve's tau) would be off by the ratio of the step times. So each
worker runs a few real steps of fresh sequences before it registers (prompt chunks, decode batches, a hybrid
step; ~0.1 s on the built-in model on a CPU) and reports the fit in its ``WorkerInfo``. ``Planner`` builds
the one-step plans, also for ``bench/step_times.py``'s full grid.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from services.common.sampling_params import SamplingParams
from services.common.step import NewSequence, StepPlan
from services.engine.pooling import EMBEDDING_PARAMS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from services.engine.runner import ModelRunner

GREEDY = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
# (prompt chunk tokens, decodes) per profiled step; decodes run at this many tokens of context.
PROFILE_SHAPES = ((16, 0), (64, 0), (256, 0), (0, 1), (0, 8), (0, 32), (64, 16))
PROFILE_CONTEXT = 64


@dataclass(frozen=True)
class StepTimeFit:
    """Seconds per step, per token and per sequence, all >= 0."""

    base_s: float
    per_token_s: float
    per_seq_s: float


class Planner:
    """Builds one-step plans of fresh sequences over disjoint block ranges of the pool."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.bs = runner.config.block_size
        self.vocab = runner.checkpoint.config.vocab_size
        self.rng = random.Random(0)
        self.ids = itertools.count()

    def blocks_needed(self, chunks: Sequence[tuple[int, int]], decodes: Sequence[int]) -> int:
        return sum(-(-(new + cached) // self.bs) for new, cached in [*chunks, *((1, c) for c in decodes)])

    def plan(self, chunks: Sequence[tuple[int, int]], decodes: Sequence[int]) -> StepPlan:
        """``chunks``: (new tokens, cached tokens) per prompt chunk; ``decodes``: context per decode."""
        plan = StepPlan(next(self.ids))
        next_block = 0
        for new, cached in [*chunks, *((1, c) for c in decodes)]:
            total = cached + new
            n_blocks = -(-total // self.bs)
            blocks = list(range(next_block, next_block + n_blocks))
            next_block += n_blocks
            assert next_block <= self.runner.kv.num_blocks, "step shape larger than the KV pool"
            sid = f"s{plan.step_id}-{len(plan.new)}"
            tokens = [self.rng.randrange(3, self.vocab) for _ in range(total)]
            # An embedding model (no output head) is timed on what it serves: pooled prompts.
            params = GREEDY if self.runner.model.lm_head is not None else EMBEDDING_PARAMS
            if cached and self.runner.states is not None:  # a recurrent model: a state for the cached tokens
                self.runner.states.stash(sid, cached, self.runner.states.blank())
            plan.new.append(NewSequence(sid, tokens, total, cached, blocks, params))
            plan.num_scheduled_tokens[sid] = new
        return plan

    def time(self, chunks: Sequence[tuple[int, int]], decodes: Sequence[int], repeats: int) -> float:
        """The fewest seconds of ``repeats`` runs of the step (other work on the machine only ever adds time);
        its sequences are dropped after each."""
        times = []
        for _ in range(repeats):
            plan = self.plan(chunks, decodes)
            t = time.perf_counter()
            self.runner.execute(plan)
            times.append(time.perf_counter() - t)
            self.runner.execute(StepPlan(next(self.ids), finished=list(plan.num_scheduled_tokens)))
        return min(times)


def profile_step_time(runner: ModelRunner, repeats: int = 3, attempts: int = 3) -> StepTimeFit:
    """Times ``PROFILE_SHAPES`` (those that fit the pool and the context) on ``runner`` and fits them. A fit
    with (next to) no cost per token is noise (a machine busy while the small steps ran; no model computes 256
    tokens as fast as 16): measured again, with twice the repeats, up to ``attempts`` times."""
    planner = Planner(runner)
    planner.time([(16, 0)], [], 1)  # warm-up: first-call costs are not a step's
    for attempt in range(attempts):
        samples = []
        for chunk, decodes in PROFILE_SHAPES:
            chunks, contexts = ([(chunk, 0)] if chunk else []), [PROFILE_CONTEXT] * decodes
            if max(chunk, PROFILE_CONTEXT + 1) > runner.max_model_len or \
                    planner.blocks_needed(chunks, contexts) > runner.kv.num_blocks:
                continue
            samples.append((chunk + decodes, len(chunks) + decodes,
                            planner.time(chunks, contexts, repeats << attempt)))
        fit = fit_step_time(samples)
        sizes = [tokens for tokens, _, _ in samples]
        # "No cost": the largest step's tokens add under 1% of a step (one size alone cannot tell).
        spread = max(sizes) - min(sizes)
        if not spread or fit.per_token_s * spread >= 0.01 * statistics.fmean(s for _, _, s in samples):
            break
    return fit


def fit_step_time(samples: Sequence[tuple[int, int, float]]) -> StepTimeFit:
    """Least squares of ``(tokens, sequences, seconds)`` samples on ``base + per_token * tokens + per_seq *
    sequences``, no coefficient below 0 (one that would be is left out and the rest refitted), and no more
    terms than samples."""
    if not samples:
        raise ValueError("no step samples to fit")
    names = ["base_s", "per_token_s", "per_seq_s"][: len(samples)]  # no more terms than samples
    columns = {"base_s": [1.0] * len(samples), "per_token_s": [float(t) for t, _, _ in samples],
               "per_seq_s": [float(s) for _, s, _ in samples]}
    y = torch.tensor([sec for _, _, sec in samples], dtype=torch.float64).unsqueeze(1)
    while True:
        x = torch.tensor([columns[n] for n in names], dtype=torch.float64).T
        coef = torch.linalg.lstsq(x, y, driver="gelsd").solution.squeeze(1).tolist()
        negative = [n for n, c in zip(names, coef, strict=True) if c < 0]
        if not negative or len(names) == 1:
            fitted = {n: max(c, 0.0) for n, c in zip(names, coef, strict=True)}
            return StepTimeFit(**{n: fitted.get(n, 0.0) for n in ("base_s", "per_token_s", "per_seq_s")})
        names.remove(min(negative, key=lambda n: coef[names.index(n)]))
