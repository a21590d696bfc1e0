"""A sparse mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GPT-OSS): a router picks each
token's top-k experts, each a SwiGLU MLP, and the token's output is their outputs weighted by the router's
probabilities.

Computed as transformers computes it, so that fp32 outputs match it: softmax over the router's logits in fp32,
top-k, renormalized to sum to 1 where the checkpoint says so, then each expert on the tokens routed to it (one
grouped GEMM per projection for all experts), added into the output in expert order, as transformers adds
them. Qwen2-MoE adds a shared expert every token passes, scaled by a sigmoid gate of its own. GPT-OSS's
router has a bias and takes the softmax of the top-k logits instead; its experts have biases and a clamped
SwiGLU (``ClampedSwiGLU``). GLM-4.5 routes as DeepSeek-V3 does (``_grouped_routing``), its router in fp32 in
any dtype, and adds an ungated shared expert; DeepSeek-V2 routes by softmax within groups
(``_group_softmax_routing``), its router in fp32 too. Llama 4 scales each token by the sigmoid of its chosen
expert's logit on the way into the expert rather than weighing the output (``sigmoid_input``). ERNIE 4.5
chooses by softmax probability plus a correction bias and weighs by the probability (``softmax_biased``).
Command A MoE weighs its top-k logits' softmax or sigmoids (``topk_sigmoid``) and averages a shared MLP in;
Kolibri-1 chooses by logit plus a correction bias and weighs by the logits' sigmoids (``logit_biased_sigmoid``).
Nemotron-H routes as DeepSeek-V3 to ungated ReLU² experts, which Nemotron 3 runs in a latent space (its
hidden state projected down before them and their sum up after).

The experts' weights are stacked as transformers >= 5 holds them: ``experts.gate_up_proj`` ``[E, 2I, H]``
(each expert's gate then up rows) and ``experts.down_proj`` ``[E, H, I]``; ``copy_expert`` copies a
checkpoint's per-expert tensors into them as they load.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.activations import ACTIVATIONS
from services.engine.grouped_mm import grouped_mm
from services.engine.lora import adapted
from services.engine.model_config import ModelConfig

if TYPE_CHECKING:
    from services.engine.lora import LoraBatch

# Per-expert tensors as checkpoints store them: Mixtral's w1 (gate), w3 (up), w2 (down) under
# block_sparse_moe; Qwen's gate_proj, up_proj, down_proj under mlp.
_EXPERT = re.compile(r"^(.*\.layers\.\d+\.)(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|"
                     r"down_proj)\.weight$")
_PART = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, intermediate: int, biases: bool = False,
                 gated: bool = True) -> None:
        """``gated`` False: Nemotron-H's experts, an up projection (``up_proj`` ``[E, I, H]``) through the
        activation straight into down_proj."""
        super().__init__()
        if gated:
            self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        else:
            self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate, hidden))
        self.gated = gated
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        # GPT-OSS: each expert's projections have biases (gate's then up's, as the weights' rows).
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * intermediate)) if biases else None
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden)) if biases else None


class ClampedSwiGLU:
    """GPT-OSS's activation of a fused gate/up projection: ``(up + 1) * gate * sigmoid(alpha * gate)`` with gate
    clamped to at most ``limit`` and up to ``[-limit, limit]``."""

    def __init__(self, limit: float, alpha: float) -> None:
        self.limit, self.alpha = limit, alpha

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig, shared_expert: nn.Module | None = None, layer: int = 0) -> None:
        super().__init__()
        self.layer = layer  # its adapters' (services/engine/lora.py)
        self.top_k = config.num_experts_per_tok
        self.normalize = config.norm_topk_prob
        self.weights_in_fp32 = config.routing_weights_fp32
        self.routing = config.moe_routing
        self.sparsemixer_eps = config.sparsemixer_eps
        self.groups, self.topk_groups = config.moe_groups, config.moe_topk_groups
        self.scaling = config.routed_scaling_factor
        self.norm_eps = config.routing_norm_eps
        self.router_fp32 = config.router_fp32
        self.router_softcap = config.router_softcap
        self.groups_masked_to_zero = config.moe_groups_masked_to_zero
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=config.moe_biases)  # the router
        if self.routing in ("sigmoid", "softmax_biased", "logit_biased_sigmoid"):  # added when experts are chosen only
            self.gate.e_score_correction_bias = nn.Parameter(torch.empty(config.num_experts))
        # Nemotron 3: the routed experts work in a latent space, projected down before them and up after.
        latent = config.moe_latent_size
        self.fc1_latent_proj = nn.Linear(config.hidden_size, latent, bias=config.mlp_bias) if latent else None
        self.fc2_latent_proj = nn.Linear(latent, config.hidden_size, bias=config.mlp_bias) if latent else None
        self.experts = Experts(config.num_experts, latent or config.hidden_size, config.moe_intermediate_size,
                               config.moe_biases, config.mlp_gated)
        self.act = ClampedSwiGLU(config.swiglu_limit, config.swiglu_alpha) if config.swiglu_limit is not None else None
        if not config.mlp_gated:  # Nemotron-H: the activation alone (ReLU²), no gate
            self.act = ACTIVATIONS[config.hidden_act]
        self.shared_expert = shared_expert
        self.shared_averaged = config.shared_expert_averaged
        self.shared_expert_gate = (nn.Linear(config.hidden_size, 1, bias=False)
                                   if shared_expert is not None and config.shared_expert_gated else None)

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None,
                act_mul: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """``x`` ``[T, H]``; ``act_mul`` maps a fused gate/up projection ``[n, 2I]`` to silu(gate) * up (the fused
        CPU kernel; default: torch ops); ``lora``: the batch's adapters of the experts."""
        act_mul = self.act or act_mul or silu_mul
        weights, chosen = self._route(x)
        inputs = x if self.fc1_latent_proj is None else adapted(self.fc1_latent_proj, x, lora, self.layer,
                                                                 "mlp.fc1_latent_proj")
        out = run_experts(self.experts, inputs, weights, chosen, act_mul, self.routing == "sigmoid_input", lora,
                          self.layer)
        if self.fc2_latent_proj is not None:
            out = adapted(self.fc2_latent_proj, out, lora, self.layer, "mlp.fc2_latent_proj")
        if self.shared_expert is not None:
            shared = self.shared_expert(x, lora)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(F.linear(x, self.shared_expert_gate.weight)) * shared
            out = out + shared
            if self.shared_averaged:  # Cohere2-MoE's "average"
                out = out / 2
        return out

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's (weights, experts) ``[T, k]``, by the model's routing."""
        if self.routing in ("sigmoid", "softmax_grouped"):
            weights, chosen = self._grouped_routing(x)
        elif self.routing == "group_softmax":
            weights, chosen = self._group_softmax_routing(x)
        elif self.routing == "softmax_biased":  # ERNIE 4.5, in fp32: chosen by probability plus bias
            probs = torch.softmax(F.linear(x.float(), self.gate.weight.float()), dim=-1)
            chosen = (probs + self.gate.e_score_correction_bias.float()).topk(self.top_k, dim=-1)[1]
            weights = probs.gather(1, chosen)
            weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        elif self.routing == "softmax_fp32":  # Hunyuan: its router (kept fp32) on fp32 inputs, fp32 weights
            probs = torch.softmax(F.linear(x.float(), self.gate.weight.float()), dim=-1)
            weights, chosen = torch.topk(probs, self.top_k, dim=-1)
            weights = weights / weights.sum(dim=-1, keepdim=True)
        elif self.routing == "sparsemixer":
            weights, chosen = self._sparsemixer_routing(x)
        elif self.routing == "sigmoid_input":  # Llama 4: the chosen logits' sigmoids, applied to the inputs below
            top, chosen = torch.topk(F.linear(x, self.gate.weight), self.top_k, dim=-1)
            weights = torch.sigmoid(top.float()).to(x.dtype)
        elif self.routing == "logit_biased_sigmoid":  # Kolibri-1's, in fp32: chosen by logit plus bias
            logits = F.linear(x.float(), self.gate.weight.float())
            chosen = (logits + self.gate.e_score_correction_bias.float()).topk(self.top_k, dim=-1)[1]
            weights = logits.gather(1, chosen).sigmoid()
            if self.normalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        elif self.routing == "topk_sigmoid":  # chosen by logit: Cohere2-MoE's in the router's dtype, Flint's fp32
            logits = F.linear(x.float(), self.gate.weight.float()) if self.router_fp32 else F.linear(x, self.gate.weight)
            top, chosen = torch.topk(logits, self.top_k, dim=-1)
            weights = torch.sigmoid(top)
            if self.normalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        elif self.routing == "topk_softmax":  # as transformers computes it: GPT-OSS's in the model's dtype
            top, chosen = torch.topk(F.linear(x, self.gate.weight, self.gate.bias), self.top_k, dim=-1)
            weights = (torch.softmax(top.float(), dim=-1).to(x.dtype) if self.router_fp32
                       else torch.softmax(top, dim=-1, dtype=top.dtype))
        else:
            logits = F.linear(x, self.gate.weight)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            weights, chosen = torch.topk(probs, self.top_k, dim=-1)
            if self.normalize:
                weights /= weights.sum(dim=-1, keepdim=True)
            if not self.weights_in_fp32:
                weights = weights.to(x.dtype)
        return weights, chosen

    def _sparsemixer_routing(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Phi-3.5-MoE's routing as transformers' sparsemixer computes it at inference, in the router's dtype: the
        best expert, weighed by its softmax over the experts whose logits lie within a relative margin of its
        own; then the best of the others, weighed alike over the others. Not renormalized."""
        scores = F.linear(x, self.gate.weight)
        margin = 2 * self.sparsemixer_eps

        def best(masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            top, index = masked.max(dim=-1, keepdim=True)
            far = (top - scores) / scores.abs().clamp(min=top) > margin
            return torch.softmax(masked.masked_fill(far, float("-inf")), dim=-1).gather(-1, index), index

        first, i = best(scores)
        second, j = best(scores.scatter(-1, i, float("-inf")))
        return torch.cat([first, second], dim=-1), torch.cat([i, j], dim=-1)

    def _grouped_routing(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek-V3's routing, as transformers' GLM-4.5 computes it (fp32): sigmoid scores; each group of
        experts ranked by the sum of its two best scores plus their correction biases; the top k experts by
        score plus bias among the ``topk_groups`` best groups; weighed by their scores (no bias), renormalized
        and scaled. Mistral 4's ("softmax_grouped") is the same over softmax scores without a bias."""
        logits = F.linear(x.float(), self.gate.weight.float()) if self.router_fp32 else F.linear(x, self.gate.weight)
        if self.router_softcap is not None:  # Laguna's
            logits = torch.tanh(logits / self.router_softcap) * self.router_softcap
        if self.routing == "softmax_grouped":  # Mistral 4: softmax scores, in the router's dtype, and no bias
            scores = choice = torch.softmax(logits, dim=-1)
        else:  # in the router's dtype where the weights stay in it (LFM2-MoE's), as transformers computes them
            scores = logits.sigmoid() if not self.weights_in_fp32 else logits.float().sigmoid()
            choice = scores + self.gate.e_score_correction_bias.float()
        if self.groups > 1:
            best = choice.view(x.shape[0], self.groups, -1).topk(2, dim=-1)[0].sum(dim=-1)
            keep = torch.zeros_like(best).scatter_(1, best.topk(self.topk_groups, dim=-1)[1], 1.0).bool()
            choice = choice.masked_fill(~keep.repeat_interleave(choice.shape[1] // self.groups, dim=1),
                                        0.0 if self.groups_masked_to_zero else float("-inf"))
        chosen = choice.topk(self.top_k, dim=-1)[1]
        weights = scores.gather(1, chosen)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + self.norm_eps)
        return weights * self.scaling, chosen


    def _group_softmax_routing(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek-V2's routing, as transformers computes it: softmax over fp32 logits; with groups, the top k
        among the ``topk_groups`` groups whose best expert scores highest; weighed by their scores times
        ``routed_scaling_factor``, not renormalized."""
        scores = torch.softmax(F.linear(x.float(), self.gate.weight.float()), dim=-1)
        choice = scores
        if self.groups > 1:
            best = scores.view(x.shape[0], self.groups, -1).amax(dim=-1)
            keep = torch.zeros_like(best).scatter_(1, best.topk(self.topk_groups, dim=-1)[1], 1.0).bool()
            choice = scores.masked_fill(~keep.repeat_interleave(scores.shape[1] // self.groups, dim=1), 0.0)
        weights, chosen = choice.topk(self.top_k, dim=-1)
        return weights * self.scaling, chosen


def run_experts(experts: Experts, inputs: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor,
                act_mul: Callable[[torch.Tensor], torch.Tensor], scaled_inputs: bool = False,
                lora: LoraBatch | None = None, layer: int = 0) -> torch.Tensor:
    """Each token of ``inputs`` ``[T, H]`` through its ``chosen`` experts ``[T, k]``, their outputs weighed by
    ``weights`` ``[T, k]`` and summed (``scaled_inputs``: the inputs scaled by them instead); ``act_mul`` maps a
    gate/up projection ``[n, 2I]`` to act(gate) * up."""
    top_k = chosen.shape[1]
    # Each (token, slot) pair as a row, grouped by expert (a stable sort keeps a token's rows in expert
    # order), then every expert's rows in one grouped GEMM per projection: no loop over experts and no
    # device-to-host sync, which matters with 128 experts on a GPU.
    flat = chosen.flatten()
    order = torch.argsort(flat, stable=True)
    tokens = order // top_k
    offsets = torch.bincount(flat, minlength=experts.down_proj.shape[0]).cumsum(0).to(torch.int32)
    rows = inputs[tokens]
    if scaled_inputs:  # a token goes into its expert scaled, and the expert's output adds as it is
        rows = rows * weights.flatten()[order, None]
    gate_up = grouped_mm(rows, (experts.gate_up_proj if experts.gated else experts.up_proj).transpose(1, 2),
                         offsets)
    masks = lora.expert_masks(tokens) if lora is not None else None
    if lora is not None:
        lora.add_experts(gate_up, rows, layer, "experts.gate_up", offsets, masks)
    if experts.gate_up_proj_bias is not None:  # each row plus its expert's biases
        expert_of_row = flat[order]
        gate_up += experts.gate_up_proj_bias.index_select(0, expert_of_row)
    act = act_mul(gate_up)
    h = grouped_mm(act, experts.down_proj.transpose(1, 2), offsets)
    if lora is not None:
        lora.add_experts(h, act, layer, "experts.down", offsets, masks)
    if experts.down_proj_bias is not None:
        h += experts.down_proj_bias.index_select(0, expert_of_row)
    # Each token's k rows weighed (in the weights' dtype: fp32 where the model keeps them so) and summed in the
    # token's slot order, then cast, as transformers' grouped experts do: rounded row by row into a
    # low-precision sum instead, the result rounds otherwise.
    weighted = h if scaled_inputs else h * weights.flatten()[order, None]
    by_slot = torch.empty_like(weighted)
    by_slot[order] = weighted
    return by_slot.view(-1, top_k, by_slot.shape[-1]).sum(dim=1).to(inputs.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def expert_target(name: str, gated: bool = True) -> tuple[str, int, str] | None:
    """For a per-expert checkpoint tensor, the stacked parameter it goes into, the expert and its part ("gate",
    "up" or "down"; ``gated`` False: "up" is a parameter of its own); None for any other tensor."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    part = _PART[m[3]]
    stacked = "down_proj" if part == "down" else "gate_up_proj" if gated else "up_proj"
    return f"{m[1]}mlp.experts.{stacked}", int(m[2]), part


def copy_expert(param: torch.Tensor, index: int, part: str, tensor: torch.Tensor, gated: bool = True) -> None:
    """One expert's gate, up or down weight into its slice of the stacked parameter, as it streams by: no
    layer's experts are held twice (a 30B MoE's experts are most of its weights). Raises ``KeyError`` on a
    shape the config does not imply."""
    if index >= param.shape[0]:
        raise KeyError(f"expert {index} {part} weight: the config has {param.shape[0]} experts")
    rows = param.shape[1] // 2
    whole = part == "down" or not gated
    target = param[index] if whole else param[index, :rows] if part == "gate" else param[index, rows:]
    if tuple(target.shape) != tuple(tensor.shape):
        raise KeyError(f"expert {index} {part} weight has shape {tuple(tensor.shape)}; the config implies "
                       f"{tuple(target.shape)} for each of {param.shape[0]} experts")
    with torch.no_grad():
        target.copy_(tensor.to(param.dtype))


def missing_experts(target: str, seen: set[tuple[int, str]], num_experts: int) -> str | None:
    """What a stacked parameter still lacks, named, or None."""
    names = ("down",) if target.endswith("down_proj") else ("up",) if target.endswith(".up_proj") else ("gate", "up")
    missing = [f"expert {e} {p}" for e in range(num_experts) for p in names if (e, p) not in seen]
    return f"{target}: missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} weights" if missing else None


def routers_in_fp32(model: nn.Module) -> None:
    """Sigmoid routers (and Hunyuan's softmax one) stay fp32 in a low-precision model, as transformers keeps them:
    a bf16 router would pick other experts. Kolibri-1's keeps only its correction bias fp32, as transformers does
    (its weight rounded to the model's dtype, widened for the product)."""
    for module in model.modules():
        if isinstance(module, SparseMoE) and module.routing == "logit_biased_sigmoid":
            # Kolibri-1's: only the bias; its weight stays in the model's dtype, widened for each product.
            module.gate.e_score_correction_bias.data = module.gate.e_score_correction_bias.data.float()
        elif isinstance(module, SparseMoE) and module.routing in ("sigmoid", "group_softmax", "softmax_biased",
                                                                  "softmax_fp32", "topk_sigmoid") and module.router_fp32:
            module.gate.float()
