"""A sparse mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE): a router picks each token's top-k
experts, each a SwiGLU MLP, and the token's output is their outputs weighted by the router's probabilities.

Computed as transformers computes it, so that fp32 outputs match it: softmax over the router's logits in fp32,
top-k, renormalized to sum to 1 where the checkpoint says so, then experts in index order, each on the tokens
routed to it, added into the output (so a token's sum runs over its experts in the same order). Qwen2-MoE adds
a shared expert every token passes, scaled by a sigmoid gate of its own.

The experts' weights are stacked as transformers >= 5 holds them: ``experts.gate_up_proj`` ``[E, 2I, H]``
(each expert's gate then up rows) and ``experts.down_proj`` ``[E, H, I]``; ``load_expert_weights`` stacks a
checkpoint's per-expert tensors into them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.model_config import ModelConfig

# Per-expert tensors as checkpoints store them: Mixtral's w1 (gate), w3 (up), w2 (down) under
# block_sparse_moe; Qwen's gate_proj, up_proj, down_proj under mlp.
_EXPERT = re.compile(r"^(.*\.layers\.\d+\.)(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|"
                     r"down_proj)\.weight$")
_PART = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig, shared_expert: nn.Module | None = None) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.intermediate = config.moe_intermediate_size
        self.normalize = config.norm_topk_prob
        self.weights_in_fp32 = config.routing_weights_fp32
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)  # the router
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_expert = shared_expert
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False) if shared_expert is not None else None

    def forward(self, x: torch.Tensor, lora: object = None,
                act_mul: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """``x`` ``[T, H]``; ``act_mul`` maps a fused gate/up projection ``[n, 2I]`` to silu(gate) * up (the fused
        CPU kernel; default: torch ops). ``lora`` is the dense MLP's argument: adapters of an MoE layer's MLP are
        refused when they are read (services/common/lora.py), so there is nothing to add."""
        act_mul = act_mul or _silu_mul
        logits = F.linear(x, self.gate.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights /= weights.sum(dim=-1, keepdim=True)
        if not self.weights_in_fp32:
            weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        # Group the (token, slot) pairs by expert once: one sort instead of a mask per expert.
        flat = chosen.flatten()
        order = torch.argsort(flat, stable=True)
        tokens = order // self.top_k
        slot_weights = weights.flatten()[order]
        start = 0
        gate_up, down = self.experts.gate_up_proj, self.experts.down_proj
        for expert, count in enumerate(torch.bincount(flat, minlength=gate_up.shape[0]).tolist()):
            if not count:
                continue
            rows = tokens[start : start + count]
            h = F.linear(act_mul(F.linear(x[rows], gate_up[expert])), down[expert])
            out.index_add_(0, rows, (h * slot_weights[start : start + count, None]).to(out.dtype))
            start += count
        if self.shared_expert is not None:
            out = out + torch.sigmoid(F.linear(x, self.shared_expert_gate.weight)) * self.shared_expert(x, None)
        return out


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def expert_target(name: str) -> tuple[str, int, str] | None:
    """For a per-expert checkpoint tensor, the stacked parameter it goes into, the expert and its part ("gate",
    "up" or "down"); None for any other tensor."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    part = _PART[m[3]]
    return f"{m[1]}mlp.experts.{'down_proj' if part == 'down' else 'gate_up_proj'}", int(m[2]), part


def stack_experts(target: str, parts: dict[tuple[int, str], torch.Tensor], num_experts: int) -> torch.Tensor:
    """One stacked parameter from its per-expert tensors; raises ``KeyError`` naming the first one missing."""
    names = ("down",) if target.endswith("down_proj") else ("gate", "up")
    missing = [f"expert {e} {p}" for e in range(num_experts) for p in names if (e, p) not in parts]
    if missing:
        raise KeyError(f"{target}: missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} weights")
    return torch.stack([torch.cat([parts[e, p] for p in names]) for e in range(num_experts)])


def checkpoint_name(name: str) -> str:
    """Mixtral's router under the name the model holds it by (``block_sparse_moe`` -> ``mlp``)."""
    return name.replace(".block_sparse_moe.gate.", ".mlp.gate.")
