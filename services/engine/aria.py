"""Rhymes' Aria (``AriaForConditionalGeneration``, and its language model ``AriaTextForCausalLM``): what sets its
language model apart from Mixtral, which it runs as, read from its config as transformers reads it. No torch at
import (the scheduler reads configs).

* Experts in every layer, routed by the softmax of the top ``moe_topk`` of ``moe_num_experts`` logits
  (``mlp.router``), each ``intermediate_size`` wide, beside an ungated shared MLP of ``moe_num_shared_experts``
  experts' width (``mlp.shared_experts``).
* Its experts are stacked as ``x @ w`` operands, ``[experts, in, out]`` (``mlp.experts.fc1`` / ``fc2`` as
  released, ``gate_up_proj`` / ``down_proj`` as transformers saves them): transposed as they load.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

ARCH = "AriaTextForCausalLM"
NAMES = {"moe_num_experts": "num_local_experts", "moe_topk": "num_experts_per_tok"}
DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "bos_token_id": 1,
            "eos_token_id": 2, "pad_token_id": 2, "tie_word_embeddings": False, "num_local_experts": 8,
            "num_experts_per_tok": 2, "moe_num_shared_experts": 2}
IGNORED = ("output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "sliding_window")
RENAMES = ((".mlp.router.", ".mlp.gate."),)
_STACKED = {".mlp.experts.fc1.weight": ".mlp.experts.gate_up_proj", ".mlp.experts.fc2.weight": ".mlp.experts.down_proj",
            ".mlp.experts.gate_up_proj": ".mlp.experts.gate_up_proj", ".mlp.experts.down_proj": ".mlp.experts.down_proj"}


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    return {"moe_routing": "topk_softmax", "shared_expert_gated": False, "sliding_window": None,
            "shared_expert_intermediate_size": int(raw["intermediate_size"]) * int(raw["moe_num_shared_experts"]),
            "architecture": ARCH}


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Its stacked experts as linear weights, ``[experts, out, in]``."""
    for name, tensor in weights:
        suffix = next((s for s in _STACKED if name.endswith(s)), None)
        if suffix is None:
            yield name, tensor
            continue
        yield name[: -len(suffix)] + _STACKED[suffix], tensor.transpose(1, 2)
