"""BigScience's BLOOM (``BloomForCausalLM``: BLOOM-560M to BLOOM-176B, BLOOMZ): what sets it apart from Llama, which it
runs as, read from its config as transformers reads it. No torch at import (the scheduler reads configs).

* ALiBi instead of RoPE: each head adds a linear bias by distance to its scores (``alibi_bias_max`` 8,
  attention.alibi_slopes), which is also why it has no maximum position; a context of its ``seq_length`` (2048 by
  default) is served unless ``--max-model-len`` says otherwise.
* A biased LayerNorm of the token embeddings (``word_embeddings_layernorm``) before the first layer; biased
  LayerNorms and biases on every projection; an ungated MLP four times the hidden size wide with BLOOM's tanh
  GELU; the output head tied to the embeddings.
* One ``query_key_value`` laid out per head, ``[q | k | v]`` rows of each head in turn (``qkv_layout``).
* Refused: norms' outputs as the residual (``apply_residual_connection_post_layernorm``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "BloomForCausalLM"
ALIBI_BIAS_MAX = 8.0  # BLOOM's slopes are MPT's with this maximum (attention.alibi_slopes)
NAMES = {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads", "layer_norm_epsilon": "rms_norm_eps",
         "seq_length": "max_position_embeddings"}
DEFAULTS = {"vocab_size": 250880, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
            "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True,
            "max_position_embeddings": 2048, "apply_residual_connection_post_layernorm": False}
IGNORED = ("hidden_dropout", "attention_dropout", "pretraining_tp", "slow_but_exact", "num_key_value_heads",
           "intermediate_size", "hidden_act", "attention_bias", "mlp_bias", "rope_theta", "rope_scaling",
           "rope_parameters", "max_position_embeddings", "masked_softmax_fusion", "unk_token_id", "offset_alibi",
           "skip_bias_add", "skip_bias_add_qkv", "attention_softmax_in_fp32")
RENAMES = (("transformer.word_embeddings_layernorm.", "model.embed_norm."),
           ("transformer.word_embeddings.", "model.embed_tokens."), ("transformer.h.", "model.layers."),
           ("transformer.ln_f.", "model.norm."), (".self_attention.dense.", ".self_attn.o_proj."),
           (".self_attention.", ".self_attn."), (".mlp.dense_h_to_4h.", ".mlp.up_proj."),
           (".mlp.dense_4h_to_h.", ".mlp.down_proj."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its width (``n_embed`` in older configs, which transformers reads over ``hidden_size``), one key/value head
    per query head, the MLP four times as wide, BLOOM's GELU."""
    if raw["apply_residual_connection_post_layernorm"]:
        raise ModelLoadError("config.json: apply_residual_connection_post_layernorm is set: BLOOM with the norms' "
                             "outputs as the residual is not supported")
    hidden = int(raw.pop("n_embed", None) or raw["hidden_size"])
    return {**raw, "hidden_size": hidden, "num_key_value_heads": raw["num_attention_heads"],
            "intermediate_size": 4 * hidden, "hidden_act": "bloom_gelu"}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    return {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": True, "attention_bias": True,
            "o_proj_bias": True, "qkv_layout": "per_head", "alibi_bias_max": ALIBI_BIAS_MAX, "embed_norm": True,
            "nope_layers": tuple(range(int(raw["num_hidden_layers"]))), "architecture": ARCH}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig | None = None,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors saved from the base model (``h.0...``, as the released checkpoints hold them) under the
    ``transformer.`` prefix the causal LM holds them by."""
    for name, tensor in weights:
        yield ("transformer." + name if name.startswith(("word_embeddings", "h.", "ln_f.")) else name), tensor
