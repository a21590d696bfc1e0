"""NVIDIA's Nemotron-H (Nemotron-H 8B/47B, Nemotron Nano 2, Nemotron 3: ``NemotronHForCausalLM``): what sets it
apart, read from its config as transformers reads it. No torch (the scheduler reads configs).

* Each layer is one sublayer behind its own RMSNorm, added to the stream: a Mamba-2 mixer ("M" in
  ``hybrid_override_pattern``; mamba2.py), attention without positions ("*": no RoPE, no biases), an ungated
  ReLU² MLP ("-") or a mixture of experts ("E"). ``ModelConfig.sublayers`` says which of "mixer" and "mlp" each
  layer holds.
* Its experts are ungated ReLU² MLPs, routed as DeepSeek-V3 routes (sigmoid scores, a correction bias, groups;
  the router in fp32), beside an ungated shared MLP; with ``moe_latent_size`` the routed experts work in a
  narrower space (``fc1_latent_proj`` down before them, ``fc2_latent_proj`` up after; moe.py).
* Its checkpoints name every sublayer ``mixer`` under ``backbone.``; ``checkpoint_names`` gives each tensor the
  name the model holds it by, which depends on the layer's kind.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import Mamba2Shape, json_float

if TYPE_CHECKING:
    import torch

ARCH = "NemotronHForCausalLM"
# hybrid_override_pattern's letters, and the legacy names of layers_block_type (remap_legacy_layer_types).
_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}
_MIXERS = ("linear_attention", "full_attention")
# The config's Mamba-2 fields under the legacy names transformers still reads.
_MAMBA_NAMES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_dt_limit": "time_step_limit",
                "mamba_conv_bias": "use_conv_bias", "mamba_chunk_size": "chunk_size"}
# Its fields under Llama's names; use_bias (its Mamba-2 projections') set aside from Llama's reading.
NAMES = {"layer_norm_epsilon": "rms_norm_eps", "mlp_hidden_act": "hidden_act", "use_bias": "mamba_use_bias"}
DEFAULTS = {"vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 21504, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "relu2", "tie_word_embeddings": False}
# Fields transformers' Nemotron-H does not read as Llama would: its attention has no biases and no positions, its
# norms' epsilon is layer_norm_epsilon (released configs carry an rms_norm_eps too).
IGNORED = ("attention_bias", "sliding_window", "rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps")


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types as one list (``layers_block_type``, its ``layer_types`` alias, or the pattern string of
    the released configs), which also sets the layer count, as transformers reads them."""
    types = raw.get("layers_block_type") or raw.get("layer_types")
    if types is None and raw.get("hybrid_override_pattern") is not None:
        pattern = str(raw["hybrid_override_pattern"])
        unknown = sorted(set(pattern) - set(_PATTERN))
        if unknown:
            raise ModelLoadError(f"config.json: hybrid_override_pattern holds {', '.join(unknown)}; each layer is "
                                 "M (Mamba-2), * (attention), - (MLP) or E (experts)")
        types = [_PATTERN[c] for c in pattern]
    if types is None:
        types = ["linear_attention", "moe", "full_attention", "mlp"]  # transformers' default
    if not isinstance(types, list):
        raise ModelLoadError(f"config.json: layers_block_type must be a list, got {types!r}")
    types = [_LEGACY.get(t, t) for t in types]
    unknown = sorted({str(t) for t in types if t not in _PATTERN.values()})
    if unknown or not types:
        raise ModelLoadError(f"config.json: layers_block_type holds {', '.join(unknown) or 'no layer'}; each layer "
                             f"is one of {', '.join(_PATTERN.values())}")
    if not any(t == "full_attention" for t in types):
        raise ModelLoadError("config.json: Nemotron-H without an attention layer is not supported: transformers "
                             "cannot run one either (its cache takes attention masks from an attention layer)")
    return {**raw, "layers_block_type": types, "num_hidden_layers": len(types)}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Nemotron-H sets: its sublayers, Mamba-2 shape, positionless attention,
    ungated MLPs and experts (``rewrite`` has run)."""
    types = raw["layers_block_type"]
    moe = tuple(i for i, t in enumerate(types) if t == "moe")
    return {"sublayers": tuple("mixer" if t in _MIXERS else "mlp" for t in types),
            "linear_layers": tuple(i for i, t in enumerate(types) if t == "linear_attention"),
            "linear_attention": _mamba_shape(raw), "nope_layers": tuple(range(len(types))), "mlp_gated": False,
            "architecture": ARCH, **(_moe_fields(raw, moe) if moe else {})}


def _mamba_shape(raw: dict[str, Any]) -> Mamba2Shape:
    if raw.get("mamba_hidden_act", "silu") != "silu":
        raise ModelLoadError(f"config.json: mamba_hidden_act {raw['mamba_hidden_act']!r}; Mamba-2 layers convolve "
                             "through silu")
    raw = {**raw, **{new: raw[old] for old, new in _MAMBA_NAMES.items() if old in raw}}
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    shape = Mamba2Shape(num_heads=int(raw.get("mamba_num_heads") or 128), head_dim=int(raw.get("mamba_head_dim") or 64),
                        state_size=int(raw.get("ssm_state_size") or 128), n_groups=int(raw.get("n_groups") or 8),
                        conv_kernel=int(raw.get("conv_kernel") or 4), chunk_size=int(raw.get("chunk_size") or 128),
                        conv_bias=bool(raw.get("use_conv_bias", True)), proj_bias=bool(raw.get("mamba_use_bias", False)),
                        time_step_limit=(json_float(limit[0]), json_float(limit[1])))
    if shape.num_heads % shape.n_groups or shape.conv_kernel < 2 or shape.chunk_size < 1:
        raise ModelLoadError(f"config.json: Mamba-2 layers of {shape.num_heads} heads in n_groups {shape.n_groups} "
                             f"groups that divide them, a convolution of at least 2 ({shape.conv_kernel}) and "
                             f"chunks of at least 1 ({shape.chunk_size})")
    return shape


def _moe_fields(raw: dict[str, Any], layers: tuple[int, ...]) -> dict[str, Any]:
    """Its experts as transformers reads them: DeepSeek-V3's routing (renormalized unless norm_topk_prob is
    false), a shared MLP of moe_shared_expert_intermediate_size, experts of moe_intermediate_size over a latent
    of moe_latent_size (none when null)."""
    return {"num_experts": int(raw.get("n_routed_experts") or 8), "num_experts_per_tok": int(raw.get("num_experts_per_tok") or 2),
            "moe_intermediate_size": int(raw.get("moe_intermediate_size") or 7688), "moe_layers": layers,
            "norm_topk_prob": bool(raw.get("norm_topk_prob", True)),
            "shared_expert_intermediate_size": int(raw.get("moe_shared_expert_intermediate_size") or 7688),
            "shared_expert_gated": False, "moe_routing": "sigmoid", "moe_groups": int(raw.get("n_group") or 1),
            "moe_topk_groups": int(raw.get("topk_group") or 1),
            "routed_scaling_factor": float(raw.get("routed_scaling_factor", 1.0)), "routing_weights_fp32": True,
            "moe_latent_size": int(raw.get("moe_latent_size") or 0)}


def checkpoint_names(weights: Iterator[tuple[str, torch.Tensor]], sublayers: tuple[str, ...],
                     linear_layers: tuple[int, ...]) -> Iterator[tuple[str, torch.Tensor]]:
    """Its tensors under the names the model holds them by: ``backbone.`` as ``model.``, each layer's ``norm``
    as its input norm, and its ``mixer`` as the Mamba-2 mixer, attention or MLP the layer holds; skipped:
    multi-token-prediction layers (``mtp.*``), as transformers skips them."""
    for name, tensor in weights:
        if name.startswith("mtp."):
            continue
        if name.startswith("backbone."):
            name = "model." + name.removeprefix("backbone.")
        name = name.replace("model.embeddings.", "model.embed_tokens.").replace("model.norm_f.", "model.norm.")
        parts = name.split(".")
        if len(parts) > 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
            layer = int(parts[2])
            if parts[3] == "norm":
                parts[3] = "input_layernorm"
            elif parts[3] == "mixer" and layer < len(sublayers):
                parts[3] = ("mamba" if layer in linear_layers else "self_attn") if sublayers[layer] == "mixer" \
                    else "mlp"
            name = ".".join(parts)
        yield name, tensor
