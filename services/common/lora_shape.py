"""What of a base model a LoRA adapter may adapt, and under which names and shapes (``ModelShape``, made from a
``ModelConfig`` without torch): the decoder layers' projections (fused q/k/v and gate/up taken apart as the
engine computes them), an MoE's stacked experts and shared expert, and projections held as checkpoints hold them
(a linear-attention mixer's, an output gate, latent attention's). Reading an adapter against it: lora.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# The projections of a decoder layer an adapter may change.
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Phi-3's checkpoints (and so its adapters) have q/k/v and gate/up fused, as the engine computes them: the
# parts each replaces.
FUSED_MODULES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# GPT-NeoX's, BLOOM's and Falcon's fused q/k/v, its rows in the architecture's layout (each head's q, k, v in
# turn, or grouped): the model splits it as it loads it, and the engine an adapter's B alike.
QUERY_KEY_VALUE = "query_key_value"
PARTS = {**FUSED_MODULES, QUERY_KEY_VALUE: FUSED_MODULES["qkv_proj"]}
# MiniCPM5's q_gate_proj: each head's query rows, then its output gate's (as Qwen3.5's q_proj holds them).
Q_GATE = "q_gate_proj"
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", QUERY_KEY_VALUE, Q_GATE)
MLP_MODULES = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")
# The stacked experts' projections, in the order transformers' experts modules register them (gated experts have
# gate_up_proj, Nemotron-H's up_proj), and as the model names them.
EXPERT_PARAMS = ("gate_up_proj", "up_proj", "down_proj")
_EXPERT_PARAM = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:mlp|block_sparse_moe|feed_forward|mixer)\.experts\."
                           r"(gate_up_proj|up_proj|down_proj)$")
_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp|mlp\.shared_expert)\.(\w+)\.weight$")
SHARED = "shared_expert."  # an MoE layer's shared expert's projections, as LoraSpec names them
# A projection of a linear-attention layer's mixer (``linear_attn.in_proj_qkv``, ``mamba.in_proj``).
_PROJECTION = re.compile(r"(?:^|\.)layers\.(\d+)\.(\w+\.\w+)\.weight$")


@dataclass(frozen=True)
class ModelShape:
    """The base model's dimensions an adapter must fit (from its ``ModelConfig``)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    q_size: int  # num_attention_heads * head_dim
    kv_size: int  # num_key_value_heads * head_dim
    # Layers whose MLP is a mixture of experts: an adapter of their gate/up/down projections has nothing to
    # adapt; their experts' are adapted as parameters (target_parameters).
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 0
    expert_input: int = 0  # the experts' input width: hidden_size, or Nemotron 3's latent size
    expert_intermediate: int = 0
    # Llama 4's experts hold their weights [E, in, out] without saying so to PEFT, which then reads them as
    # [E, out, in]: its A is [r·E, out] and its B [in, r·E], the two swapped.
    experts_swapped: bool = False
    shared_intermediate: int = 0  # an MoE layer's shared expert's (shared_expert_intermediate_size)
    # Projections adapted as the model holds them (a linear-attention mixer's, the attention's output gate):
    # (name in the layer, in, out, the layers that have it).
    projections: tuple[tuple[str, int, int, tuple[int, ...]], ...] = ()
    # Qwen3-Next's, Qwen3.5's and MiniCPM5's attention gates its output by rows stored in q_proj (q_gate_proj).
    query_gates: bool = False
    # DeepSeek-V3's latent attention: no q/k/v/o projections of the shapes above to adapt.
    latent_attention: bool = False
    # False: MLPs without a gate (GPT-2's, Arcee's): up_proj and down_proj only.
    gated_mlp: bool = True
    # A sequence classifier's classes (its ``score`` head's rows, which an adapter may save whole); 0: none.
    num_labels: int = 0
    # The name the model holds a checkpoint's tensor by (weight_names.model_name for its config).
    names: Callable[[str], str] | None = field(default=None, compare=False)
    # Why this model takes no adapter at all, where it takes none; "": it takes them.
    no_adapters: str = ""

    def in_out(self, module: str, layer: int) -> tuple[int, int]:
        """``module`` of ``layer``, as LoraSpec names it (a shared expert's ``shared_expert.gate_proj``)."""
        plain = [(fan_in, fan_out) for name, fan_in, fan_out, layers in self.projections
                 if name == module and layer in layers]
        if plain:  # Kimi Linear's KDA and latent attention layers each have a q_proj of their own
            return plain[0]
        shared = module.startswith(SHARED)
        module = module.removeprefix(SHARED)
        h, q, kv = self.hidden_size, self.q_size, self.kv_size
        i = self.shared_intermediate if shared else self.intermediate_size
        return {"q_proj": (h, 2 * q if self.query_gates else q), Q_GATE: (h, 2 * q),
                "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h), "qkv_proj": (h, q + 2 * kv),
                QUERY_KEY_VALUE: (h, q + 2 * kv), "gate_up_proj": (h, 2 * i)}[module]

    def expert_in_out(self, param: str) -> tuple[int, int]:
        """A stacked expert projection's (in, out) per expert."""
        h, i = self.expert_input, self.expert_intermediate
        return {"gate_up_proj": (h, 2 * i), "up_proj": (h, i), "down_proj": (i, h)}[param]

    def expert_param(self, name: str) -> tuple[int, str] | None:
        """(layer, stacked projection) of an experts module's parameter as the model holds it; None for others."""
        m = _EXPERT_PARAM.search(self.names(name) if self.names is not None else name)
        return None if m is None else (int(m[1]), m[2])

    def projection(self, weight: str) -> tuple[int, str] | None:
        """(layer, projection) of a linear-attention mixer's weight as the model holds it; None for others."""
        m = _PROJECTION.search(self.names(weight) if self.names is not None else weight)
        return (int(m[1]), m[2]) if m is not None and any(m[2] == p[0] for p in self.projections) else None

    def module(self, weight: str) -> tuple[int, str, str] | None:
        """(layer, sublayer, projection) of a checkpoint's weight as the model holds it; None for other tensors."""
        m = _MODULE.search(self.names(weight) if self.names is not None else weight)
        return None if m is None else (int(m[1]), m[2], m[3])
