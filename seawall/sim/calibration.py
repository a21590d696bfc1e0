"""The measurements the roofline cost model is calibrated against, and how close it gets.

Each anchor is a published measurement (papers.md §1.6, §3.3, §6 and the CSVs of microsoft/sarathi-serve's
``osdi-experiments``) and a function computing our figure for the same setup. ``tolerance`` is the relative
error the tests accept; ``None`` marks a measurement we knowingly do not match (the note says why).
``seawall sim calibration`` prints the table; docs/sim.md explains the choices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from seawall.sim.cost_model import RooflineCostModel, StepShape, kv_pool_blocks, prefill_time
from seawall.sim.hardware import get_gpu
from seawall.sim.models import get_model

SARATHI_REPO = "microsoft/sarathi-serve osdi-experiments"


@dataclass(frozen=True)
class Anchor:
    id: str
    source: str
    measured: float
    unit: str
    ours: Callable[[], float]
    tolerance: float | None  # accepted relative error; None: a known mismatch, explained in ``note``
    note: str = ""


def _yi() -> RooflineCostModel:
    return RooflineCostModel(get_model("Yi-34B"), get_gpu("A100-80GB"), tp=2)


def _prefill(n: int) -> Callable[[], float]:
    return lambda: prefill_time(_yi(), n)


def _chunking_overhead(n: int, chunk: int) -> Callable[[], float]:
    return lambda: prefill_time(_yi(), n, chunk) / prefill_time(_yi(), n)


def _decode(model: str, gpu: str, tp: int, batch: int, context: int) -> Callable[[], float]:
    return lambda: RooflineCostModel(get_model(model), get_gpu(gpu), tp).step_time(
        StepShape.of(decodes=[context] * batch))


def _hybrid() -> float:
    # Table 2's hybrid batch: one 1021-token chunk of a fresh prompt plus three decodes of ~1K context.
    return _yi().step_time(StepShape.of([(1021, 0)], [1030] * 3))


def _kv_slots_opt13b() -> float:
    return kv_pool_blocks(get_model("OPT-13B"), get_gpu("A100-40GB")) * 16


ANCHORS: list[Anchor] = [
    *(Anchor(f"yi34b-tp2-prefill-{n}", f"{SARATHI_REPO}/figure-2/prefill.csv", s, "s", _prefill(n), 0.2,
             "prefill-only batch of one prompt, Yi-34B TP2 on A100-80GB PCIe")
      for n, s in ((512, 0.1056), (1024, 0.2143), (2048, 0.3660), (4096, 0.7576), (8192, 1.8633),
                   (16384, 4.4075))),
    Anchor("yi34b-tp2-prefill-1024-table2", f"{SARATHI_REPO}/table-2/results.csv", 0.2172, "s",
           _prefill(1024), 0.2, "papers.md §1.6: 1024-token prefill = 217.2 ms"),
    Anchor("yi34b-tp2-hybrid-1021+3", f"{SARATHI_REPO}/table-2/results.csv", 0.2176, "s", _hybrid, 0.2,
           "papers.md §1.6: hybrid 1021 prefill + 3 decode = 217.6 ms"),
    Anchor("yi34b-tp2-chunking-2047@512", f"{SARATHI_REPO}/figure-9/chunking-overhead.csv", 1.152, "x",
           _chunking_overhead(2047, 512), 0.1, "prefill time in 512-token chunks / unchunked"),
    Anchor("yi34b-tp2-chunking-4095@512", f"{SARATHI_REPO}/figure-9/chunking-overhead.csv", 1.189, "x",
           _chunking_overhead(4095, 512), 0.1, "papers.md §1.3: 1.19x"),
    Anchor("yi34b-tp2-chunking-4095@2048", f"{SARATHI_REPO}/figure-9/chunking-overhead.csv", 1.024, "x",
           _chunking_overhead(4095, 2048), 0.1, "papers.md §1.3: 1.02x"),
    Anchor("mistral7b-decode-b32-4k", "Sarathi-Serve Table 3 (strict TBT SLO 0.1 s = 5x this)", 0.020, "s",
           _decode("Mistral-7B", "A100-80GB", 1, 32, 4096), 0.25,
           "interference-free decode iteration, batch 32, 4K prefix"),
    Anchor("yi34b-tp2-decode-b32-4k", "Sarathi-Serve Table 3 (strict TBT SLO 0.2 s = 5x this)", 0.040, "s",
           _decode("Yi-34B", "A100-80GB", 2, 32, 4096), 0.25,
           "interference-free decode iteration, batch 32, 4K prefix"),
    Anchor("opt13b-a100-40gb-kv-slots", "vLLM SOSP'23 §6 (papers.md §3.3)", 15_700, "tokens", _kv_slots_opt13b,
           0.05, "KV token slots: 40 GB x 0.9 - weights - activations"),
    Anchor("yi34b-tp2-decode-b4-table2", f"{SARATHI_REPO}/table-2/results.csv", 0.0681, "s",
           _decode("Yi-34B", "A100-80GB", 2, 4, 1030), None,
           "not matched: the same CSV row attributes only 28.5 ms to linear + attention; the other ~40 ms is "
           "the prototype's per-step CPU/communication overhead in that experiment, which the SLOs of Table 3 "
           "(decode b32 ~40 ms) show the capacity runs did not pay"),
    Anchor("yi34b-tp2-decode-b128-fig2", f"{SARATHI_REPO}/figure-2/decode.csv", 0.1893, "s",
           _decode("Yi-34B", "A100-80GB", 2, 128, 1030), None,
           "not matched: figure 2's decode series grows ~1.1 ms per sequence (47 ms at batch 1, 189 ms at 128), "
           "a per-sequence host cost of that prototype; KV reads account for ~0.06 ms per sequence"),
]


def evaluate() -> list[dict]:
    """One row per anchor: measured, ours, ratio, tolerance and whether it is within it."""
    rows = []
    for a in ANCHORS:
        ours = a.ours()
        ratio = ours / a.measured
        ok = None if a.tolerance is None else abs(ratio - 1) <= a.tolerance
        rows.append({"id": a.id, "source": a.source, "measured": a.measured, "ours": ours, "unit": a.unit,
                     "ratio": ratio, "tolerance": a.tolerance, "ok": ok, "note": a.note})
    return rows
