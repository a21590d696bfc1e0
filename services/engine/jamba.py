"""AI21's Jamba (Jamba v0.1, Jamba 1.5 / 1.6 / 1.7 Mini and Large: ``JambaForCausalLM``): what sets it apart, read
from its config as transformers reads it. No torch (the scheduler reads configs).

* One layer in every ``attn_layer_period`` (at ``attn_layer_offset``) attends, without positions or biases; the
  others run Mamba (mamba1.py): a selective state space per channel, its dt, B and C RMS-normed.
* One layer in every ``expert_layer_period`` (at ``expert_layer_offset``) routes to ``num_experts`` SwiGLU experts
  as wide as the MLP: the top k of a softmax in fp32, not renormalized, weighed in the model's dtype.
* Its MLP, router and second norm are ``feed_forward``, ``feed_forward.router`` and ``pre_ff_layernorm``, its
  final norm ``final_layernorm`` (weight_names.py).
"""

from __future__ import annotations

import math
from typing import Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import Mamba1Shape

ARCH = "JambaForCausalLM"
DEFAULTS = {"vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2}
# Fields transformers' Jamba does not read as Llama would (its attention has no biases and no positions), and
# its options for kernels and training.
IGNORED = ("attention_bias", "sliding_window", "rope_theta", "rope_scaling", "rope_parameters", "use_mamba_kernels",
           "use_mambapy", "use_associative_scan", "router_aux_loss_coef", "output_router_logits")
RENAMES = ((".feed_forward.router.", ".mlp.gate."), (".feed_forward.", ".mlp."),
           (".pre_ff_layernorm.", ".post_attention_layernorm."), ("model.final_layernorm.", "model.norm."))


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only Jamba sets: its Mamba layers and their shape, its expert layers, and
    attention without positions in the rest."""
    layers, hidden = int(raw["num_hidden_layers"]), int(raw["hidden_size"])
    attention = _every(raw, "attn_layer_period", 8, "attn_layer_offset", 4)
    routed = _every(raw, "expert_layer_period", 2, "expert_layer_offset", 1)
    rank = raw.get("mamba_dt_rank", "auto")
    shape = Mamba1Shape(intermediate=int(raw.get("mamba_expand") or 2) * hidden,
                        state_size=int(raw.get("mamba_d_state") or 16), conv_kernel=int(raw.get("mamba_d_conv") or 4),
                        dt_rank=math.ceil(hidden / 16) if rank in (None, "auto") else int(rank),
                        conv_bias=bool(raw.get("mamba_conv_bias", True)), proj_bias=bool(raw.get("mamba_proj_bias")))
    if shape.conv_kernel < 2 or min(shape.state_size, shape.dt_rank, shape.intermediate) < 1:
        raise ModelLoadError(f"config.json: Mamba layers need a convolution of at least 2 ({shape.conv_kernel}) and "
                             f"positive widths (state {shape.state_size}, dt rank {shape.dt_rank})")
    experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 16)
    moe = tuple(i for i in range(layers) if routed(i)) if experts > 1 else ()
    return {"linear_layers": tuple(i for i in range(layers) if not attention(i)), "linear_attention": shape,
            "nope_layers": tuple(range(layers)), "architecture": ARCH,
            **({"num_experts": experts, "num_experts_per_tok": int(raw.get("num_experts_per_tok") or 2),
                "moe_intermediate_size": int(raw["intermediate_size"]), "moe_layers": moe, "norm_topk_prob": False,
                "routing_weights_fp32": False} if moe else {})}


def _every(raw: dict[str, Any], period_name: str, period: int, offset_name: str, offset: int):
    """Whether a layer is one of every ``period``-th, from ``offset``, as the config names them."""
    period, offset = int(raw.get(period_name) or period), int(raw.get(offset_name, offset) or 0)
    if not 0 <= offset < period:
        raise ModelLoadError(f"config.json: {offset_name} ({offset}) must be below {period_name} ({period})")
    return lambda i: i % period == offset
