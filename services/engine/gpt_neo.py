"""EleutherAI's GPT-Neo (``GPTNeoForCausalLM``: 125M, 1.3B, 2.7B): what sets it apart from Llama, which it runs as,
read from its config as transformers reads it. No torch at import (the scheduler reads configs).

* GPT-2's block: learned absolute positions (``wpe``), torch's LayerNorms with biases, an ungated MLP with biases
  (``c_fc``, ``c_proj``; gelu_new), the output head tied to the embeddings; q, k and v without biases, the output
  projection with one (``attn.attention.*``, plain ``Linear`` modules).
* Attention scores are not scaled; layers alternate by ``attention_types`` between global attention and local
  attention over the last ``window_size`` keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "GPTNeoForCausalLM"
NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "activation_function": "hidden_act",
         "layer_norm_epsilon": "rms_norm_eps"}
DEFAULTS = {"vocab_size": 50257, "hidden_size": 2048, "max_position_embeddings": 2048, "num_hidden_layers": 24,
            "num_attention_heads": 16, "hidden_act": "gelu_new", "rms_norm_eps": 1e-5, "bos_token_id": 50256,
            "eos_token_id": 50256, "tie_word_embeddings": True, "window_size": 256,
            "attention_types": [[["global", "local"], 12]]}
IGNORED = ("resid_dropout", "embed_dropout", "attention_dropout", "classifier_dropout", "attention_layers",
           "num_key_value_heads", "attention_bias", "mlp_bias", "rope_theta", "rope_scaling", "rope_parameters",
           "sliding_window")
RENAMES = (("transformer.wte.", "model.embed_tokens."), ("transformer.wpe.", "model.embed_positions."),
           ("transformer.h.", "model.layers."), ("transformer.ln_f.", "model.norm."),
           (".attn.attention.out_proj.", ".self_attn.o_proj."), (".attn.attention.", ".self_attn."),
           (".mlp.c_fc.", ".mlp.up_proj."), (".mlp.c_proj.", ".mlp.down_proj."), (".ln_1.", ".input_layernorm."),
           (".ln_2.", ".post_attention_layernorm."))


def _kinds(raw: dict[str, Any]) -> list[str]:
    """Each layer's attention, "global" or "local", from ``attention_types`` (``[[kinds, repeats], ...]``)."""
    try:
        kinds = [kind for group, repeats in raw["attention_types"] for _ in range(int(repeats)) for kind in group]
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json: attention_types must list [kinds, repeats] pairs, got "
                             f"{raw['attention_types']!r}") from exc
    layers = int(raw["num_hidden_layers"])
    if len(kinds) != layers or set(kinds) - {"global", "local"}:
        raise ModelLoadError(f"config.json: attention_types must give each of the {layers} layers global or local "
                             f"attention, got {kinds}")
    return kinds


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    _kinds(raw)
    return {**raw, "num_key_value_heads": raw["num_attention_heads"],
            "intermediate_size": raw.get("intermediate_size") or 4 * int(raw["hidden_size"])}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    local = tuple(i for i, kind in enumerate(_kinds(raw)) if kind == "local")
    window = int(raw["window_size"])
    if local and window < 1:
        raise ModelLoadError(f"config.json: window_size must be >= 1 where layers attend locally, got {window}")
    return {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": True, "attention_bias": False,
            "o_proj_bias": True, "learned_positions": 0, "nope_layers": tuple(range(int(raw["num_hidden_layers"]))),
            "attn_scale": 1.0, "sliding_window": window if local else None,
            "sliding_layers": local if 0 < len(local) < int(raw["num_hidden_layers"]) else None, "architecture": ARCH}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig | None = None,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Its tensors less the causal-mask buffers older checkpoints saved (``attn.attention.bias``, ``masked_bias``),
    which transformers leaves out too."""
    for name, tensor in weights:
        if not name.endswith((".attn.attention.bias", ".attn.attention.masked_bias")):
            yield name, tensor
