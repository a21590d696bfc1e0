"""Gemma 4's layers (gemma4.py has the architecture), computed as transformers computes them, op for op: attention
whose heads are as wide as the layer's type makes them, reading its own KV or an earlier layer's; the dense MLP
(this engine's, model.py) with experts beside it; per-layer inputs; the layer's scalar."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.activations import ACTIVATIONS, rms_norm, weightless_rms_norm
from services.engine.attention import AttentionBatch, paged_attention
from services.engine.kv_pool import PagedKVPool
from services.engine.model import MLP, RMSNorm
from services.engine.model_config import ModelConfig
from services.engine.moe import Experts, run_experts
from services.engine.rope import RotaryEmbedding

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels

# Keys and values of the pass's KV-keeping layers, by pool layer, for the layers that read them.
SharedKV = dict[int, tuple[torch.Tensor, torch.Tensor]]


def _norm(config: ModelConfig, size: int) -> RMSNorm:
    return RMSNorm(size, config.rms_norm_eps, scale_in_fp32=True)


def _normed(norm: RMSNorm, x: torch.Tensor, kernels: CpuKernels | None) -> torch.Tensor:
    """``norm(x)`` over the last dimension, by the fused CPU kernel where the batch has them (fp32: the same
    numbers up to its rounding, at a fraction of the op's cost on small batches)."""
    if kernels is None:
        return rms_norm(x, norm.weight, norm.eps, True)
    return kernels.add_rms_norm(x.reshape(-1, x.shape[-1]), None, norm.weight, norm.eps).view(x.shape)


class Gemma4Attention(nn.Module):
    """q, k and v (or k as v: ``attention_k_eq_v``) normed per head, q and k rotated, scores unscaled. A layer
    that shares KV has only q and o projections: it attends over the keys and values its source layer wrote."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        g = config.gemma4
        self.sliding = config.attends_locally(layer)
        self.heads, (self.kv_heads, self.head_dim) = config.num_attention_heads, config.layer_heads(layer)
        self.shares = g.shares_kv(layer)
        self.kv_layer = config.kv_layers.index(g.kv_source[layer])
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.eps = eps
        self.q_size, self.kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.q_norm = _norm(config, self.head_dim)
        if self.shares:
            self.q_proj = nn.Linear(hidden, self.q_size, bias=False)
        else:  # q, k and v in one matmul (model.load_weights fills its rows by these widths); k as v: no v rows
            self.v_size = 0 if g.k_eq_v and not self.sliding else self.kv_size
            self.qkv_proj = nn.Linear(hidden, self.q_size + self.kv_size + self.v_size, bias=False)
            self.k_norm = _norm(config, self.head_dim)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: AttentionBatch,
                kv: PagedKVPool, shared: SharedKV) -> torch.Tensor:
        t, kernels = x.shape[0], batch.kernels
        qkv = self.q_proj(x) if self.shares else self.qkv_proj(x)
        q = self._rotated(_normed(self.q_norm, qkv[:, : self.q_size].view(t, self.heads, self.head_dim), kernels),
                          cos, sin, kernels)
        if self.shares:
            k, v = shared[self.kv_layer]
        else:
            raw_k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, self.kv_heads, self.head_dim)
            raw_v = qkv[:, self.q_size + self.kv_size :].view(t, self.kv_heads, self.head_dim) if self.v_size else raw_k
            k = self._rotated(_normed(self.k_norm, raw_k, kernels), cos, sin, kernels)
            v = weightless_rms_norm(raw_v, self.eps)
            shared[self.kv_layer] = k, v
        # A sharing layer writes its source's keys and values again, into the same slots: the same bits.
        k_cache, v_cache = kv.layer(self.kv_layer)
        o = paged_attention(q, k, v, k_cache, v_cache, batch, self.sliding, scale=1.0)
        return self.o_proj(o.reshape(t, self.heads * self.head_dim))

    @staticmethod
    def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kernels: CpuKernels | None) -> torch.Tensor:
        """``x`` (a tensor of its own) rotated: in place by the fused kernel, or by torch ops."""
        if kernels is None:
            return RotaryEmbedding.apply(x, cos, sin)
        kernels.rope_(x, cos, sin)
        return x


class Gemma4Router(nn.Module):
    """The experts' router: the stream normed (no weight), scaled per feature and by hidden_size ** -0.5, softmax
    in fp32, top k renormalized, each chosen weight times its expert's learned scale."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        g = config.gemma4
        self.eps, self.top_k, self.root = config.rms_norm_eps, g.top_k, config.hidden_size ** -0.5
        self.proj = nn.Linear(config.hidden_size, g.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(config.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(g.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = weightless_rms_norm(x, self.eps) * self.scale * self.root
        probs = torch.softmax(self.proj(h), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[chosen], chosen


class Gemma4Layer(nn.Module):
    """One layer, in transformers' order: ``s += post(attn(norm(s)))``; ``s += post_ff(mlp(pre_ff(s)) [normed,
    plus the experts' output on s, normed])``; with per-layer inputs ``s += norm(proj(act(gate(s)) * input))``;
    then ``s *= layer_scalar``."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        g, hidden = config.gemma4, config.hidden_size
        self.input_layernorm = _norm(config, hidden)
        self.self_attn = Gemma4Attention(config, layer)
        self.post_attention_layernorm = _norm(config, hidden)
        self.pre_feedforward_layernorm = _norm(config, hidden)
        self.mlp = MLP(config, layer, g.mlp_width(layer, config.intermediate_size))
        self.post_feedforward_layernorm = _norm(config, hidden)
        self.layer_scalar = nn.Parameter(torch.ones(1))
        self.act = ACTIVATIONS[config.hidden_act]
        self.router = self.experts = None
        if g.num_experts:
            self.router = Gemma4Router(config)
            self.experts = Experts(g.num_experts, hidden, g.moe_intermediate)
            self.post_feedforward_layernorm_1 = _norm(config, hidden)
            self.pre_feedforward_layernorm_2 = _norm(config, hidden)
            self.post_feedforward_layernorm_2 = _norm(config, hidden)
        self.per_layer = g.per_layer_input > 0
        if self.per_layer:
            self.per_layer_input_gate = nn.Linear(hidden, g.per_layer_input, bias=False)
            self.per_layer_projection = nn.Linear(g.per_layer_input, hidden, bias=False)
            self.post_per_layer_input_norm = _norm(config, hidden)

    def forward(self, s: torch.Tensor, per_layer_input: torch.Tensor | None, cos, sin, batch: AttentionBatch,
                kv: PagedKVPool, shared: SharedKV) -> torch.Tensor:
        k = batch.kernels
        h = _normed(self.post_attention_layernorm,
                    self.self_attn(_normed(self.input_layernorm, s, k), cos, sin, batch, kv, shared), k)
        s = s + h
        h = self.mlp(_normed(self.pre_feedforward_layernorm, s, k), None)
        if self.experts is not None:
            h = _normed(self.post_feedforward_layernorm_1, h, k)
            weights, chosen = self.router(s)
            routed = run_experts(self.experts, _normed(self.pre_feedforward_layernorm_2, s, k), weights, chosen,
                                 self._act_mul)
            h = h + _normed(self.post_feedforward_layernorm_2, routed, k)
        s = s + _normed(self.post_feedforward_layernorm, h, k)
        if self.per_layer:
            h = self.act(self.per_layer_input_gate(s)) * per_layer_input
            s = s + _normed(self.post_per_layer_input_norm, self.per_layer_projection(h), k)
        return s * self.layer_scalar

    def _act_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act(gate) * up


def add_per_layer_inputs(model: nn.Module, config: ModelConfig) -> None:
    """The per-layer inputs' modules, under the names checkpoints hold them by in the base model."""
    g = config.gemma4
    width = config.num_hidden_layers * g.per_layer_input
    model.embed_tokens_per_layer = nn.Embedding(g.per_layer_vocab, width, _weight=torch.empty(g.per_layer_vocab, width))
    model.per_layer_model_projection = nn.Linear(config.hidden_size, width, bias=False)
    model.per_layer_projection_norm = _norm(config, g.per_layer_input)


def per_layer_inputs(model: nn.Module, config: ModelConfig, input_ids: torch.Tensor,
                     embeddings: torch.Tensor) -> torch.Tensor:
    """Each token's input to each layer, ``[T, layers, width]``: its row of the per-layer table (scaled by
    sqrt(width) rounded to the weights' dtype) and the normed projection of its (scaled) embedding, averaged
    as transformers averages them (their sum times 2 ** -0.5)."""
    width = config.gemma4.per_layer_input
    table = model.embed_tokens_per_layer.weight
    own = F.embedding(input_ids, table) * torch.tensor(width ** 0.5, dtype=table.dtype)
    projected = model.per_layer_model_projection(embeddings) * config.hidden_size ** -0.5
    projected, _ = model.per_layer_projection_norm(projected.view(-1, config.num_hidden_layers, width))
    return (projected + own.view(-1, config.num_hidden_layers, width)) * 2 ** -0.5


def forward(lm: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
            kv: PagedKVPool, logits_index: torch.Tensor) -> torch.Tensor:
    """``LlamaForCausalLM.forward`` of a Gemma 4 model: the selected tokens' final hidden states."""
    c, model = lm.config, lm.model
    s = model.embed_tokens(input_ids)
    s = s * torch.tensor(c.embed_scale, dtype=s.dtype)
    inputs = per_layer_inputs(model, c, input_ids, s) if c.gemma4.per_layer_input else None
    full = lm.rotary.cos_sin(positions, s.dtype)
    local = lm.local_rotary.cos_sin(positions, s.dtype) if lm.local_rotary is not None else full
    shared: SharedKV = {}
    tail = c.kv_free_tail
    for i, layer in enumerate(model.layers):
        if i == tail and (sampled := batch.sampled) is not None:
            # The KV-sharing layers write no KV: only the rows logits are taken from go on (none: none do).
            if sampled.batch is None:
                break
            rows, batch, logits_index = sampled.rows, sampled.batch, sampled.logits_index
            s = s[rows]
            inputs = None if inputs is None else inputs[rows]
            shared = {layer: (k[rows], v[rows]) for layer, (k, v) in shared.items()}
            # The batch's rows of cos and sin, not computed again: cos of one position rounds otherwise than of
            # many at a last bit (vectorized), which bf16 shows.
            full, local = ((cos[rows], sin[rows]) for cos, sin in (full, local))
        cos, sin = local if c.slides(i) else full
        s = layer(s, None if inputs is None else inputs[:, i], cos, sin, batch, kv, shared)
    s, _ = model.norm(s[logits_index])
    return s
