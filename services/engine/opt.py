"""Meta's OPT (``OPTForCausalLM``: OPT-125M to OPT-66B, the models of FastServe's evaluation): what sets it apart from
Llama, which it runs as, read from its config as transformers reads it. No torch at import (the scheduler reads
configs).

* Learned absolute positions (``embed_positions``, indexed from 2) added to the token embeddings; no RoPE.
* torch's LayerNorms with biases (``self_attn_layer_norm`` before attention, each layer's ``final_layer_norm``
  before its MLP, the decoder's ``final_layer_norm`` at the end); an ungated ReLU MLP (``fc1``, ``fc2``); biases on
  every projection with ``enable_bias`` (the default); the output head tied to the embeddings.
* Refused: norms after the sublayers (``do_layer_norm_before`` false: OPT-350M), embeddings of another width
  projected in and out (``word_embed_proj_dim``: OPT-350M too), norms without weights, no final norm.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "OPTForCausalLM"
POSITION_OFFSET = 2  # OPT's learned positions start at index 2 of their table (the first two are padding's)
NAMES = {"ffn_dim": "intermediate_size", "activation_function": "hidden_act"}
DEFAULTS = {"vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "intermediate_size": 3072,
            "num_attention_heads": 12, "hidden_act": "relu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
            "bos_token_id": 2, "eos_token_id": 2, "tie_word_embeddings": True, "enable_bias": True,
            "do_layer_norm_before": True}
IGNORED = ("dropout", "attention_dropout", "layerdrop", "init_std", "num_key_value_heads", "attention_bias",
           "mlp_bias", "rms_norm_eps", "layer_norm_eps", "rope_theta", "rope_scaling", "rope_parameters")
RENAMES = (("model.decoder.embed_tokens.", "model.embed_tokens."),
           ("model.decoder.embed_positions.", "model.embed_positions."),
           ("model.decoder.final_layer_norm.", "model.norm."), ("model.decoder.layers.", "model.layers."),
           (".self_attn.out_proj.", ".self_attn.o_proj."), (".self_attn_layer_norm.", ".input_layernorm."),
           (".final_layer_norm.", ".post_attention_layernorm."), (".fc1.", ".mlp.up_proj."),
           (".fc2.", ".mlp.down_proj."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """OPT's options the engine does not build refused, saying which; one key/value head per query head."""
    hidden = int(raw["hidden_size"])
    if not raw["do_layer_norm_before"]:
        raise ModelLoadError("config.json: do_layer_norm_before is false (OPT-350M): norms after attention and the "
                             "MLP are not supported")
    if int(raw.get("word_embed_proj_dim") or hidden) != hidden:
        raise ModelLoadError(f"config.json: word_embed_proj_dim {raw['word_embed_proj_dim']} differs from "
                             f"hidden_size {hidden} (OPT-350M): embeddings projected in and out are not supported")
    if raw.get("layer_norm_elementwise_affine") is False or raw.get("_remove_final_layer_norm"):
        raise ModelLoadError("config.json: layer_norm_elementwise_affine false or _remove_final_layer_norm set: OPT "
                             "without norm weights or without its final norm is not supported")
    return {**raw, "num_key_value_heads": raw["num_attention_heads"], "rms_norm_eps": 1e-5}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    biased = bool(raw["enable_bias"])
    return {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": biased, "attention_bias": biased,
            "o_proj_bias": biased, "learned_positions": POSITION_OFFSET,
            "nope_layers": tuple(range(int(raw["num_hidden_layers"]))), "architecture": ARCH}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig | None = None,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors saved from the base model (``decoder.layers...``, as the released checkpoints hold them) under the
    ``model.`` prefix the causal LM holds them by."""
    for name, tensor in weights:
        yield ("model." + name if name.startswith("decoder.") else name), tensor
