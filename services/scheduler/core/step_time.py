"""How long a step takes, as the scheduler core assumes it: a linear model in the step's tokens.

The core reads no clock. Where a policy needs durations (Sarathi's token budget from a TBT target,
FastServe's skip-join level and quanta, the logical clock when the caller passes no time), it asks this
model::

    t(step) = base_s + per_token_s * tokens + per_seq_s * sequences        (0 for an empty step)

The defaults stand for a 7B model on one A100-80GB (Mistral-7B in Sarathi-Serve, papers.md §1): an
interference-free decode step of ~20 ms (the strict P99 TBT SLO of 0.1 s is 5x it, §1.4) and 0.15 ms per
batched token, which puts Sarathi's budget at the strict SLO at the paper's tau = 512 (§1.3). Replace it
with a fit of your own model's step times (the simulator's cost model, or the engine's measurements).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class StepTimeModel:
    # Fixed cost of a step (weights read once, kernel launches), seconds.
    base_s: float = 0.02
    # Cost of each token in the step (prompt or decode), seconds.
    per_token_s: float = 1.5e-4
    # Cost of each sequence in the step (attention and sampling bookkeeping), seconds.
    per_seq_s: float = 0.0
    # GEMM tile along the token dimension: a budget derived from a time target is rounded down to a multiple
    # of it once it is at least one tile (a chunk of 257 ran 32% slower than 256 in Sarathi-Serve, §1.3).
    tile_tokens: int = 128

    def __post_init__(self) -> None:
        for name in ("base_s", "per_token_s", "per_seq_s"):
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"step_time.{name} must be a finite number >= 0, got {value}")
        if self.base_s + self.per_token_s + self.per_seq_s <= 0:
            raise ValueError("step_time: base_s, per_token_s and per_seq_s are all 0; a step must take time")
        if self.tile_tokens < 1:
            raise ValueError(f"step_time.tile_tokens must be >= 1, got {self.tile_tokens}")

    def predict(self, num_tokens: int, num_seqs: int = 1) -> float:
        """Seconds for a step of ``num_tokens`` tokens over ``num_seqs`` sequences (0 for an empty step)."""
        if num_tokens <= 0:
            return 0.0
        return self.base_s + self.per_token_s * num_tokens + self.per_seq_s * num_seqs

    def token_budget(self, target_s: float) -> int | None:
        """The largest token count whose one-sequence step takes at most ``target_s`` (Sarathi-Serve's
        tau = max{n : T(n) <= TBT}), rounded down to whole tiles; None when any count fits
        (``per_token_s`` is 0). Raises ValueError when not even one token fits."""
        spare = target_s - self.base_s - self.per_seq_s
        if self.per_token_s == 0:
            if spare < 0:
                raise ValueError(f"a one-token step takes {self.predict(1):.4g} s, more than {target_s} s")
            return None
        n = math.floor(spare / self.per_token_s + 1e-9)
        if n < 1:
            raise ValueError(f"a one-token step takes {self.predict(1):.4g} s, more than the target {target_s} s: "
                             "raise the target or lower step_time.base_s")
        return n - n % self.tile_tokens if n >= self.tile_tokens else n


@dataclass
class StepTimeCalibration:
    """Corrects a model's fixed cost from the durations the caller's clock measured for its plans.

    A worker's profile (services/engine/step_profile.py) times its steps alone; on the scheduler's clock a
    step also carries the mesh's share (the plan's and the result's trips, the scheduler's own work), which
    FastServe's quanta are charged in and a TBT target is met in. Every ``window`` steps the median of
    (measured - modeled) is added to ``base_s``: the median ignores the odd step that took an idle wait, and
    the correction converges where a window's median is 0. Durations over ``outlier_x`` times the model are an
    idle gap, not a step, and are left out.
    """

    window: int = 32
    outlier_x: float = 4.0
    residuals: list[float] = field(default_factory=list)

    def observe(self, model: StepTimeModel, predicted: float, elapsed: float) -> StepTimeModel | None:
        """The corrected model when this step completes a window, else None."""
        if predicted <= 0 or elapsed > self.outlier_x * predicted + 0.01:
            return None
        self.residuals.append(elapsed - predicted)
        if len(self.residuals) < self.window:
            return None
        offset = statistics.median(self.residuals)
        self.residuals.clear()
        base = max(model.base_s + offset, 0.0)
        if base + model.per_token_s + model.per_seq_s <= 0:
            return None
        return replace(model, base_s=base)
