"""Step-time models: how long one forward pass over a mixed batch takes, and how long a KV swap takes.

Two models share one interface (``step_time(StepShape)``, ``swap_time(num_blocks)``):

* ``RooflineCostModel`` — per layer, each matrix multiply and each attention kernel costs
  ``max(FLOPs / (peak · efficiency), bytes / (bandwidth · efficiency))``; tensor parallelism divides
  FLOPs, weights and KV heads by ``tp`` and adds two all-reduces per layer; a step also pays fixed
  overheads (launches, sampling, scheduling). The efficiency factors (``Efficiency``) are calibrated
  against the measurements listed in ``seawall/sim/calibration.py`` (docs/sim.md has the table).
* ``MeasuredCostModel`` — step times measured on a real engine (JSON, format below), interpolated.
* ``LinearCostModel`` — a fixed cost per step plus a cost per token and per sequence: the shape of a tiny
  model on a CPU behind the live mesh, where a step's fixed cost (gRPC, Python) dominates.

A step is summarised by a ``StepShape``: for prompt chunks of ``q`` new tokens after ``c`` cached ones,
attention does ``q·(c + (q+1)/2)`` query-key pairs (causal within the chunk) and reads ``c + q`` KV rows;
a decode reads its ``c`` KV rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seawall.sim.hardware import GPU
from seawall.sim.models import DTYPE_BYTES, ModelSpec
from services.common.errors import InvalidArgument, NotFound


@dataclass(frozen=True)
class StepShape:
    num_tokens: int = 0  # every token run this step (prompt chunks + decodes)
    num_seqs: int = 0
    num_sampled: int = 0  # rows whose logits are computed (last chunk of a prompt, every decode)
    prefill_tokens: int = 0
    prefill_pairs: float = 0.0  # sum over chunks of q * (c + (q + 1) / 2)
    prefill_kv_tokens: int = 0  # sum over chunks of c + q
    num_decodes: int = 0
    decode_context: int = 0  # sum over decodes of c

    @classmethod
    def of(cls, chunks: Iterable[tuple[int, int]] = (), decodes: Iterable[int] = (),
           num_sampled: int | None = None) -> StepShape:
        """``chunks``: (new tokens q, cached tokens c) per prompt chunk; ``decodes``: context c per decode.
        ``num_sampled`` defaults to every decode plus every chunk (as if each chunk ended its prompt)."""
        chunks, decodes = list(chunks), list(decodes)
        q_sum = sum(q for q, _ in chunks)
        return cls(
            num_tokens=q_sum + len(decodes),
            num_seqs=len(chunks) + len(decodes),
            num_sampled=len(chunks) + len(decodes) if num_sampled is None else num_sampled,
            prefill_tokens=q_sum,
            prefill_pairs=sum(q * (c + (q + 1) / 2) for q, c in chunks),
            prefill_kv_tokens=sum(q + c for q, c in chunks),
            num_decodes=len(decodes),
            decode_context=sum(decodes),
        )

    @property
    def context(self) -> int:
        """KV rows attention reads this step (the ``context`` column of a measured table)."""
        return self.prefill_kv_tokens + self.decode_context


@dataclass(frozen=True)
class Efficiency:
    """How close kernels get to the hardware's peaks, and the fixed costs of a step (calibrated)."""

    # GEMM fraction of peak FLOP/s: matmul_max * T / (T + matmul_half_tokens) for T tokens in the step.
    matmul_max: float = 0.68
    matmul_half_tokens: float = 96.0
    # Prefill attention (FlashAttention-style) fraction of peak FLOP/s.
    attention: float = 0.25
    # Fraction of memory bandwidth reached reading weights and KV.
    memory: float = 0.85
    # Per step: scheduling, input preparation, sampling, launches not hidden by CUDA graphs.
    step_overhead_s: float = 2e-3
    # Per layer per step (kernel launches, norms, rotary, activation functions).
    layer_overhead_s: float = 30e-6
    # Per sequence per step (input preparation and sampling of one row).
    seq_overhead_s: float = 5e-6
    # Fixed cost per swapped KV block (one DMA descriptor per block across all layers: block-major layout).
    swap_block_overhead_s: float = 2e-6


DEFAULT_EFFICIENCY = Efficiency()


class RooflineCostModel:
    """Roofline step times for ``model`` on ``tp`` GPUs of one kind (tensor parallel, one replica)."""

    def __init__(self, model: ModelSpec, gpu: GPU, tp: int = 1, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                 block_size: int = 16) -> None:
        if tp < 1 or model.num_heads % tp or (model.num_kv_heads % tp and tp % model.num_kv_heads):
            raise InvalidArgument(f"--tp {tp} does not divide {model.name}'s {model.num_heads} attention heads "
                                  f"and {model.num_kv_heads} KV heads")
        self.model, self.gpu, self.tp, self.eff, self.block_size = model, gpu, tp, efficiency, block_size
        m = model
        q_width = m.num_heads * m.head_dim // tp
        kv_width = 2 * m.num_kv_heads * m.head_dim // tp
        mlp_width = (2 if m.gated_mlp else 1) * m.intermediate_size // tp
        # One layer's matrix multiplies as (input width, output width) per GPU; a mixture of experts adds its
        # router here (replicated) and its experts in _experts_time.
        self._gemms = [
            (m.hidden_size, q_width + kv_width),  # fused q, k, v
            (q_width, m.hidden_size),  # o
        ]
        if m.intermediate_size:
            self._gemms += [
                (m.hidden_size, mlp_width),  # gate and up (fused), or OPT's fc1
                (m.intermediate_size // tp, m.hidden_size),  # down, or fc2
            ]
        if m.num_experts:
            self._gemms.append((m.hidden_size, m.num_experts))
        self._q_width = q_width
        # K and V rows of one token in one layer on one GPU (KV heads shard with tp; replicated past them).
        self._kv_row_bytes = 2 * max(1, m.num_kv_heads // tp) * m.head_dim * m.kv_dtype_bytes
        self._lm_head = (m.hidden_size, m.vocab_size // tp)
        self.block_bytes_per_gpu = block_size * m.num_layers * self._kv_row_bytes

    def _gemm_time(self, tokens: int, k: int, n: int) -> float:
        if tokens <= 0:
            return 0.0
        e, g = self.eff, self.gpu
        flops = 2.0 * tokens * k * n
        nbytes = (k * n + tokens * (k + n)) * DTYPE_BYTES
        eff = e.matmul_max * tokens / (tokens + e.matmul_half_tokens)
        return max(flops / (g.peak_flops * eff), nbytes / (g.hbm_bandwidth * e.memory))

    def _experts_time(self, tokens: int) -> float:
        """One layer's routed experts (each sharded ``tp`` ways by width) for ``tokens`` tokens. Routing is taken
        as uniform: the step reads the weights of the E * (1 - (1 - k/E)^T) experts it touches in expectation,
        and each GEMM runs on its share of the T * k rows, which sets its efficiency as a dense GEMM's of that
        many tokens: a decode batch is bound by the experts it reads, a long prompt by its FLOPs."""
        m, e, g = self.model, self.eff, self.gpu
        if not m.num_experts or tokens <= 0:
            return 0.0
        touched = m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** tokens)
        rows = tokens * m.experts_per_token
        width = m.expert_size // self.tp
        flops = 2.0 * rows * 3 * m.hidden_size * width
        nbytes = (touched * 3 * m.hidden_size * width + rows * 2 * (m.hidden_size + width)) * DTYPE_BYTES
        per_expert = rows / touched
        eff = e.matmul_max * per_expert / (per_expert + e.matmul_half_tokens)
        return max(flops / (g.peak_flops * eff), nbytes / (g.hbm_bandwidth * e.memory))

    def _attention_time(self, s: StepShape) -> float:
        """One layer's attention over the step's prompt chunks and decodes."""
        e, g = self.eff, self.gpu
        t = 0.0
        if s.prefill_tokens:
            flops = 4.0 * self._q_width * s.prefill_pairs
            nbytes = self._kv_row_bytes * s.prefill_kv_tokens + 2 * self._q_width * DTYPE_BYTES * s.prefill_tokens
            t += max(flops / (g.peak_flops * e.attention), nbytes / (g.hbm_bandwidth * e.memory))
        if s.num_decodes:
            flops = 4.0 * self._q_width * s.decode_context
            nbytes = self._kv_row_bytes * s.decode_context
            t += max(flops / (g.peak_flops * e.attention), nbytes / (g.hbm_bandwidth * e.memory))
        return t

    def _allreduce_time(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        nbytes = tokens * self.model.hidden_size * DTYPE_BYTES
        return self.gpu.allreduce_latency_s + 2 * (self.tp - 1) / self.tp * nbytes / self.gpu.link_bandwidth

    def step_time(self, s: StepShape) -> float:
        if s.num_tokens <= 0:
            return 0.0
        e = self.eff
        layer = sum(self._gemm_time(s.num_tokens, k, n) for k, n in self._gemms) + self._experts_time(s.num_tokens)
        layer += self._attention_time(s) + 2 * self._allreduce_time(s.num_tokens) + e.layer_overhead_s
        lm_head = self._gemm_time(s.num_sampled, *self._lm_head)
        return (self.model.num_layers * layer + lm_head + e.step_overhead_s + e.seq_overhead_s * s.num_seqs)

    def swap_time(self, num_blocks: int) -> float:
        """Copying ``num_blocks`` KV blocks between host and device (each TP rank over its own PCIe link)."""
        if num_blocks <= 0:
            return 0.0
        return num_blocks * (self.block_bytes_per_gpu / self.gpu.pcie_bandwidth + self.eff.swap_block_overhead_s)


def kv_pool_blocks(model: ModelSpec, gpu: GPU, tp: int = 1, block_size: int = 16,
                   gpu_memory_utilization: float = 0.9, max_batched_tokens: int = 2048) -> int:
    """Device KV blocks per replica: GPU memory × utilization − weights − peak activations, in blocks.

    As vLLM sizes its pool (``gpu_memory_utilization`` 0.9, activations profiled on a max-size batch).
    Every TP rank holds ``1/tp`` of each block, so the count is per replica.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidArgument(f"gpu memory utilization must be in (0, 1], got {gpu_memory_utilization}")
    free = (gpu.memory_bytes * gpu_memory_utilization - model.weight_bytes / tp
            - model.activation_bytes(max(max_batched_tokens, 2048), tp))
    block_bytes = block_size * model.kv_bytes_per_token / tp
    blocks = int(free // block_bytes)
    if blocks < 1:
        raise InvalidArgument(
            f"{model.name} does not fit on {tp} x {gpu.name}: {model.weight_bytes / tp / 1e9:.1f} GB of weights "
            f"per GPU leaves no room for KV; raise --tp or pick a larger GPU")
    return blocks


def host_pool_blocks(model: ModelSpec, tp: int, swap_bytes_per_gpu: float, block_size: int = 16) -> int:
    """Host (swap) KV blocks per replica given ``swap_bytes_per_gpu`` of pinned host memory per TP rank."""
    return int(swap_bytes_per_gpu // (block_size * model.kv_bytes_per_token / tp))


# --- measured step times -------------------------------------------------------------------------------

MEASURED_FORMAT = "seawall-step-times/v1"


class MeasuredCostModel:
    """Step times measured on a real engine, interpolated.

    File format (JSON)::

        {"format": "seawall-step-times/v1",
         "model": "...", "device": "...",            # free text, for the reader
         "block_bytes": 2097152,                     # optional: KV bytes of one block per GPU (for swaps)
         "swap_bytes_per_s": 2.5e10,                 # optional: host <-> device copy bandwidth
         "samples": [{"num_tokens": 512, "num_seqs": 1, "context": 512, "seconds": 0.041}, ...]}

    ``num_tokens`` counts every token run in the step, ``num_seqs`` the sequences, ``context`` the KV rows
    attention read (the sum over sequences of cached + new tokens). The model is
    ``t = f(num_tokens) + a · num_seqs + b · context`` with ``f`` piecewise linear between the distinct
    ``num_tokens`` of the samples (extrapolated along the last segment), fitted by least squares. With a
    single ``num_tokens`` value, ``f`` is a constant.
    """

    def __init__(self, samples: list[dict], block_bytes: float | None = None,
                 swap_bytes_per_s: float | None = None, source: str = "") -> None:
        if not samples:
            raise InvalidArgument(f"{source or 'step-time table'}: no samples")
        try:
            rows = [(int(s["num_tokens"]), int(s["num_seqs"]), int(s["context"]), float(s["seconds"]))
                    for s in samples]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"{source or 'step-time table'}: each sample needs num_tokens, num_seqs, "
                                  f"context and seconds ({exc})") from exc
        self.knots = np.array(sorted({r[0] for r in rows}), dtype=float)
        x = np.array([self._features(t, s, c) for t, s, c, _ in rows])
        y = np.array([r[3] for r in rows])
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        # Seconds per extra sequence or context row cannot be negative: drop such a term and refit.
        for col in (len(self.knots), len(self.knots) + 1):
            if coef[col] < 0:
                x[:, col] = 0.0
                coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        self.coef = coef
        self.min_seconds = float(y.min())
        self.block_bytes, self.swap_bytes_per_s = block_bytes, swap_bytes_per_s

    @classmethod
    def from_file(cls, path: str | Path) -> MeasuredCostModel:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise NotFound(f"step-time file {str(path)!r} does not exist") from exc
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"{path}: not JSON ({exc})") from exc
        if data.get("format") != MEASURED_FORMAT:
            raise InvalidArgument(f"{path}: format must be {MEASURED_FORMAT!r}, got {data.get('format')!r}")
        return cls(data.get("samples", []), data.get("block_bytes"), data.get("swap_bytes_per_s"), str(path))

    def _features(self, tokens: float, seqs: float, context: float) -> list[float]:
        """Hat functions over the knots (linear extrapolation past the ends), then seqs and context."""
        k = self.knots
        hats = [0.0] * len(k)
        if len(k) == 1:
            hats[0] = 1.0
        else:
            i = int(np.clip(np.searchsorted(k, tokens) - 1, 0, len(k) - 2))
            w = (tokens - k[i]) / (k[i + 1] - k[i])
            hats[i], hats[i + 1] = 1.0 - w, w
        return [*hats, float(seqs), float(context)]

    def step_time(self, s: StepShape) -> float:
        if s.num_tokens <= 0:
            return 0.0
        t = float(np.dot(self._features(s.num_tokens, s.num_seqs, s.context), self.coef))
        return max(t, self.min_seconds * 0.5)

    def swap_time(self, num_blocks: int) -> float:
        if num_blocks <= 0:
            return 0.0
        if not (self.block_bytes and self.swap_bytes_per_s):
            raise InvalidArgument("the step-time file has no block_bytes/swap_bytes_per_s, so swaps cannot be "
                                  "timed; add them or run with --preemption-mode recompute")
        return num_blocks * self.block_bytes / self.swap_bytes_per_s


@dataclass(frozen=True)
class LinearCostModel:
    base_s: float
    per_token_s: float
    per_seq_s: float = 0.0
    swap_per_block_s: float = 0.0

    def step_time(self, s: StepShape) -> float:
        if s.num_tokens <= 0:
            return 0.0
        return self.base_s + self.per_token_s * s.num_tokens + self.per_seq_s * s.num_seqs

    def swap_time(self, num_blocks: int) -> float:
        return self.swap_per_block_s * max(0, num_blocks)


def prefill_time(cost, prompt_len: int, chunk: int | None = None) -> float:
    """Time to prefill one prompt alone, whole or in chunks of ``chunk`` tokens (a helper for anchors)."""
    step = chunk or prompt_len
    total, done = 0.0, 0
    while done < prompt_len:
        q = min(step, prompt_len - done)
        total += cost.step_time(StepShape.of([(q, done)], num_sampled=1))
        done += q
    return total
