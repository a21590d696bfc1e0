"""OpenAI's GPT-2 (``GPT2LMHeadModel``: GPT-2 small to XL, DistilGPT2, and GPT-2-shaped models): what sets it apart
from Llama, which it runs as, read from its config as transformers reads it. No torch at import (the scheduler reads
configs).

* Learned absolute positions (``wpe``) added to the token embeddings; no RoPE.
* torch's LayerNorms with biases (``ln_1``, ``ln_2``, ``ln_f``); biases on every projection; an ungated MLP
  (``c_fc``, ``c_proj``; gelu_new), ``n_inner`` wide (four times the hidden size by default); the output head
  tied to the embeddings.
* Its projections are ``Conv1D`` modules, weights stored ``[in, out]`` (``checkpoint_weights`` transposes them);
  ``c_attn`` holds q, k and v one after another, as the engine's fused projection does.
* Attention scores scaled by 1/sqrt(head width), or not at all without ``scale_attn_weights``; scaled by layer
  (``scale_attn_by_inverse_layer_idx``) and cross-attention are refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "GPT2LMHeadModel"
NAMES = {"n_embd": "hidden_size", "n_positions": "max_position_embeddings", "n_head": "num_attention_heads",
         "n_layer": "num_hidden_layers", "n_inner": "intermediate_size", "activation_function": "hidden_act",
         "layer_norm_epsilon": "rms_norm_eps"}
DEFAULTS = {"vocab_size": 50257, "hidden_size": 768, "max_position_embeddings": 1024, "num_hidden_layers": 12,
            "num_attention_heads": 12, "hidden_act": "gelu_new", "rms_norm_eps": 1e-5, "bos_token_id": 50256,
            "eos_token_id": 50256, "tie_word_embeddings": True, "scale_attn_weights": True}
IGNORED = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "n_ctx", "num_key_value_heads", "attention_bias", "mlp_bias",
           "rope_theta", "rope_scaling", "rope_parameters", "reorder_and_upcast_attn")
RENAMES = (("transformer.wte.", "model.embed_tokens."), ("transformer.wpe.", "model.embed_positions."),
           ("transformer.h.", "model.layers."), ("transformer.ln_f.", "model.norm."),
           (".attn.c_attn.", ".self_attn.qkv_proj."), (".attn.c_proj.", ".self_attn.o_proj."),
           (".mlp.c_fc.", ".mlp.up_proj."), (".mlp.c_proj.", ".mlp.down_proj."), (".ln_1.", ".input_layernorm."),
           (".ln_2.", ".post_attention_layernorm."))
CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("scale_attn_by_inverse_layer_idx") or raw.get("add_cross_attention"):
        raise ModelLoadError("config.json: scale_attn_by_inverse_layer_idx or add_cross_attention is set: GPT-2 "
                             "with scores scaled by layer or with cross-attention is not supported")
    hidden = int(raw["hidden_size"])
    return {**raw, "num_key_value_heads": raw["num_attention_heads"],
            "intermediate_size": raw.get("intermediate_size") or 4 * hidden}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    out = {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": True, "attention_bias": True,
           "o_proj_bias": True, "learned_positions": 0, "nope_layers": tuple(range(int(raw["num_hidden_layers"]))),
           "architecture": ARCH}
    if not raw["scale_attn_weights"]:
        out["attn_scale"] = 1.0
    return out


def as_released(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A GPT-2-style checkpoint's tensors (GPT-2's, GPT-J's, GPTBigCode's) under ``transformer.``, where the
    released ones were saved from the base model (``h.0...``), less the causal-mask buffers older code saved
    (``attn.bias``, ``attn.masked_bias``), which transformers leaves out too."""
    for name, tensor in weights:
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        yield ("transformer." + name if name.startswith(("wte.", "wpe.", "h.", "ln_f.")) else name), tensor


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig | None = None,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as the model holds them (``as_released``), the Conv1D weights transposed to
    ``[out, in]``."""
    for name, tensor in as_released(weights):
        yield name, (tensor.t().contiguous() if name.endswith(CONV1D) else tensor)
