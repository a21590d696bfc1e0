"""Google's Gemma 4 text model (``Gemma4ForCausalLM``; the language model of ``Gemma4ForConditionalGeneration``,
vision_language.py): what sets it apart, read from its config as transformers reads it. No torch (the scheduler
reads configs); the layers are in gemma4_layer.py.

* Gemma 3's block (four norms a layer, GELU-tanh gating, embeddings scaled by sqrt(hidden_size) rounded to the
  weights' dtype, sliding layers with a RoPE of their own) with plain RMSNorm weights (w, not 1 + w) applied in
  fp32, per-head norms of q and k, and an unscaled RMSNorm of v; scores are not scaled (the norms set their size).
* Full-attention layers have heads of their own width (``global_head_dim``; saved configs name it per layer in
  ``per_layer_config``) and, with ``attention_k_eq_v``, their own KV head count (``num_global_key_value_heads``)
  and no value projection: a value is its key's projection before the key's norm and RoPE. Their RoPE is
  "proportional" (rope.py) over the whole wide head.
* The last ``num_kv_shared_layers`` layers keep no KV: each reads the keys and values of the last earlier layer
  of its type (transformers' "store" layers); with ``use_double_wide_mlp`` their MLPs are twice as wide. No later
  token reads what they compute: they run the rows sampled from only (``ModelConfig.kv_free_tail``).
* Per-layer inputs (``hidden_size_per_layer_input`` > 0): a second embedding table gives each token a small
  vector per layer, averaged with a projection of its embedding; each layer gates its output by it, projects it
  back and adds it, normed, to the stream.
* ``enable_moe_block``: beside each layer's dense MLP, experts read the stream (their own norms before and after;
  a router over the normed stream, softmax, top-k renormalized, times a learned scale per expert); both outputs
  normed, summed, normed again.
* Each layer's output is scaled by a learned ``layer_scalar``; the final logits may be soft-capped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.common.errors import ModelLoadError
from services.engine.layer_types import FULL as _FULL
from services.engine.layer_types import SLIDING as _SLIDING
from services.engine.layer_types import attention_types, rope_by_type

ARCH = "Gemma4ForCausalLM"
# transformers' Gemma4TextConfig defaults.
DEFAULTS = {"vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
            "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True,
            "sliding_window": 512}
# Qwen3's window fields, which Gemma 4 does not read (its layer_types say which layers slide).
IGNORED = ("use_sliding_window", "max_window_layers")
_ROPE = {_SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
         _FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
_LAYER_OVERRIDES = ("head_dim", "num_key_value_heads")


@dataclass(frozen=True)
class Gemma4Shape:
    """What a Gemma 4 model adds to the decoder ``ModelConfig`` describes (its full layers' wider heads are
    ``ModelConfig.full_layer_heads``)."""

    k_eq_v: bool  # full-attention layers take their values from the key projection (no v_proj)
    kv_source: tuple[int, ...]  # each layer's KV: its own index, or the earlier layer whose KV it reads
    per_layer_input: int  # hidden_size_per_layer_input; 0: no per-layer inputs
    per_layer_vocab: int  # vocab_size_per_layer_input
    double_wide_mlp: bool  # the KV-sharing layers' MLPs are twice intermediate_size wide
    num_experts: int  # 0: no experts beside the MLP
    top_k: int
    moe_intermediate: int

    def shares_kv(self, layer: int) -> bool:
        return self.kv_source[layer] != layer

    def mlp_width(self, layer: int, intermediate: int) -> int:
        return intermediate * (2 if self.double_wide_mlp and self.shares_kv(layer) else 1)


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types (default: every sixth full, the last always full, as transformers forces it) and per-type
    RoPE with transformers' defaults, read by the target as LFM3's are."""
    layers = int(raw["num_hidden_layers"])
    types = attention_types(raw.get("layer_types") or [_SLIDING if (i + 1) % 6 else _FULL for i in range(layers)],
                            layers)
    types = [*types[:-1], _FULL]
    rope = rope_by_type(raw, _ROPE, "Gemma 4")
    if raw.get("use_bidirectional_attention") == "all":
        raise ModelLoadError("config.json: use_bidirectional_attention is 'all' (an encoder); only causal "
                             "attention is served")
    return {**raw, "layer_types": types, "rope_parameters": rope, "use_sliding_window": _SLIDING in types,
            "use_bidirectional_attention": None}  # "vision": image tokens only, and no image reaches the text model


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Gemma 4 sets (``rewrite`` has run)."""
    types, layers = raw["layer_types"], int(raw["num_hidden_layers"])
    full_dim, full_kv = _full_heads(raw, types)
    shared = int(raw.get("num_kv_shared_layers") or 0)
    if not 0 <= shared < layers:  # (all of them sharing: transformers' assistant models, run beside a target)
        raise ModelLoadError(f"config.json: num_kv_shared_layers must be in 0..{layers - 1}, got {shared}")
    experts = int(raw.get("num_experts") or 0) if raw.get("enable_moe_block") else 0
    shape = Gemma4Shape(
        k_eq_v=bool(raw.get("attention_k_eq_v")),
        kv_source=kv_sources(types, shared), per_layer_input=int(raw.get("hidden_size_per_layer_input", 256) or 0),
        per_layer_vocab=int(raw.get("vocab_size_per_layer_input") or 262144),
        double_wide_mlp=bool(raw.get("use_double_wide_mlp")), num_experts=experts,
        top_k=int(raw.get("top_k_experts") or 0) if experts else 0,
        moe_intermediate=int(raw.get("moe_intermediate_size") or 0) if experts else 0)
    if experts and not (0 < shape.top_k <= experts and shape.moe_intermediate > 0):
        raise ModelLoadError(f"config.json: enable_moe_block needs top_k_experts in 1..num_experts ({experts}) and "
                             f"moe_intermediate_size > 0, got {raw.get('top_k_experts')!r} and "
                             f"{raw.get('moe_intermediate_size')!r}")
    if int(raw["num_attention_heads"]) % full_kv:
        raise ModelLoadError(f"config.json: the full-attention layers' {full_kv} KV heads must divide "
                             f"num_attention_heads ({raw['num_attention_heads']})")
    if shape.per_layer_input < 0:
        raise ModelLoadError(f"config.json: hidden_size_per_layer_input must be >= 0, got {shape.per_layer_input}")
    if shape.per_layer_input and shape.per_layer_vocab < int(raw["vocab_size"]):
        raise ModelLoadError(f"config.json: vocab_size_per_layer_input ({shape.per_layer_vocab}) must cover "
                             f"vocab_size ({raw['vocab_size']}): every token looks up its per-layer inputs")
    softcap = raw.get("final_logit_softcapping")
    return {"gemma4": shape, "full_layer_heads": (full_kv, full_dim), "architecture": ARCH, "sandwich_norms": True,
            "attn_scale": 1.0,
            "embed_scale": float(raw["hidden_size"]) ** 0.5, "embed_scale_rounded": True,
            "final_softcap": None if softcap is None else float(softcap),
            "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
            "local_rope_theta": float(raw["rope_parameters"][_SLIDING].get("rope_theta") or 10000.0)
            if _SLIDING in types else None}


def _full_heads(raw: dict[str, Any], types: list[str]) -> tuple[int, int]:
    """The full-attention layers' (head_dim, KV heads): from ``per_layer_config`` as transformers saves it, else
    from ``global_head_dim`` (default 512) and, with ``attention_k_eq_v``, ``num_global_key_value_heads``."""
    head_dim, kv_heads = int(raw["head_dim"]), int(raw.get("num_key_value_heads") or raw["num_attention_heads"])
    per_layer = raw.get("per_layer_config")
    if per_layer is None:
        full_kv = raw.get("num_global_key_value_heads") if raw.get("attention_k_eq_v") else None
        return int(raw.get("global_head_dim") or 512), int(full_kv or kv_heads)
    try:  # keyed by layer index as a string, zero-padded as transformers saves it ("05")
        per_layer = {int(k): v for k, v in per_layer.items()}
    except (AttributeError, TypeError, ValueError):
        raise ModelLoadError(f"config.json: per_layer_config must map layer indices to overrides, got "
                             f"{per_layer!r}") from None
    found: dict[str, set[tuple[int, int]]] = {_FULL: set(), _SLIDING: set()}
    for i, kind in enumerate(types):
        over = per_layer.get(i) or {}
        if not isinstance(over, dict) or set(over) - set(_LAYER_OVERRIDES):
            raise ModelLoadError(f"config.json: per_layer_config of layer {i} may set {', '.join(_LAYER_OVERRIDES)} "
                                 f"only, got {over!r}")
        found[kind].add((int(over.get("head_dim", head_dim)), int(over.get("num_key_value_heads", kv_heads))))
    if found[_SLIDING] - {(head_dim, kv_heads)} or len(found[_FULL]) > 1:
        raise ModelLoadError("config.json: per_layer_config must give every full_attention layer the same head_dim "
                             "and num_key_value_heads and leave the sliding layers' as the model's; got "
                             f"{sorted(found[_FULL] | found[_SLIDING])}")
    return next(iter(found[_FULL]))


def kv_sources(types: list[str], shared: int) -> tuple[int, ...]:
    """Each layer's KV: its own, or in the last ``shared`` layers the last earlier layer of the same type."""
    first = len(types) - shared
    sources = list(range(first))
    for i in range(first, len(types)):
        producers = [j for j in range(first) if types[j] == types[i]]
        if not producers:
            raise ModelLoadError(f"config.json: layer {i} ({types[i]}) shares KV, but no layer before the "
                                 f"{shared} KV-sharing ones is of its type")
        sources.append(producers[-1])
    return tuple(sources)
