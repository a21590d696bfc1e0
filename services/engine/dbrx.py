"""Databricks' DBRX (``DbrxForCausalLM``: dbrx-base, dbrx-instruct): a Mixtral-style mixture of experts under its own
config and tensor names, read as transformers reads them. No torch at import (the scheduler reads configs).

* Its config nests attention's fields (``attn_config``: ``kv_n_heads``, ``clip_qkv``, the older ``rope_theta``) and
  the experts' (``ffn_config``: ``ffn_hidden_size``, ``moe_num_experts``, ``moe_top_k``, ``ffn_act_fn``) under
  GPT-style top-level names (``d_model``, ``n_heads``, ``n_layers``, ``max_seq_len``).
* LayerNorms without biases; q, k and v in one ``Wqkv``, clamped to ``clip_qkv``; no biases anywhere.
* Routing: the top k of a softmax over the router's logits, renormalized (``moe_normalize_expert_weights`` 1, the
  L1 norm), weighed in the model's dtype. The experts are stored stacked, ``[experts x ffn, hidden]`` each: w1
  (gate), v1 (up) and w2 (down, transposed), split per expert as they load.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "DbrxForCausalLM"
NAMES = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
         "max_seq_len": "max_position_embeddings"}
DEFAULTS = {"vocab_size": 32000, "hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 24,
            "max_position_embeddings": 2048, "tie_word_embeddings": False}
IGNORED = ("resid_pdrop", "emb_pdrop", "output_router_logits", "router_aux_loss_coef")
RENAMES = (("transformer.wte.", "model.embed_tokens."), ("transformer.blocks.", "model.layers."),
           ("transformer.norm_f.", "model.norm."), (".norm_attn_norm.norm_1.", ".input_layernorm."),
           (".norm_attn_norm.norm_2.", ".post_attention_layernorm."), (".norm_attn_norm.attn.Wqkv.", ".self_attn.qkv_proj."),
           (".norm_attn_norm.attn.out_proj.", ".self_attn.o_proj."), (".ffn.router.layer.", ".mlp.gate."))
_EXPERTS = {"w1": "gate_proj", "v1": "up_proj", "w2": "down_proj"}


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """Its nested fields as the target's (Mixtral's) top-level ones."""
    attn, ffn = raw.get("attn_config") or {}, raw.get("ffn_config") or {}
    norm = ffn.get("moe_normalize_expert_weights", 1.0)
    if norm is not None and float(norm) != 1.0:
        raise ModelLoadError(f"config.json: ffn_config.moe_normalize_expert_weights is {norm}; DBRX is served with "
                             "its routing weights renormalized to sum to 1 (1), or not at all (null)")
    out = {**raw, "num_key_value_heads": int(attn.get("kv_n_heads", 1)),
           "intermediate_size": int(ffn.get("ffn_hidden_size", 3584)),
           "num_local_experts": int(ffn.get("moe_num_experts", 4)), "num_experts_per_tok": int(ffn.get("moe_top_k", 1)),
           "hidden_act": (ffn.get("ffn_act_fn") or {}).get("name", "silu"), "qkv_clip": attn.get("clip_qkv"),
           "rms_norm_eps": 1e-5}  # torch's LayerNorm's
    if attn.get("rope_theta") is not None and not raw.get("rope_parameters"):
        out["rope_theta"] = attn["rope_theta"]
    return out


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    norm = (raw.get("ffn_config") or {}).get("moe_normalize_expert_weights", 1.0)
    return {"architecture": ARCH, "layer_norm": True, "routing_weights_fp32": False, "norm_topk_prob": norm is not None,
            "clip_qkv": None if raw["qkv_clip"] is None else float(raw["qkv_clip"])}  # (the target refuses clip_qkv)


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Its stacked experts as the per-expert tensors the loader stacks its own way: w1 and v1 split into each
    expert's ``[ffn, hidden]`` gate and up, w2 into each expert's down projection, transposed to ``[hidden, ffn]``."""
    for name, tensor in weights:
        prefix, dot, part = name.rpartition(".ffn.experts.mlp.")
        if not dot or part not in _EXPERTS:
            yield name, tensor
            continue
        experts = tensor.reshape(config.num_experts, -1, tensor.shape[-1])
        for e in range(config.num_experts):
            expert = experts[e].t() if part == "w2" else experts[e]
            yield f"{prefix}.mlp.experts.{e}.{_EXPERTS[part]}.weight", expert.contiguous()
