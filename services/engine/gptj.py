"""EleutherAI's GPT-J (``GPTJForCausalLM``: GPT-J-6B, the MLPerf inference model, and GPT-J-shaped models): what sets
it apart from Llama, which it runs as, read from its config as transformers reads it. No torch at import (the
scheduler reads configs).

* RoPE over the first ``rotary_dim`` features of each head (64 of GPT-J-6B's 256; all of them when unset), rotating
  interleaved pairs (``rotate_every_two``): the loader reorders the q and k rows it rotates (rope.py).
* Attention and the MLP side by side on one LayerNorm (``ln_1``, with a bias), their outputs summed before they
  join the stream; q, k, v and out projections without biases; an ungated gelu_new MLP (``fc_in``, ``fc_out``)
  with biases, ``n_inner`` wide (four times the hidden size by default); an untied output head with a bias.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.engine import gpt2

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "GPTJForCausalLM"
NAMES = gpt2.NAMES  # GPT-2's field names
DEFAULTS = {"vocab_size": 50400, "hidden_size": 4096, "max_position_embeddings": 2048, "num_hidden_layers": 28,
            "num_attention_heads": 16, "rotary_dim": 64, "hidden_act": "gelu_new", "rms_norm_eps": 1e-5,
            "bos_token_id": 50256, "eos_token_id": 50256, "tie_word_embeddings": False}
IGNORED = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "n_ctx", "num_key_value_heads", "attention_bias", "mlp_bias",
           "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "head_dim")
# The first for adapters' names (checkpoint_weights renames the checkpoint's before RoPE's reordering reads them).
RENAMES = ((".attn.", ".self_attn."), ("transformer.wte.", "model.embed_tokens."), ("transformer.h.", "model.layers."),
           ("transformer.ln_f.", "model.norm."), (".self_attn.out_proj.", ".self_attn.o_proj."),
           (".mlp.fc_in.", ".mlp.up_proj."), (".mlp.fc_out.", ".mlp.down_proj."), (".ln_1.", ".input_layernorm."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its rotary width kept aside (Llama, which it runs as, refuses partial RoPE: ``fields`` sets it)."""
    heads, hidden = int(raw["num_attention_heads"]), int(raw["hidden_size"])
    out = {k: v for k, v in raw.items() if k != "rotary_dim"}
    return {**out, "num_key_value_heads": heads, "intermediate_size": raw.get("intermediate_size") or 4 * hidden,
            "rope_theta": 10000.0, "gptj_rotary_dim": raw.get("rotary_dim") or hidden // heads}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    head_dim = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    return {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": True, "attention_bias": False,
            "o_proj_bias": False, "lm_head_bias": True, "parallel_block": True, "rope_interleaved": True,
            "partial_rotary_factor": int(raw["gptj_rotary_dim"]) / head_dim, "architecture": ARCH}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig | None = None,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as released (``gpt2.as_released``), attention's under the name RoPE's reordering
    reads (``self_attn``)."""
    for name, tensor in gpt2.as_released(weights):
        yield name.replace(".attn.", ".self_attn."), tensor
