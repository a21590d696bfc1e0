"""IBM's Granite with sliding windows and attention sinks (``GraniteSWAForCausalLM``, and over GraniteMoeShared's
experts ``GraniteMoeSWAForCausalLM``): what it adds to Granite, read from its config as transformers reads it. No
torch (the scheduler reads configs).

* Each layer attends in full or within ``sliding_window`` tokens as ``layer_types`` says (default: every fourth
  layer from the first in full, the rest sliding).
* Each head has a learned sink: its output is scaled by ``sigmoid(logsumexp(scores) - sink)``, which is a softmax
  with one more logit, the sink (GPT-OSS's ``s_aux``): ``ModelConfig.attention_sinks``.
* ``layer_rope_theta`` gives each layer its RoPE base, 0 for none. One base for the full layers (the model's)
  and one for the sliding layers (``local_rope_theta``) is what the engine computes; other mixes are refused.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError

SWA = "GraniteSWAForCausalLM"
MOE_SWA = "GraniteMoeSWAForCausalLM"
_FULL, _SLIDING = "full_attention", "sliding_attention"
# transformers' GraniteSWAConfig defaults where they differ from Granite's (granite-swash-2b's shape).
SWA_DEFAULTS = {"vocab_size": 100352, "hidden_size": 2560, "intermediate_size": 8192, "num_hidden_layers": 24,
                "num_attention_heads": 20, "num_key_value_heads": 4, "max_position_embeddings": 8192,
                "rms_norm_eps": 1e-5, "bos_token_id": 100257, "eos_token_id": 100257, "tie_word_embeddings": True,
                "sliding_window": 128}
MOE_SWA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                    "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "num_local_experts": 8,
                    "num_experts_per_tok": 2, "sliding_window": 128}


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types as transformers defaults them (full every fourth layer, from layer 0)."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or [_FULL if i % 4 == 0 else _SLIDING for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in (_FULL, _SLIDING) for t in types):
        raise ModelLoadError(f"config.json: layer_types must list {_FULL} or {_SLIDING} for each of its {layers} "
                             f"layers, got {types!r}")
    return {**raw, "layer_types": types}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """Sinks in every layer, and the layers' RoPE bases from ``layer_rope_theta`` (``rewrite`` has run; absent:
    the model's base in every layer)."""
    types, base = raw["layer_types"], _base_theta(raw)
    thetas = raw.get("layer_rope_theta") or [base] * len(types)
    if not isinstance(thetas, list) or len(thetas) != len(types):
        raise ModelLoadError(f"config.json: layer_rope_theta must list a RoPE base (0: none) for each of its "
                             f"{len(types)} layers, got {thetas!r}")
    full = {float(t) for t, kind in zip(thetas, types, strict=True) if t and kind == _FULL}
    sliding = {float(t) for t, kind in zip(thetas, types, strict=True) if t and kind == _SLIDING}
    if len(full) > 1 or len(sliding) > 1:
        raise ModelLoadError(f"config.json: layer_rope_theta gives the full layers the bases {sorted(full)} and the "
                             f"sliding ones {sorted(sliding)}; one base for each kind is supported")
    out: dict[str, Any] = {"attention_sinks": True, "sinks_scale_output": True, "nope_layers": tuple(i for i, t in enumerate(thetas) if not t)}
    theta = full.pop() if full else base
    if theta != base:
        out["rope_theta"] = theta
    if sliding and sliding != {theta}:
        if raw.get("rope_scaling") or (raw.get("rope_parameters") or {}).get("rope_type", "default") != "default":
            raise ModelLoadError("config.json: sliding layers with a RoPE base of their own and a scaled RoPE are "
                                 "not supported (the sliding layers' frequencies would be unscaled here)")
        out["local_rope_theta"] = sliding.pop()
    return out


def _base_theta(raw: dict[str, Any]) -> float:
    """The model's RoPE base as transformers reads it (rope_parameters', else rope_theta, else 10000)."""
    params = raw.get("rope_parameters") or {}
    return float(params.get("rope_theta") or raw.get("rope_theta") or 10000.0)
