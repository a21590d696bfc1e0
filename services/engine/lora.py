"""LoRA adapters on a worker: loaded on first use by the path a sequence names, and applied to the tokens of
the sequences that use them, any mix of adapters (and none) in one batch.

Each projection adds ``scaling * B(A(x))`` to the base output, as PEFT does (greedy output matches
``transformers`` + ``peft``). The engine fuses q/k/v and gate/up; so are their adapters: the parts' A stacked,
and their B as one block-diagonal matrix over the fused output (zeros for parts the adapter leaves alone),
so an adapter costs two matmuls per projection whatever it adapts; the second accumulates into the base
output with the scaling folded in (``addmm_``). B's rows are the projection's outputs: they are split,
reordered and scaled as the loader does the rows of the weight they adapt (``Rows``: a fused
``query_key_value`` split per head, RoPE's interleaved pairs reordered, Falcon-H1's multipliers folded in).
An adapter whose tokens are one run of rows (a batch of one adapter, or the decodes of each adapter, which the
fused CPU path groups by adapter) reads and writes them as views; tokens spread over the batch are gathered
(``index_select``) and added back (``index_add_``). An activated LoRA's rows start at its invocation
(``lora_batch``).

Projections the model holds as the checkpoint does (a linear-attention mixer's, an output gate, latent
attention's) are adapted where they run (``adapted``; mla.py absorbs kv_b_proj's as it absorbs the weight).
An MoE's experts are adapted per expert (``ExpertsLora``): the rows routed to the experts, grouped by expert as
moe.py groups them, go through each expert's A and B in two grouped GEMMs, rows of other adapters' tokens
zeroed between the two.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors import safe_open

from services.common.lora import LoraSpec, adapted_weight, read_lora
from services.common.lora_shape import ModelShape
from services.common.step import LoraRef
from services.engine.grouped_mm import grouped_mm

log = logging.getLogger(__name__)

# Projections whose adapters are read but not applied, as transformers applies none: its Mamba, Falcon Mamba and
# Jamba multiply by dt_proj's weight directly, past PEFT's wrapper, so such an adapter neither trained (no gradient
# reaches it: B stays as PEFT initialises it, zeros) nor changes transformers' output.
UNAPPLIED = ("mamba.dt_proj",)

# A checkpoint weight's name and an adapter's B for it -> (name, B's rows) for each weight the model holds of it,
# named as the checkpoint would name that part (loader.lora_rows); without one, B as it is.
Rows = Callable[[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]


def _columns(shape: ModelShape, shared: bool) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
    """Where each module an adapter's B may write goes: (the model's fused projection, its first column there);
    and each fused projection's width. ``shared``: in an MoE layer's shared expert, whose projections an
    adapter's batch adds to as a dense layer's (the layer has no other MLP)."""
    h, q, kv = shape.hidden_size, shape.q_size, shape.kv_size
    i = shape.shared_intermediate if shared else shape.intermediate_size
    columns = {"q_proj": ("qkv", 0), "k_proj": ("qkv", q), "v_proj": ("qkv", q + kv), "qkv_proj": ("qkv", 0),
               "o_proj": ("o", 0), "gate_proj": ("gate_up", 0), "up_proj": ("gate_up", i if shape.gated_mlp else 0),
               "gate_up_proj": ("gate_up", 0), "down_proj": ("down", 0)}
    return columns, {"qkv": q + 2 * kv, "o": h, "gate_up": 2 * i if shape.gated_mlp else i, "down": h}


@dataclass
class ProjectionLora:
    a: torch.Tensor  # [R, in]: the parts' A stacked (R = the sum of their ranks)
    bt: torch.Tensor  # [R, out]: the parts' B, block-diagonal over the fused output, transposed for ``x @ bt``
    scaling: float  # the first part's; another part's own (alpha_pattern) is folded into its B as a ratio


@dataclass
class ExpertsLora:
    a: torch.Tensor  # [E, in, r]: each expert's A, transposed for grouped_mm
    bt: torch.Tensor  # [E, r, out]: each expert's B, its outputs in the model's order
    scaling: float


def _experts_lora(a: torch.Tensor, b: torch.Tensor, weight: str, shape: ModelShape, rows: Rows | None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """PEFT's A ``[r·E, in]`` and B ``[out, r·E]`` of a stacked expert projection as (A ``[E, in, r]``, B
    ``[E, r, out]``): expert e's A is rows ``e·r ..`` of A, its B columns ``e, e+E, ..`` of B (PEFT reshapes them
    so). Llama 4's come swapped (services/common/lora.py): its A holds the outputs, its B the inputs."""
    e = shape.num_experts
    if shape.experts_swapped:
        if rows is not None:  # the outputs as the model orders them
            ((_, out),) = rows(weight, a.T)
            a = out.T
        return b.unflatten(1, (-1, e)).permute(2, 0, 1), a.unflatten(0, (e, -1))
    if rows is not None:
        ((_, b),) = rows(weight, b)
    return a.unflatten(0, (e, -1)).transpose(1, 2), b.unflatten(1, (-1, e)).permute(2, 1, 0)


class LoraWeights:
    """One adapter's tensors on the worker's device: per layer, per fused projection."""

    def __init__(self, spec: LoraSpec, shape: ModelShape, device: torch.device, dtype: torch.dtype,
                 rows: Rows | None = None) -> None:
        self.spec = spec

        def on_device(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype)

        # (layer, fused projection) -> each A, its scaling and where its B's rows go:
        # [(A, scaling, [(first column, B's part)])]; and the projection's width
        blocks: dict[tuple[int, str], list[tuple[torch.Tensor, float, list[tuple[int, torch.Tensor]]]]] = {}
        widths: dict[tuple[int, str], int] = {}
        # Projections held as the checkpoint holds them (a mixer's, the attention's output gate) and the experts'.
        unfused: dict[tuple[int, str], ExpertsLora | ProjectionLora] = {}
        # A classifier head saved whole (modules_to_save): the adapter's requests are scored by it.
        self.head: torch.Tensor | None = None
        with safe_open(str(spec.weights_path), framework="pt", device="cpu") as f:
            if spec.head is not None:
                self.head = on_device(f.get_tensor(spec.head))
            for key, (a_name, b_name) in spec.tensors.items():
                layer, scaling, b = key[0], spec.scalings.get(key, spec.scaling), f.get_tensor(b_name)
                if key[1] in UNAPPLIED:
                    if b.any():
                        log.warning("LoRA %r: its %s adapter is not applied (transformers applies none)",
                                    spec.ref.name, key[1])
                    continue
                a = f.get_tensor(a_name)
                if key[1].startswith("experts."):
                    a, bt = _experts_lora(a, b, f"model.layers.{layer}.mlp.{key[1]}", shape, rows)
                    projection = "experts.down" if key[1] == "experts.down_proj" else "experts.gate_up"
                    unfused[layer, projection] = ExpertsLora(on_device(a), on_device(bt), scaling)
                    continue
                weight = adapted_weight(b_name)
                columns, width = _columns(shape, shared=key[1].startswith("shared_expert."))
                placed: dict[str, list[tuple[int, torch.Tensor]]] = {}  # the model's projection -> B's parts there
                for name, part in rows(weight, b) if rows is not None else [(weight, b)]:
                    plain = shape.projection(name)
                    if plain is not None:  # held as the checkpoint holds it (also Qwen3.5's q_proj's gate rows)
                        unfused[layer, plain[1]] = ProjectionLora(on_device(a), on_device(part.T), scaling)
                        continue
                    fused, col = columns[shape.module(name)[2]]
                    placed.setdefault(fused, []).append((col, part))
                    widths[layer, fused] = width[fused]
                for fused, parts in placed.items():
                    blocks.setdefault((layer, fused), []).append((a, scaling, parts))
        self.layers: list[dict[str, ProjectionLora | ExpertsLora]] = [{} for _ in range(shape.num_layers)]
        for (layer, projection), lora in unfused.items():
            self.layers[layer][projection] = lora
        for (layer, fused), group in sorted(blocks.items()):
            a = torch.cat([a for a, _, _ in group])
            bt = torch.zeros(a.shape[0], widths[layer, fused])
            scaling, row = group[0][1], 0
            for part_a, part_scaling, parts in group:
                for col, b in parts:
                    block = b.T if part_scaling == scaling else b.T * (part_scaling / scaling)
                    bt[row:row + part_a.shape[0], col:col + b.shape[0]] = block
                row += part_a.shape[0]
            self.layers[layer][fused] = ProjectionLora(on_device(a), on_device(bt), scaling)


class LoraBatch:
    """The adapters of one forward pass: per adapter, the flat rows of its tokens: a slice when they are one run
    (``slice(None)``: every token), else their indices."""

    def __init__(self, groups: list[tuple[LoraWeights, slice | torch.Tensor]]) -> None:
        self.groups = groups

    def add(self, y: torch.Tensor, x: torch.Tensor, layer: int, projection: str) -> torch.Tensor:
        """Adds each adapter's ``scaling * B(A(x))`` to its rows of ``y`` (in place) and returns ``y``."""
        for weights, rows in self.groups:
            proj = weights.layers[layer].get(projection)
            if proj is None:
                continue
            if isinstance(rows, slice):
                y[rows].addmm_(F.linear(x[rows], proj.a), proj.bt, alpha=proj.scaling)
            else:
                y.index_add_(0, rows, F.linear(x.index_select(0, rows), proj.a) @ proj.bt, alpha=proj.scaling)
        return y

    def groups_of(self, layer: int, projection: str) -> list[tuple[slice | torch.Tensor, ProjectionLora]]:
        """Each adapter's rows and its adapter of ``projection`` in ``layer``, for one that adds them otherwise
        than ``add`` (mla.py absorbs kv_b_proj's into the query and output)."""
        return [(rows, proj) for weights, rows in self.groups
                if (proj := weights.layers[layer].get(projection)) is not None]

    def expert_masks(self, tokens: torch.Tensor) -> list[torch.Tensor | None]:
        """Per adapter, which of moe.py's rows (row i from token ``tokens[i]``) are its tokens' (``[n, 1]``;
        None: every row), for both of a layer's ``add_experts``."""
        return [None if isinstance(rows, slice) and rows == slice(None)
                else (torch.isin(tokens, rows) if isinstance(rows, torch.Tensor)
                      else (tokens >= rows.start) & (tokens < rows.stop)).unsqueeze(1)
                for _, rows in self.groups]

    def add_experts(self, y: torch.Tensor, x: torch.Tensor, layer: int, projection: str, offsets: torch.Tensor,
                    masks: list[torch.Tensor | None]) -> torch.Tensor:
        """Adds each adapter's experts' ``scaling * B_e(A_e(x))`` to ``y`` (in place) and returns it: ``x`` and
        ``y`` are moe.py's rows, grouped by expert (``offsets``); ``masks``: ``expert_masks``'s."""
        for (weights, _), mine in zip(self.groups, masks, strict=True):
            proj = weights.layers[layer].get(projection)
            if proj is None:
                continue
            low = grouped_mm(x, proj.a, offsets)
            if mine is not None:  # only this adapter's tokens' rows
                low *= mine
            y.add_(grouped_mm(low, proj.bt, offsets), alpha=proj.scaling)
        return y


def adapted(linear: torch.nn.Linear, x: torch.Tensor, lora: LoraBatch | None, layer: int, name: str) -> torch.Tensor:
    """``linear(x)`` plus the batch's adapters of it: the projection ``name`` of ``layer`` (a linear-attention
    mixer's, held as the checkpoint holds it)."""
    y = linear(x)
    return y if lora is None else lora.add(y, x, layer, name)


def lora_batch(spans: list[tuple[LoraWeights | None, int, int]], device: torch.device) -> LoraBatch | None:
    """``spans``: (adapter or None, tokens, how many of them precede the adapter's first: an activated LoRA's)
    per scheduled sequence, in the flat batch's order. None when no token has an adapter."""
    rows: dict[int, tuple[LoraWeights, list[int]]] = {}
    num_tokens = 0
    for weights, n, before in spans:
        if weights is not None and before < n:
            rows.setdefault(id(weights), (weights, []))[1].extend(range(num_tokens + max(before, 0), num_tokens + n))
        num_tokens += n
    if not rows:
        return None
    return LoraBatch([(w, _rows(r, num_tokens, device)) for w, r in rows.values()])


def _rows(rows: list[int], num_tokens: int, device: torch.device) -> slice | torch.Tensor:
    if len(rows) == num_tokens:
        return slice(None)
    if rows[-1] - rows[0] == len(rows) - 1:  # ascending, so one run
        return slice(rows[0], rows[-1] + 1)
    return torch.tensor(rows, dtype=torch.long, device=device)


class LoraCache:
    """The adapters a worker has loaded, by name and path. Adapters that live sequences use stay; of the
    others, the ``max_idle`` used most recently stay too, so a returning adapter is not read again."""

    def __init__(self, shape: ModelShape, device: torch.device, dtype: torch.dtype, max_idle: int = 8,
                 rows: Rows | None = None) -> None:
        self.shape, self.device, self.dtype, self.max_idle, self.rows = shape, device, dtype, max_idle, rows
        self._loaded: OrderedDict[LoraRef, LoraWeights] = OrderedDict()

    def get(self, ref: LoraRef, in_use: set[int]) -> LoraWeights:
        """The adapter's weights, loaded if needed; ``in_use``: ids of the weights live sequences hold.
        Raises ``InvalidArgument`` when the files do not fit the model."""
        weights = self._loaded.get(ref)
        if weights is None:
            weights = LoraWeights(read_lora(ref, self.shape, max_rank=1 << 16), self.shape, self.device, self.dtype,
                                  self.rows)
            log.info("loaded LoRA %r from %s (rank %d, %d projections)", ref.name, ref.path, weights.spec.rank,
                     len(weights.spec.tensors))
            self._loaded[ref] = weights
        self._loaded.move_to_end(ref)
        idle = [r for r, w in self._loaded.items() if id(w) not in in_use and r != ref]
        for r in idle[: max(0, len(idle) - self.max_idle)]:
            del self._loaded[r]
        return weights

    def __len__(self) -> int:
        return len(self._loaded)
