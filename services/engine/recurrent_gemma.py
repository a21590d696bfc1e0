"""Google's RecurrentGemma (``RecurrentGemmaForCausalLM``: RecurrentGemma-2B, -9B; Griffin): what sets it apart from
Llama, which it runs as, read from its config as transformers reads it. No torch (the scheduler reads configs).

* Layers by ``block_types`` (cycled; recurrent, recurrent, attention by default): Griffin's recurrent block
  (rglru.py: a recurrent state per sequence, no KV) or local attention over the last ``attention_window_size``
  keys with RoPE over half of each head, an output projection with a bias, q/k/v with ``attention_bias``.
* Gemma's RMSNorms (a scale of 1 + w, in fp32), embeddings times sqrt(hidden_size) rounded to bf16, a gated
  tanh-GELU MLP with biases half ``intermediate_size`` wide, logits soft-capped (``logits_soft_cap``), the head
  tied to the embeddings.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import RgLruShape

ARCH = "RecurrentGemmaForCausalLM"
NAMES = {"hidden_activation": "hidden_act", "attention_window_size": "sliding_window"}
DEFAULTS = {"num_hidden_layers": 26, "vocab_size": 256000, "hidden_size": 2560, "intermediate_size": 3 * 2560,
            "num_attention_heads": 10, "sliding_window": 2048, "conv1d_width": 4, "logits_soft_cap": 30.0,
            "rms_norm_eps": 1e-6, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
            "hidden_act": "gelu_pytorch_tanh", "rope_theta": 10000.0, "attention_bias": False,
            "tie_word_embeddings": True, "block_types": ["recurrent", "recurrent", "attention"]}
IGNORED = ("w_init_variance_scale", "final_w_init_variance_scale", "attention_dropout", "head_dim", "layer_types",
           "mlp_bias")
RENAMES = ((".temporal_block.", ".self_attn."), (".temporal_pre_norm.", ".input_layernorm."),
           (".channel_pre_norm.", ".post_attention_layernorm."), (".mlp_block.", ".mlp."),
           ("model.final_norm.", "model.norm."))
# transformers' RecurrentGemma names no context length (local attention, recurrent states): served up to the 8K
# tokens its models were trained on (the Griffin paper's sequence length), unless max_position_embeddings says.
MAX_CONTEXT = 8192


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its MLP's width (half intermediate_size), one head width, KV heads as transformers defaults them."""
    heads = int(raw["num_attention_heads"])
    return {**raw, "intermediate_size": int(raw["intermediate_size"]) // 2,
            "num_key_value_heads": int(raw.get("num_key_value_heads") or heads),
            "head_dim": int(raw["hidden_size"]) // heads,
            "max_position_embeddings": int(raw.get("max_position_embeddings") or MAX_CONTEXT)}


def _bf16(x: float) -> float:
    """``x`` rounded to bfloat16 (to nearest, ties to even), as a float."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    layers, hidden, heads = int(raw["num_hidden_layers"]), int(raw["hidden_size"]), int(raw["num_attention_heads"])
    kinds = list(raw["block_types"])
    if not kinds or set(kinds) - {"recurrent", "attention"}:
        raise ModelLoadError(f"config.json: block_types must list recurrent or attention blocks, got {kinds!r}")
    kinds = (kinds * math.ceil(layers / len(kinds)))[:layers]
    width = int(raw.get("lru_width") or hidden)
    if width % heads:
        raise ModelLoadError(f"config.json: lru_width ({width}) must be a multiple of num_attention_heads ({heads})")
    recurrent = tuple(i for i, kind in enumerate(kinds) if kind == "recurrent")
    attention = len(recurrent) < layers
    return {"architecture": ARCH, "norm_unit_offset": True, "mlp_bias": True, "o_proj_bias": True,
            "attention_bias": bool(raw["attention_bias"]), "embed_scale": _bf16(math.sqrt(hidden)),
            "embed_scale_rounded": True, "final_softcap": float(raw["logits_soft_cap"]),
            "partial_rotary_factor": raw["partial_rotary_aside"],
            "sliding_window": int(raw["sliding_window"]) if attention else None,
            "sliding_layers": tuple(i for i in range(layers) if i not in recurrent) if attention and recurrent else None,
            "linear_layers": recurrent,
            "linear_attention": RgLruShape(width, heads, int(raw["conv1d_width"])) if recurrent else None}
