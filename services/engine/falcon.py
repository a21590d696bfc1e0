"""TII's Falcon (``FalconForCausalLM``: Falcon-7B, -40B, -180B, Falcon 2 11B, Falcon-RW): what sets it apart from Llama, which it
runs as, read from its config as transformers reads it. No torch at import (the scheduler reads configs).

* torch's LayerNorms with biases; biases on every projection only with ``bias`` (none by default); an ungated MLP
  (``dense_h_to_4h``, ``dense_4h_to_h``: ``ffn_hidden_size`` wide, four times the hidden size by default; exact
  GELU by default); RoPE over whole heads; the output head tied to the embeddings by default.
* Attention and the MLP side by side (``parallel_attn``, and always with ``new_decoder_architecture``), their
  outputs summed before they join the stream: on one norm (Falcon-7B), or on norms of their own, ``ln_attn`` and
  ``ln_mlp`` (the new architecture of Falcon-40B and -180B, ``num_ln_in_parallel_attn`` 2, its default there).
  Without either, a pre-norm block.
* One fused ``query_key_value`` whose layout follows the architecture (``qkv_layout``, split as it loads): each
  key/value head's queries, then its key and value (new architecture); all queries, then one key and one value
  (``multi_query``); else ``[q | k | v]`` of each head in turn.
* Falcon-RW: ALiBi instead of RoPE, as transformers computes it: its slopes, and their products by the key's
  absolute position, rounded to bf16, then over the square root of the head width (``alibi_bf16``; BLOOM's and
  MPT's exact bias differs).
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError

ARCH = "FalconForCausalLM"
NAMES = {"layer_norm_epsilon": "rms_norm_eps", "ffn_hidden_size": "intermediate_size", "activation": "hidden_act",
         "bias": "falcon_bias", "n_embed": "hidden_size"}
DEFAULTS = {"vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
            "rms_norm_eps": 1e-5, "hidden_act": "gelu", "rope_theta": 10000.0, "max_position_embeddings": 2048,
            "bos_token_id": 11, "eos_token_id": 11, "tie_word_embeddings": True, "falcon_bias": False,
            "new_decoder_architecture": False, "multi_query": True, "parallel_attn": True}
IGNORED = ("hidden_dropout", "attention_dropout", "num_key_value_heads", "attention_bias", "mlp_bias")
RENAMES = (("transformer.word_embeddings.", "model.embed_tokens."), ("transformer.h.", "model.layers."),
           ("transformer.ln_f.", "model.norm."), (".self_attention.dense.", ".self_attn.o_proj."),
           (".self_attention.", ".self_attn."), (".mlp.dense_h_to_4h.", ".mlp.up_proj."),
           (".mlp.dense_4h_to_h.", ".mlp.down_proj."), (".ln_attn.", ".input_layernorm."),
           (".ln_mlp.", ".post_attention_layernorm."))


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its key/value heads and MLP width as transformers derives them."""
    heads, new = int(raw["num_attention_heads"]), bool(raw["new_decoder_architecture"])
    kv_heads = int(raw.get("num_kv_heads") or heads) if new or not raw["multi_query"] else 1
    width = raw.get("intermediate_size") or 4 * int(raw["hidden_size"])
    two_norms = new and int(raw.get("num_ln_in_parallel_attn") or 2) == 2
    if new and not raw["parallel_attn"] and not two_norms:
        raise ModelLoadError("config.json: new_decoder_architecture with one norm and parallel_attn false has no "
                             "input for its MLP in transformers; set parallel_attn or num_ln_in_parallel_attn 2")
    return {**raw, "num_key_value_heads": kv_heads, "intermediate_size": width, "falcon_two_norms": two_norms}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    biased = bool(raw["falcon_bias"])
    return {"layer_norm": True, "norm_bias": True, "mlp_gated": False, "mlp_bias": biased, "attention_bias": biased,
            "o_proj_bias": biased, "parallel_block": bool(raw["new_decoder_architecture"] or raw["parallel_attn"]),
            "parallel_mlp_norm": raw["falcon_two_norms"], "qkv_layout": _qkv_layout(raw), "architecture": ARCH,
            **(_alibi_fields(int(raw["num_hidden_layers"])) if raw.get("alibi") else {})}


def _alibi_fields(layers: int) -> dict[str, Any]:
    """Falcon-RW: ALiBi (BLOOM's slopes) as transformers computes it, in bf16, instead of RoPE."""
    return {"alibi_bias_max": 8.0, "alibi_bf16": True, "nope_layers": tuple(range(layers))}


def _qkv_layout(raw: dict[str, Any]) -> str:
    return "grouped" if raw["new_decoder_architecture"] else "multi_query" if raw["multi_query"] else "per_head"

