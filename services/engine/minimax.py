"""MiniMax's MiniMax-Text-01 and MiniMax-M1 (``MiniMaxForCausalLM``): Mixtral's experts and attention beside
lightning-attention layers (lightning.py), with a stream of norms, read from its config as transformers reads it.
No torch (the scheduler reads configs).

* ``layer_types`` (or the remote code's ``attn_type_list``: 1 softmax, 0 lightning) says which layers attend
  (Mixtral's attention with RoPE over the whole head) and which run lightning attention (a recurrent state
  per sequence, no KV); by default every other layer from the first attends.
* Each sublayer reads the norm of the stream, which becomes ``alpha * norm + beta * output`` (``*_alpha_factor``,
  ``*_beta_factor`` per kind of sublayer): ``ModelConfig.normed_stream``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import FULL_ATTENTION, LINEAR_ATTENTION, LightningShape

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "MiniMaxForCausalLM"
# transformers' MiniMaxConfig defaults where Mixtral's differ.
DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "rope_theta": 1_000_000.0, "bos_token_id": 1, "eos_token_id": 2,
            "tie_word_embeddings": False, "num_local_experts": 8, "num_experts_per_tok": 2, "block_size": 256}
# Fields transformers' MiniMax does not read (its RoPE spans each head whatever rotary_dim says).
IGNORED = ("rotary_dim", "partial_rotary_factor", "postnorm", "layernorm_full_attention_alpha",
           "layernorm_full_attention_beta", "layernorm_linear_attention_alpha", "layernorm_linear_attention_beta",
           "layernorm_mlp_alpha", "layernorm_mlp_beta")
_BUFFERS = tuple(f".self_attn.{name}" for name in ("slope_rate", "query_decay", "key_decay", "diagonal_decay"))
_FACTORS = ("full_attn_alpha_factor", "full_attn_beta_factor", "linear_attn_alpha_factor", "linear_attn_beta_factor",
            "mlp_alpha_factor", "mlp_beta_factor")


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types as transformers reads them (the remote code's attn_type_list where layer_types is absent)."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None and isinstance(raw.get("attn_type_list"), list):
        types = [FULL_ATTENTION if kind else LINEAR_ATTENTION for kind in raw["attn_type_list"]]
    if types is None:
        types = [FULL_ATTENTION if (i + 1) % 2 else LINEAR_ATTENTION for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or set(types) - {FULL_ATTENTION, LINEAR_ATTENTION}:
        raise ModelLoadError(f"config.json: layer_types must name each of the {layers} layers full_attention or "
                             f"linear_attention, got {types!r}")
    return {**{k: v for k, v in raw.items() if k != "attn_type_list"}, "layer_types": types}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only MiniMax sets (``rewrite`` has run)."""
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or int(raw["hidden_size"]) // heads)
    block = int(raw["block_size"])
    factors = tuple(float(raw.get(name, 1)) for name in _FACTORS)
    if block < 1:
        raise ModelLoadError(f"config.json: block_size must be >= 1, got {block}")
    linear = tuple(i for i, kind in enumerate(raw["layer_types"]) if kind == LINEAR_ATTENTION)
    return {"architecture": ARCH, "normed_stream": factors, "linear_layers": linear,
            "linear_attention": LightningShape(heads, head_dim, block) if linear else None}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Its tensors less the lightning layers' decay buffers transformers saves (lightning.py computes them)."""
    return ((name, tensor) for name, tensor in weights if not name.endswith(_BUFFERS))
