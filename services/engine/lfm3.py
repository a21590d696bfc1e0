"""Liquid AI's LFM3 (``Lfm3ForCausalLM``): LFM2's gated short convolutions (short_conv.py) in most layers and
Qwen3's attention (q/k norms) in the rest, with what sets it apart, read from its config as transformers reads
it. No torch at import (the scheduler reads configs).

* Attention layers are ``full_attention`` or ``sliding_attention`` (a window of ``sliding_window``), each type
  with RoPE of its own (``rope_parameters`` per type): the sliding layers' default RoPE over the whole head, the
  full layers' "proportional" RoPE (the first ``partial_rotary_factor`` of each half of the head rotated with
  frequencies of the whole head's spacing, the rest passed through; rope.py).
* Each attention head's output is scaled by a sigmoid gate of the layer's input (``g_proj``, one per head) with
  ``use_attention_gate``.
* With ``use_sandwich_norm`` each sublayer's output is normed before it joins the stream (Gemma 2's four norms
  a layer: ``post_operator_norm``, ``post_ffn_norm``), so ``ffn_norm`` is the MLP's input norm under either
  layout; ``checkpoint_names`` names each tensor as the model holds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import ShortConvShape

if TYPE_CHECKING:
    import torch

ARCH = "Lfm3ForCausalLM"
NAMES = {"norm_eps": "rms_norm_eps"}
DEFAULTS = {"vocab_size": 128000, "hidden_size": 2048, "intermediate_size": 7680, "num_hidden_layers": 24,
            "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 128000,
            "rms_norm_eps": 1e-5, "bos_token_id": 124894, "eos_token_id": 124900, "tie_word_embeddings": True,
            "sliding_window": 256}
# Qwen3's window fields, which LFM3 does not read (its layer_types say which layers slide).
IGNORED = ("use_sliding_window", "max_window_layers")
_CONV, _FULL, _SLIDING = "conv", "full_attention", "sliding_attention"
_ROPE = {_SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
         _FULL: {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5}}
_RENAMES = ((".feed_forward.w1.", ".mlp.gate_proj."), (".feed_forward.w3.", ".mlp.up_proj."),
            (".feed_forward.w2.", ".mlp.down_proj."), (".self_attn.g_proj.", ".self_attn.gate_proj."),
            (".operator_norm.", ".input_layernorm."), ("model.embedding_norm.", "model.norm."))
_SANDWICH = ((".post_operator_norm.", ".post_attention_layernorm."), (".post_ffn_norm.", ".post_feedforward_layernorm."),
             (".ffn_norm.", ".pre_feedforward_layernorm."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types and per-type RoPE with transformers' defaults; a window where some layer slides."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or [_FULL if i % 4 == 2 else _SLIDING if i % 4 == 0 and i > 0 else _CONV
                                       for i in range(layers)]
    unknown = sorted({str(t) for t in types if t not in (_CONV, _FULL, _SLIDING)}) if isinstance(types, list) else []
    if not isinstance(types, list) or len(types) != layers or unknown:
        raise ModelLoadError(f"config.json: layer_types must name each of the {layers} layers conv, full_attention "
                             f"or sliding_attention; got {', '.join(unknown) or repr(types)}")
    if all(t == _CONV for t in types):
        raise ModelLoadError("config.json: LFM3 without an attention layer is not supported: transformers cannot "
                             "run one either (its cache takes attention masks from an attention layer)")
    rope = raw.get("rope_parameters") or _ROPE
    if not isinstance(rope, dict) or not all(isinstance(rope.get(t), dict) for t in {*types} - {_CONV}):
        raise ModelLoadError(f"config.json: rope_parameters must give RoPE per attention layer type, got {rope!r}")
    rope = {_FULL: rope.get(_FULL) or _ROPE[_FULL], _SLIDING: rope.get(_SLIDING) or _ROPE[_SLIDING]}
    if rope[_SLIDING].get("rope_type", "default") != "default":  # served unscaled, at a base of their own
        raise ModelLoadError(f"config.json: LFM3's sliding layers are served with default RoPE only, got "
                             f"{rope[_SLIDING]!r}")
    return {**raw, "layer_types": types, "rope_parameters": rope, "use_sliding_window": _SLIDING in types}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only LFM3 sets (``rewrite`` has run)."""
    shape = ShortConvShape(int(raw["hidden_size"]), int(raw.get("conv_L_cache") or 7), bool(raw.get("conv_bias")))
    if shape.conv_kernel < 2:
        raise ModelLoadError(f"config.json: conv_L_cache must be >= 2, got {shape.conv_kernel}")
    conv = tuple(i for i, t in enumerate(raw["layer_types"]) if t == _CONV)
    gate = raw.get("use_attention_gate", True)
    return {**({"linear_layers": conv, "linear_attention": shape} if conv else {}),
            "sandwich_norms": bool(raw.get("use_sandwich_norm", True)), "attn_output_gate": "per_head" if gate else None,
            "o_proj_bias": bool(raw.get("attention_bias")), "architecture": ARCH,
            "local_rope_theta": float(raw["rope_parameters"][_SLIDING].get("rope_theta") or 10000.0)
            if _SLIDING in raw["layer_types"] else None}


def checkpoint_names(weights: Iterator[tuple[str, torch.Tensor]], sandwich: bool,
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """Its tensors under the names the model holds them by: without sandwich norms, ``ffn_norm`` is the norm
    after attention as Llama names it."""
    renames = (*_RENAMES, *(_SANDWICH if sandwich else ((".ffn_norm.", ".post_attention_layernorm."),)))
    for name, tensor in weights:
        for old, new in renames:
            name = name.replace(old, new)
        yield name, tensor
