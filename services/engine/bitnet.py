"""BitNet b1.58's ternary layers (``quant_method: bitnet``): every projection of the decoder layers multiplies
its input, rounded per token to 8-bit levels, by weights of -1, 0 or 1 times one scale per tensor, as
transformers' ``BitLinear`` and ``AutoBitLinear`` compute them. The weights are dequantized while they load (the
model holds ``ternary / scale`` or ``ternary * scale`` in its dtype; ternary matmuls are not done yet) and
``quantize_activations`` rounds each projection's input at run time.

Three layouts, by ``linear_class`` and ``quantization_mode``:

- ``packed`` (``bitlinear``, microsoft/bitnet-b1.58-2B-4T, HF1BitLLM's Llama 3): ``X.weight`` uint8, four
  ternary values per byte down the rows (the value of row ``i * R + r`` in bits ``2i`` of stored row ``r``, as 0,
  1 or 2 for -1, 0, 1), and ``X.weight_scale``, which the output is divided by;
- ``scaled`` (``autobitlinear`` offline): ternary ``X.weight`` (packed as above where it is uint8) and
  ``X.weight_scale``, which the output is multiplied by;
- ``online`` (``autobitlinear`` online, the ``-bf16`` master weights): float weights, each tensor rounded to
  ternary levels of its mean absolute value as it loads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

LAYOUTS = ("packed", "scaled", "online")
# The projections BitNet's checkpoints quantize (every linear layer of a decoder layer; not the output head).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_VALUES_PER_BYTE = 4


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """Each token's features rounded to 255 levels of its largest magnitude (transformers' ``ActQuant``: in fp32,
    the result cast back)."""
    wide = x.float()
    scale = 127.0 / wide.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-5)
    return ((wide * scale).round_().clamp_(-128, 127) / scale).to(x.dtype)


def ternary_weights(weights: Iterable[tuple[str, torch.Tensor]], layout: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each projection's weight (and scale) replaced by the weight it stands for;
    others pass unchanged. Raises ``KeyError`` naming a weight whose scale is missing or the other way round."""
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        module, _, part = name.rpartition(".")
        if module.rpartition(".")[2] not in PROJECTIONS or part not in ("weight", "weight_scale"):
            yield name, tensor
            continue
        if layout == "online":
            if part == "weight_scale":
                raise KeyError(f"{name}: quantization_mode online quantizes float weights as they load; a checkpoint "
                               "with weight scales is offline")
            yield name, _ternarized(tensor)
            continue
        parts = waiting.setdefault(module, {})
        parts[part] = tensor
        if len(parts) == 2:  # a module's two tensors are adjacent in a shard
            del waiting[module]
            yield f"{module}.weight", _dequantized(module, parts, layout)
    for module, parts in waiting.items():
        missing = "weight_scale" if "weight" in parts else "weight"
        raise KeyError(f"ternary weight {module}.weight lacks {module}.{missing}")


def _dequantized(module: str, parts: dict[str, torch.Tensor], layout: str) -> torch.Tensor:
    weight, scale = parts["weight"], parts["weight_scale"]
    if scale.numel() != 1:
        raise KeyError(f"{module}.weight_scale must be one number per tensor, got shape {tuple(scale.shape)}")
    dtype = scale.dtype if scale.is_floating_point() else torch.float32
    if weight.dtype == torch.uint8:
        weight = unpack(weight)
    elif layout == "packed":
        raise KeyError(f"{module}.weight: linear_class bitlinear stores ternary values packed in uint8, got "
                       f"{weight.dtype}")
    weight = weight.to(dtype)
    return weight / scale.reshape(()) if layout == "packed" else weight * scale.reshape(())


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Ternary values (int8) from four per byte down the rows: stored row ``r``'s bits ``2i`` hold row
    ``i * R + r`` as 0, 1 or 2 (transformers' ``unpack_weights``)."""
    shifts = torch.arange(0, 2 * _VALUES_PER_BYTE, 2, dtype=torch.uint8, device=packed.device)
    values = (packed.unsqueeze(0) >> shifts.view(-1, *[1] * packed.ndim)) & 3
    return values.reshape(-1, *packed.shape[1:]).to(torch.int8) - 1


def _ternarized(weight: torch.Tensor) -> torch.Tensor:
    """transformers' ``WeightQuant``: in fp32, each value rounded to -1, 0 or 1 times the tensor's mean absolute
    value, cast back."""
    w = weight.float()
    scale = 1.0 / w.abs().mean().clamp_(min=1e-5)
    return ((w * scale).round_().clamp_(-1, 1) / scale).to(weight.dtype)
