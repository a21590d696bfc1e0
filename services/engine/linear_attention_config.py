"""Gated DeltaNet layers (Qwen3-Next, Qwen3.5) as their configs give them: which layers mix tokens by linear
attention instead of softmax attention, and the shape of those layers. No torch: the scheduler reads configs.

A linear-attention layer keeps no KV: each sequence carries a fixed-size recurrent state instead (a short
convolution window and one ``[value heads, key dim, value dim]`` matrix per layer; recurrent_state.py), which
depends on every token before it in order. So such a model's prefix cannot be taken from a cache, a forked
sequence or another worker by its KV blocks alone; ``ModelConfig.recurrent`` says so to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.common.errors import ModelLoadError

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


@dataclass(frozen=True)
class LinearAttentionShape:
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    # Qwen3-Next stores q, k, v and the output gate z as one projection grouped by key head (in_proj_qkvz), and
    # b and a as another (in_proj_ba); Qwen3.5 stores the four as separate projections, each in head order.
    grouped_projections: bool

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim


def linear_attention_fields(raw: dict[str, Any], grouped_projections: bool) -> dict[str, Any]:
    """``ModelConfig``'s ``linear_layers`` and ``linear_attention`` from a Qwen3-Next or Qwen3.5 config, with
    transformers' defaults (one full-attention layer in every ``full_attention_interval``, 4)."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        interval = int(raw.get("full_attention_interval") or 4)
        types = [LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise ModelLoadError(f"config.json: layer_types must list one type per layer ({layers})")
    unknown = sorted({t for t in types if t not in (LINEAR_ATTENTION, FULL_ATTENTION)})
    if unknown:
        raise ModelLoadError(f"config.json: layer_types holds {', '.join(map(str, unknown))}; each layer is "
                             f"{LINEAR_ATTENTION} or {FULL_ATTENTION}")
    shape = LinearAttentionShape(
        num_key_heads=int(raw.get("linear_num_key_heads", 16)),
        num_value_heads=int(raw.get("linear_num_value_heads", 32)),
        key_head_dim=int(raw.get("linear_key_head_dim", 128)),
        value_head_dim=int(raw.get("linear_value_head_dim", 128)),
        conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)),
        grouped_projections=grouped_projections,
    )
    if min(shape.num_key_heads, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim) < 1 \
            or shape.conv_kernel < 2:
        raise ModelLoadError(f"config.json: linear attention needs positive head counts and widths and a convolution "
                             f"of at least 2, got {shape}")
    if shape.num_value_heads % shape.num_key_heads:
        raise ModelLoadError(f"config.json: linear_num_value_heads ({shape.num_value_heads}) must be a multiple of "
                             f"linear_num_key_heads ({shape.num_key_heads})")
    return {"linear_layers": tuple(i for i, t in enumerate(types) if t == LINEAR_ATTENTION),
            "linear_attention": shape}
