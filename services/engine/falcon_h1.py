"""TII's Falcon-H1 (Falcon-H1 0.5B to 34B, Falcon-H1R: ``FalconH1ForCausalLM``): what sets it apart, read from
its config as transformers reads it. No torch at import (the scheduler reads configs).

* Every layer runs attention and a Mamba-2 mixer (mamba2.py) side by side on one norm and adds both outputs to
  the stream (``ModelConfig.parallel_mixers``): each layer keeps KV and a recurrent state. The mixer is
  ``mamba_d_ssm`` wide where set; its output is gated with or without a grouped norm (``mamba_rms_norm``,
  ``mamba_norm_before_gate``); out_proj's bias is ``projectors_bias``.
* µP multipliers scale the embeddings, attention's input, keys and output, the mixer's input, each of its five
  projected parts (``ssm_multipliers``: z, x, B, C, dt) and its output, the MLP's gate and down projections,
  and the logits. All but the logits' are linear in a weight, so ``scaled_weights`` folds them into the
  tensors as they load (one multiply less per use, and the fused CPU forward computes the blocks as any
  hybrid's); the logits keep theirs (``ModelConfig.logit_scale``), as transformers multiplies them.
* Its MLP and norms are ``feed_forward``, ``pre_ff_layernorm`` and ``final_layernorm`` (weight_names.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import mamba2_fields

if TYPE_CHECKING:
    import torch

    from services.engine.linear_attention_config import Mamba2Shape

ARCH = "FalconH1ForCausalLM"
DEFAULTS = {"vocab_size": 128000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}
# Fields of the released configs transformers does not read (its layers are all hybrid; its MLP always there).
IGNORED = ("attn_layer_indices", "mamba_use_mlp", "mlp_expansion_factor", "num_logits_to_keep", "layer_types",
           "layers_block_type")
RENAMES = ((".feed_forward.", ".mlp."), (".pre_ff_layernorm.", ".post_attention_layernorm."),
           ("model.final_layernorm.", "model.norm."))
_HYBRID = "hybrid"


@dataclass(frozen=True)
class Multipliers:
    """The µP multipliers ``scaled_weights`` folds into the weights (the logits' is ``logit_scale``)."""

    embedding: float = 1.0
    attention_in: float = 1.0
    key: float = 1.0
    attention_out: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    ssm: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)  # z, x, B, C, dt
    mlp_gate: float = 1.0
    mlp_down: float = 1.0


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Every layer as a Mamba-2 layer for ``mamba2_fields`` (each attends too: ``parallel_mixers``)."""
    return {**raw, "layer_types": [_HYBRID] * int(raw["num_hidden_layers"])}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Falcon-H1 sets: its parallel mixers, their Mamba-2 shape, the
    multipliers (``rewrite`` has run)."""
    width = raw.get("mamba_d_ssm", 1024)  # transformers' default; null: mamba_expand * hidden_size
    norm = "gate" if not raw.get("mamba_rms_norm") else \
        "norm_then_gate" if raw.get("mamba_norm_before_gate", True) else "gate_then_norm"
    mlp = _floats(raw, "mlp_multipliers", 2)
    multipliers = Multipliers(
        embedding=_float(raw, "embedding_multiplier"), attention_in=_float(raw, "attention_in_multiplier"),
        key=_float(raw, "key_multiplier"), attention_out=_float(raw, "attention_out_multiplier"),
        ssm_in=_float(raw, "ssm_in_multiplier"), ssm_out=_float(raw, "ssm_out_multiplier"),
        ssm=_floats(raw, "ssm_multipliers", 5), mlp_gate=mlp[0], mlp_down=mlp[1])
    return {**mamba2_fields(raw, (_HYBRID,),
                            width=None if width is None else int(width), gated_norm=norm, norm_weight_in_fp32=True,
                            out_proj_bias=bool(raw.get("projectors_bias"))),
            "parallel_mixers": True, "logit_scale": _float(raw, "lm_head_multiplier"),
            "multipliers": multipliers if multipliers != Multipliers() else None, "architecture": ARCH}


def _float(raw: dict[str, Any], name: str) -> float:
    value = raw.get(name)
    return 1.0 if value is None else float(value)


def _floats(raw: dict[str, Any], name: str, n: int) -> tuple[float, ...]:
    values = raw.get(name)
    if values is None:
        return (1.0,) * n
    if not isinstance(values, list | tuple) or len(values) != n:
        raise ModelLoadError(f"config.json: {name} must list {n} numbers, got {values!r}")
    return tuple(float(v) for v in values)


def scaled_weights(weights: Iterator[tuple[str, torch.Tensor]], m: Multipliers, shape: Mamba2Shape,
                   tied: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with the multipliers folded in (in fp32, before the model's dtype): a
    projection's output times m is its weight (and bias) times m, its input times m its weight times m. A tied
    head keeps the embeddings as stored (it is loaded as a head of its own)."""
    zx = shape.intermediate
    bc = shape.n_groups * shape.state_size
    # in_proj's rows: z, x, B, C, dt (transformers' mup_vector).
    bounds = (0, zx, 2 * zx, 2 * zx + bc, 2 * zx + 2 * bc, 2 * zx + 2 * bc + shape.num_heads)
    for name, tensor in weights:
        if name == "model.embed_tokens.weight" and tied and m.embedding != 1.0:
            yield "lm_head.weight", tensor
        scale = _scale(name, m)
        if name.endswith((".mamba.in_proj.weight", ".mamba.in_proj.bias")):
            tensor = tensor.float() * scale  # a copy: the checkpoint's tensor may be read-only
            for i, mult in enumerate(m.ssm):
                tensor[bounds[i]:bounds[i + 1]] *= mult
        elif scale != 1.0:
            tensor = tensor.float() * scale
        yield name, tensor


def _scale(name: str, m: Multipliers) -> float:
    """The factor on the whole of a tensor."""
    if name == "model.embed_tokens.weight":
        return m.embedding
    part, _, kind = name.rpartition(".")
    if part.endswith((".self_attn.q_proj", ".self_attn.v_proj")):
        return m.attention_in if kind == "weight" else 1.0
    if part.endswith(".self_attn.k_proj"):
        return (m.attention_in if kind == "weight" else 1.0) * m.key
    if part.endswith(".self_attn.o_proj"):
        return m.attention_out
    if part.endswith(".mamba.in_proj"):
        return m.ssm_in if kind == "weight" else 1.0
    if part.endswith(".mamba.out_proj"):
        return m.ssm_out
    if part.endswith(".feed_forward.gate_proj"):
        return m.mlp_gate
    if part.endswith(".feed_forward.down_proj"):
        return m.mlp_down
    return 1.0
