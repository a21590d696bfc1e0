"""Karpathy's nanochat (``NanoChatForCausalLM``): Llama's block with what sets it apart, read from its config as
transformers reads it. No torch at import (the scheduler reads configs).

* Every norm is an RMSNorm without a weight, the embeddings normed too (before the first layer, by the same norm
  as after the last); q and k normed per head the same way, after RoPE (Llama 4's ``qk_l2_norm``).
* Its RoPE rotates the other way (``rotate_half`` as ``cat(x2, -x1)``): the same as this engine's RoPE of q and k
  with the second half of each head negated, then negated back. RMS norms and dot products cannot tell a sign
  flipped in both q and k, so the loader negates those rows of ``q_proj`` and ``k_proj`` (and a LoRA adapter's B
  for them) once, exactly, and attention is unchanged.
* An ungated MLP (``fc1``, ReLU², ``fc2``); final logits soft-capped (``final_logit_softcapping``, Gemma 2's).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "NanoChatForCausalLM"
# transformers' NanoChatConfig defaults where Llama's differ.
DEFAULTS = {"vocab_size": 50304, "hidden_size": 768, "intermediate_size": 8192, "num_hidden_layers": 12,
            "num_attention_heads": 6, "max_position_embeddings": 2048, "hidden_act": "relu2", "rms_norm_eps": 1e-6,
            "final_logit_softcapping": 15.0, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False}
_ROTATED = tuple(f".self_attn.{p}_proj.{kind}" for p in "qk" for kind in ("weight", "bias"))
# Its MLP's names (weight_names.py renames by them, adapters' names too).
RENAMES = ((".mlp.fc1.", ".mlp.up_proj."), (".mlp.fc2.", ".mlp.down_proj."))


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only nanochat sets."""
    cap = raw.get("final_logit_softcapping", 15.0)
    return {"architecture": ARCH, "norm_affine": False, "embed_norm": True, "qk_l2_norm": True, "mlp_gated": False,
            "final_softcap": float(cap) if cap else None}


def rope_rows(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
              ) -> Iterator[tuple[str, torch.Tensor]]:
    """Its tensors with the second half of each head's rows of q and k negated (its RoPE's direction, above)."""
    half = config.head_dim // 2
    for name, tensor in weights:
        if name.endswith(_ROTATED):
            heads = tensor.reshape(-1, config.head_dim, *tensor.shape[1:]).clone()
            heads[:, half:] = -heads[:, half:]
            tensor = heads.reshape(tensor.shape)
        yield name, tensor
