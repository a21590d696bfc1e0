"""LoRA adapters on a worker: loaded on first use by the path a sequence names, and applied to the tokens of
the sequences that use them, any mix of adapters (and none) in one batch.

Each projection adds ``scaling * B(A(x))`` to the base output, in the order PEFT computes it, so greedy
output matches ``transformers`` + ``peft``. The engine fuses q/k/v and gate/up; so are their adapters: one
``A`` (the parts' A stacked) per fused projection, then each part's B written into its slice of the output.
Tokens of one adapter are gathered (``index_select``) and added back (``index_add_``); a batch of one
adapter skips both.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors import safe_open

from services.common.lora import LoraSpec, ModelShape, read_lora
from services.common.step import LoraRef

log = logging.getLogger(__name__)

# The model's fused projections and the adapter modules inside each, in the order of their output slices.
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
         "down": ("down_proj",)}


@dataclass
class _Part:
    out: slice  # the part's columns of the fused projection's output
    rank: slice  # its rows of the stacked A
    b: torch.Tensor  # [out, r]


@dataclass
class ProjectionLora:
    a: torch.Tensor  # [sum of the parts' ranks, in]
    parts: list[_Part]


class LoraWeights:
    """One adapter's tensors on the worker's device: per layer, per fused projection."""

    def __init__(self, spec: LoraSpec, shape: ModelShape, device: torch.device, dtype: torch.dtype) -> None:
        self.spec = spec
        self.scaling = spec.scaling
        outs = {"q_proj": shape.q_size, "k_proj": shape.kv_size, "v_proj": shape.kv_size, "o_proj": shape.hidden_size,
                "gate_proj": shape.intermediate_size, "up_proj": shape.intermediate_size,
                "down_proj": shape.hidden_size}
        self.layers: list[dict[str, ProjectionLora]] = [{} for _ in range(shape.num_layers)]
        with safe_open(str(spec.weights_path), framework="pt", device="cpu") as f:
            for layer, projections in enumerate(self.layers):
                for fused, modules in FUSED.items():
                    a_parts, parts, col, row = [], [], 0, 0
                    for module in modules:
                        names = spec.tensors.get((layer, module))
                        if names is not None:
                            a_parts.append(f.get_tensor(names[0]))
                            b = f.get_tensor(names[1]).to(device=device, dtype=dtype)
                            parts.append(_Part(slice(col, col + outs[module]), slice(row, row + spec.rank), b))
                            row += spec.rank
                        col += outs[module]
                    if parts:
                        projections[fused] = ProjectionLora(torch.cat(a_parts).to(device=device, dtype=dtype), parts)


class LoraBatch:
    """The adapters of one forward pass: per adapter, the flat rows of its tokens (None: every token)."""

    def __init__(self, groups: list[tuple[LoraWeights, torch.Tensor | None]]) -> None:
        self.groups = groups

    def add(self, y: torch.Tensor, x: torch.Tensor, layer: int, projection: str) -> torch.Tensor:
        """Adds each adapter's ``scaling * B(A(x))`` to its rows of ``y`` (in place) and returns ``y``."""
        for weights, rows in self.groups:
            proj = weights.layers[layer].get(projection)
            if proj is None:
                continue
            xa = F.linear(x if rows is None else x.index_select(0, rows), proj.a)
            for part in proj.parts:
                delta = F.linear(xa[:, part.rank], part.b) * weights.scaling
                if rows is None:
                    y[:, part.out] += delta
                else:
                    y[:, part.out].index_add_(0, rows, delta)
        return y


def lora_batch(spans: list[tuple[LoraWeights | None, int]], device: torch.device) -> LoraBatch | None:
    """``spans``: (adapter or None, tokens) per scheduled sequence, in the flat batch's order. None when no
    token has an adapter."""
    rows: dict[int, tuple[LoraWeights, list[int]]] = {}
    num_tokens = 0
    for weights, n in spans:
        if weights is not None:
            rows.setdefault(id(weights), (weights, []))[1].extend(range(num_tokens, num_tokens + n))
        num_tokens += n
    if not rows:
        return None
    if len(rows) == 1:
        weights, only = next(iter(rows.values()))
        if len(only) == num_tokens:
            return LoraBatch([(weights, None)])
    return LoraBatch([(w, torch.tensor(r, dtype=torch.long, device=device)) for w, r in rows.values()])


class LoraCache:
    """The adapters a worker has loaded, by name and path. Adapters that live sequences use stay; of the
    others, the ``max_idle`` used most recently stay too, so a returning adapter is not read again."""

    def __init__(self, shape: ModelShape, device: torch.device, dtype: torch.dtype, max_idle: int = 8) -> None:
        self.shape, self.device, self.dtype, self.max_idle = shape, device, dtype, max_idle
        self._loaded: OrderedDict[LoraRef, LoraWeights] = OrderedDict()

    def get(self, ref: LoraRef, in_use: set[int]) -> LoraWeights:
        """The adapter's weights, loaded if needed; ``in_use``: ids of the weights live sequences hold.
        Raises ``InvalidArgument`` when the files do not fit the model."""
        weights = self._loaded.get(ref)
        if weights is None:
            weights = LoraWeights(read_lora(ref, self.shape, max_rank=1 << 16), self.shape, self.device, self.dtype)
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
