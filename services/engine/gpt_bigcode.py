"""BigCode's GPTBigCode (``GPTBigCodeForCausalLM``: StarCoder, StarCoderBase, SantaCoder, WizardCoder): what sets
it apart from Llama, which it runs as, read from its config as transformers reads it. No torch at import (the
scheduler reads configs).

* GPT-2's block (learned absolute positions ``wpe``, LayerNorms with biases, biases on every projection, an ungated
  MLP: ``c_fc``, ``c_proj``, tanh GELU by default, ``n_inner`` wide) with nn.Linear weights, not Conv1D.
* Multi-query attention (``multi_query``, the default): one key/value head, ``c_attn`` holding every query head,
  then the key, then the value, as the engine's fused projection holds them; without it, ``[q | k | v]`` of each
  head in turn (``qkv_layout`` per_head, split as it loads).
* Scores scaled by 1/sqrt(head width), or not at all without ``scale_attn_weights``; the output head tied.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError
from services.engine import gpt2

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "GPTBigCodeForCausalLM"
NAMES = gpt2.NAMES  # GPT-2's field names
DEFAULTS = {"vocab_size": 50257, "hidden_size": 768, "max_position_embeddings": 1024, "num_hidden_layers": 12,
            "num_attention_heads": 12, "hidden_act": "gelu_pytorch_tanh", "rms_norm_eps": 1e-5,
            "bos_token_id": 50256, "eos_token_id": 50256, "tie_word_embeddings": True, "scale_attn_weights": True,
            "multi_query": True}
IGNORED = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "n_ctx", "num_key_value_heads", "attention_bias", "mlp_bias",
           "rope_theta", "rope_scaling", "rope_parameters", "attention_softmax_in_fp32",
           "scale_attention_softmax_in_fp32", "inference_runner", "max_batch_size", "max_sequence_length",
           "pad_key_length", "pre_allocate_kv_cache")
RENAMES = (("transformer.wte.", "model.embed_tokens."), ("transformer.wpe.", "model.embed_positions."),
           ("transformer.h.", "model.layers."), ("transformer.ln_f.", "model.norm."),
           (".attn.c_attn.", ".self_attn.qkv_proj."), (".attn.c_proj.", ".self_attn.o_proj."),
           (".attn.", ".self_attn."), (".mlp.c_fc.", ".mlp.up_proj."), (".mlp.c_proj.", ".mlp.down_proj."),
           (".ln_1.", ".input_layernorm."), (".ln_2.", ".post_attention_layernorm."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("add_cross_attention"):
        raise ModelLoadError("config.json: add_cross_attention is set: GPTBigCode with cross-attention is not "
                             "supported")
    heads, hidden = int(raw["num_attention_heads"]), int(raw["hidden_size"])
    return {**raw, "num_key_value_heads": 1 if raw["multi_query"] else heads,
            "intermediate_size": raw.get("intermediate_size") or 4 * hidden}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    out = {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": True, "attention_bias": True,
           "o_proj_bias": True, "learned_positions": 0, "nope_layers": tuple(range(int(raw["num_hidden_layers"]))),
           "qkv_layout": None if raw["multi_query"] else "per_head", "architecture": ARCH}
    if not raw["scale_attn_weights"]:
        out["attn_scale"] = 1.0
    return out


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as released (``gpt2.as_released``); without multi-query attention, ``c_attn`` under
    the name the per-head split reads."""
    multi_query = config.qkv_layout is None
    for name, tensor in gpt2.as_released(weights):
        yield (name if multi_query else name.replace(".attn.c_attn.", ".attn.query_key_value.")), tensor
