"""MosaicML's MPT (``MptForCausalLM``: MPT-7B, MPT-30B and their instruct, chat and StoryWriter models): what sets it
apart from Llama, which it runs as, read from its config as transformers reads it. No torch at import (the scheduler
reads configs).

* ALiBi instead of RoPE (attention.alibi_slopes with ``alibi_bias_max`` 8), which transformers applies whatever
  ``attn_config`` says; scores scaled by ``softmax_scale`` when set, q, k and v clamped to
  ``clip_qkv`` when set.
* LayerNorms without biases, no bias on any projection, an ungated exact-GELU MLP four times the hidden size wide
  (``up_proj``, ``down_proj``), one ``Wqkv`` of all queries, then all keys, then all values (Llama's fused
  layout), the output head tied to the embeddings.
* Refused, as what transformers' MPT would not run as the checkpoint was trained: learned positions instead of
  ALiBi, ALiBi of another ``alibi_bias_max``, RoPE, grouped or multi-query attention, norms of q and k, prefix-LM
  masks, biases, logit scales and MLPs of another width.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError

ARCH = "MptForCausalLM"
NAMES = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
         "max_seq_len": "max_position_embeddings", "layer_norm_epsilon": "rms_norm_eps"}
DEFAULTS = {"vocab_size": 50368, "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "expansion_ratio": 4,
            "no_bias": True}
IGNORED = ("resid_pdrop", "emb_pdrop", "learned_pos_emb", "init_device", "verbose", "embedding_fraction", "norm_type",
           "init_config", "num_key_value_heads", "intermediate_size", "hidden_act", "attention_bias", "mlp_bias",
           "rope_theta", "rope_scaling", "rope_parameters", "use_cache", "initializer_range", "ffn_config",
           "fc_type", "use_pad_tok_in_ffn")
RENAMES = (("transformer.wte.", "model.embed_tokens."), ("transformer.blocks.", "model.layers."),
           ("transformer.norm_f.", "model.norm."), (".attn.Wqkv.", ".self_attn.qkv_proj."),
           (".attn.out_proj.", ".self_attn.o_proj."), (".norm_1.", ".input_layernorm."),
           (".norm_2.", ".post_attention_layernorm."), (".ffn.", ".mlp."))
# attn_config's fields and their values transformers' MPT runs as given (the model would differ otherwise).
_ATTENTION = {"alibi": True, "qk_ln": False, "prefix_lm": False, "attn_uses_sequence_id": False, "rope": False}
ALIBI_BIAS_MAX = 8.0  # transformers' MPT builds its slopes with this, whatever attn_config says


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """``attn_config`` read into the fields the engine has; what transformers' MPT would not run as trained
    refused, saying which."""
    attn = dict(raw.get("attn_config") or {})
    wrong = {k: attn[k] for k, want in _ATTENTION.items() if k in attn and bool(attn[k]) != want}
    if attn.get("attn_type", "multihead_attention") != "multihead_attention":
        wrong["attn_type"] = attn["attn_type"]
    if float(attn.get("alibi_bias_max") or ALIBI_BIAS_MAX) != ALIBI_BIAS_MAX:
        wrong["alibi_bias_max"] = attn["alibi_bias_max"]
    if wrong:
        raise ModelLoadError(f"config.json: attn_config {wrong} is not supported: transformers' MPT runs ALiBi "
                             "multi-head attention only, its slopes' alibi_bias_max 8 (no learned positions, RoPE, "
                             "grouped queries, q/k norms or prefix-LM masks)")
    if not raw["no_bias"] or raw.get("logit_scale") not in (None, 1, 1.0) or int(raw["expansion_ratio"]) != 4:
        raise ModelLoadError(f"config.json: no_bias {raw['no_bias']}, logit_scale {raw.get('logit_scale')}, "
                             f"expansion_ratio {raw['expansion_ratio']}: transformers' MPT has no biases, no logit "
                             "scale and an MLP four times as wide; only those run as trained")
    hidden = int(raw["hidden_size"])
    out = {k: v for k, v in raw.items() if k not in ("attn_config", "logit_scale", "no_bias", "expansion_ratio")}
    return {**out, "num_key_value_heads": raw["num_attention_heads"], "intermediate_size": 4 * hidden,
            "hidden_act": "gelu", "mpt_attention": attn}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    attn = raw["mpt_attention"]
    out = {"layer_norm": True, "mlp_gated": False, "alibi_bias_max": ALIBI_BIAS_MAX,
           "nope_layers": tuple(range(int(raw["num_hidden_layers"]))), "architecture": ARCH}
    if attn.get("clip_qkv"):
        out["clip_qkv"] = float(attn["clip_qkv"])
    if attn.get("softmax_scale"):
        out["attn_scale"] = float(attn["softmax_scale"])
    return out
