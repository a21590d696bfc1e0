"""Per-layer-type config fields as transformers reads them, checked alike for the architectures that name them
(Gemma 4, MiMo-V2-Flash, Mellum 2, Command A MoE): ``layer_types`` (full or sliding attention), ``mlp_layer_types``
(dense or sparse) and RoPE per layer type. No torch (the scheduler reads configs)."""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError

FULL, SLIDING = "full_attention", "sliding_attention"


def attention_types(types: Any, layers: int) -> list[str]:
    """``types`` if it names each of the ``layers`` layers full or sliding attention."""
    unknown = sorted({str(t) for t in types if t not in (FULL, SLIDING)}) if isinstance(types, list) else []
    if not isinstance(types, list) or len(types) != layers or unknown:
        raise ModelLoadError(f"config.json: layer_types must name each of the {layers} layers full_attention or "
                             f"sliding_attention; got {', '.join(unknown) or repr(types)}")
    return types


def mlp_types(types: Any, layers: int) -> list[str]:
    """``types`` if it names each of the ``layers`` layers' MLP dense or sparse (routed)."""
    if not isinstance(types, list) or len(types) != layers or set(types) - {"dense", "sparse"}:
        raise ModelLoadError(f"config.json: mlp_layer_types must name each of the {layers} layers dense or sparse; "
                             f"got {types!r}")
    return types


def rope_by_type(raw: dict[str, Any], defaults: dict[str, dict[str, Any]], model: str,
                 same_share: bool = False) -> dict[str, dict[str, Any]]:
    """``rope_parameters`` per layer type, each type's ``defaults`` where the config gives none; the sliding
    layers' must be unscaled (they are served at a base of their own, ``local_rope_theta``); ``same_share``: both
    types must rotate the same share of each head (served with one ``partial_rotary_factor``)."""
    rope = raw.get("rope_parameters") or defaults
    if not isinstance(rope, dict) or not all(isinstance(rope.get(t, defaults[t]), dict) for t in (FULL, SLIDING)):
        raise ModelLoadError(f"config.json: rope_parameters must give RoPE per layer type, got {rope!r}")
    rope = {t: rope.get(t) or defaults[t] for t in (FULL, SLIDING)}
    if rope[SLIDING].get("rope_type", "default") != "default":
        raise ModelLoadError(f"config.json: {model}'s sliding layers are served with default RoPE only, got "
                             f"{rope[SLIDING]!r}")
    shares = [rope[t].get("partial_rotary_factor") or 1.0 for t in (FULL, SLIDING)]
    if same_share and shares[0] != shares[1]:
        raise ModelLoadError(f"config.json: both layer types must rotate the same share of each head, got {shares[0]} "
                             f"and {shares[1]}")
    return rope


def window_where_sliding(raw: dict[str, Any], sliding: tuple[int, ...]) -> int | None:
    """``sliding_window`` where some layer slides (a window of at least 1, else refused), None where none does."""
    window = raw.get("sliding_window")
    if sliding and not (isinstance(window, int) and window >= 1):
        raise ModelLoadError(f"config.json: sliding_window must be >= 1 where layers slide, got {window!r}")
    return window if sliding else None
