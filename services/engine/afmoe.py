"""Arcee's AFMoE (Trinity Nano, Mini, Large: ``AfmoeForCausalLM``): what sets it apart, read from its config as
transformers reads it. No torch (the scheduler reads configs).

* Attention's output is gated per feature by the sigmoid of a projection of the layer's input
  (``self_attn.gate_proj``) before ``o_proj``; q and k are RMSNormed per head.
* Layers slide within ``sliding_window`` (default 1024) but every ``global_attn_every_n_layers``-th (default
  4), or as ``layer_types`` says; only the sliding layers rotate (RoPE), the global ones have no positions.
* Each sublayer's output is normed before it joins the stream, as Gemma's ("sandwich" norms, named
  ``pre_mlp_layernorm`` / ``post_mlp_layernorm`` in its checkpoints).
* Embeddings are scaled by sqrt(hidden_size) with ``mup_enabled``.
* Layers from ``num_dense_layers`` on route (moe_config.py): DeepSeek-V3's sigmoid scores, the top k chosen with
  a correction bias (``mlp.expert_bias``), renormalized, times ``route_scale``, beside an ungated shared MLP of
  ``num_shared_experts`` experts' width; the router (``mlp.router.gate``) runs in the model's dtype.
"""

from __future__ import annotations

from typing import Any

ARCH = "AfmoeForCausalLM"
RENAMES = ((".mlp.router.gate.", ".mlp.gate."), (".mlp.expert_bias", ".mlp.gate.e_score_correction_bias"),
           (".pre_mlp_layernorm.", ".pre_feedforward_layernorm."),
           (".post_mlp_layernorm.", ".post_feedforward_layernorm."))


def afmoe_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields only AFMoE sets (its windows, norms and MoE: ``ModelConfig.from_dict``,
    moe_config.py)."""
    del raw  # every AFMoE checkpoint gates its attention's output
    return dict(attn_output_gate="own")
