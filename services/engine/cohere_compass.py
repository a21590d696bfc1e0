"""Cohere's Compass language model (``CohereCompassForCausalLM``, and the language model of
``CohereCompassForConditionalGeneration``: North-Micro-Vision): Cohere 2's block, read from its config as
transformers reads it, with what sets it apart. No torch at import (the scheduler reads configs).

* Cohere 2's parallel block on one LayerNorm, sliding (``sliding_window``) and full layers by ``layer_types``
  (every layer full by default), ``logit_scale`` (none: 1).
* RoPE per layer type (``rope_parameters`` keyed by type; a null entry: that type's layers use no positions),
  rotating halves as Qwen's does, not Cohere's interleaved pairs. Its multimodal sections give a text token one
  position in each, which is plain RoPE.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError
from services.engine.layer_types import FULL, SLIDING, attention_types, window_where_sliding

ARCH = "CohereCompassForCausalLM"
NAMES = {"layer_norm_eps": "rms_norm_eps"}
DEFAULTS = {"vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
            "num_attention_heads": 64, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "bos_token_id": 5,
            "eos_token_id": 255001, "pad_token_id": 0, "tie_word_embeddings": True, "sliding_window": 4096}
IGNORED = ("pooling", "sliding_window_pattern")


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types (all full by default) and its RoPE per type, served as one base for every rotating layer
    (and a local one for the sliding layers where theirs differs); refused: scaled RoPE."""
    layers = int(raw["num_hidden_layers"])
    types = attention_types(raw.get("layer_types") or [FULL] * layers, layers)
    rope = raw.get("rope_parameters") or {}
    params = {}
    for kind in set(types):
        if kind not in rope or (rope[kind] is not None and (not isinstance(rope[kind], dict) or rope[kind].get(
                "rope_type", "default") != "default" or not rope[kind].get("rope_theta"))):
            raise ModelLoadError(f"config.json: rope_parameters must give each layer type in use ({kind} here) "
                                 f"default RoPE with a rope_theta, or null for none; got {rope!r}")
        params[kind] = rope[kind]
    thetas = {kind: float(p["rope_theta"]) for kind, p in params.items() if p is not None}
    logit_scale = raw.get("logit_scale")
    return {**raw, "layer_types": types, "rope_parameters": None, "rope_scaling": None,
            "rope_theta": thetas.get(FULL, thetas.get(SLIDING, 10000.0)), "compass_thetas": thetas,
            "logit_scale": 1.0 if logit_scale is None else float(logit_scale)}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Compass sets (``rewrite`` has run)."""
    types, thetas = raw["layer_types"], raw["compass_thetas"]
    sliding = tuple(i for i, t in enumerate(types) if t == SLIDING)
    local = thetas.get(SLIDING)
    return {"architecture": ARCH, "rope_interleaved": False,
            "nope_layers": tuple(i for i, t in enumerate(types) if t not in thetas),
            "sliding_window": window_where_sliding(raw, sliding),
            "sliding_layers": sliding if 0 < len(sliding) < len(types) else None,
            "local_rope_theta": local if local is not None and FULL in thetas and local != thetas[FULL] else None}
