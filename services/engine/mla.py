"""Multi-head latent attention (DeepSeek-V2, DeepSeek-V3, DeepSeek-R1, Kimi K2), with its latent as the KV cache.

Each token's keys and values come from one latent: ``kv_a_proj_with_mqa`` gives ``c`` (``kv_lora_rank``
features, RMS-normed) and ``k_rope`` (``qk_rope_head_dim`` features, rotated, shared by every head); head h's
key is ``[W_UK[h] c, k_rope]`` and its value ``W_UV[h] c``, both read from ``kv_b_proj``. transformers
expands those per head. Here they are not: ``q_nope[h] . W_UK[h] c = (W_UK[h]^T q_nope[h]) . c``, so each
query is turned into the latent's space (``q_lat``, absorbed) and attends to ``[c, k_rope]`` itself, one KV
head shared by all query heads (the paged kernels as they are, head_dim ``kv_lora_rank + qk_rope_head_dim``).
The values are the same latents: attention's output ``sum_j p_j c_j`` is then mapped by ``W_UV[h]``. So the
cache holds 576 numbers per token and layer (DeepSeek-V3) where the expanded keys and values take 40,960: the
pool holds one tensor per layer (``KVLayout.num_parts`` 1), handed out as both K and V.

Scores are scaled by ``qk_head_dim ** -0.5`` times YaRN's ``mscale_all_dim`` correction squared, as
transformers scales them; the kernels scale by the cache's head_dim ** -0.5, so the queries carry the ratio.
DeepSeek's checkpoints store the rotated features interleaved (pairs ``(x0, x1), (x2, x3)``; transformers'
``rope_interleave``): ``rope.deinterleave_rope`` permutes those rows of ``q_b_proj`` (or ``q_proj``) and
``kv_a_proj_with_mqa`` as they load, evens then odds, which is what transformers' interleaved rotation
computes; q and k are permuted alike, so their dot products are unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from services.engine.attention import AttentionBatch, paged_attention
from services.engine.dsa import Indexer, indexed_attention
from services.engine.kv_pool import PagedKVPool
from services.engine.lora import adapted
from services.engine.model_config import ModelConfig
from services.engine.rope import RotaryEmbedding, yarn_mscale

# transformers' DeepseekV3RMSNorm default, which its q_a_layernorm and kv_a_layernorm keep (not rms_norm_eps).
_LATENT_NORM_EPS = 1e-6


class LatentAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, norm: type[nn.Module]) -> None:
        super().__init__()
        self.layer = layer
        self.kv_layer = config.kv_layers.index(layer)  # its layer of the KV pool (which linear layers skip)
        self.heads = config.num_attention_heads
        self.nope, self.rope, self.rank, self.v = (config.qk_nope_head_dim, config.qk_rope_head_dim,
                                                   config.kv_lora_rank, config.v_head_dim)
        q_out, bias = self.heads * (self.nope + self.rope), config.attention_bias
        # A.X K2: q_b_proj reads the bottleneck normed and not, and gives each head an output gate after its query.
        self.gated = config.mla_query_gate
        if config.q_lora_rank:
            self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=bias)
            self.q_a_layernorm = norm(config.q_lora_rank, _LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(config.q_lora_rank * (2 if self.gated else 1),
                                      q_out + (self.heads * self.v if self.gated else 0), bias=False)
        else:
            self.q_proj = nn.Linear(config.hidden_size, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(config.hidden_size, self.rank + self.rope, bias=bias)
        self.kv_a_layernorm = norm(self.rank, _LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.rank, self.heads * (self.nope + self.v), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v, config.hidden_size, bias=bias)
        self.q_scale = softmax_scale(config) * math.sqrt(self.rank + self.rope)
        # DeepSeek-V3.2's sparse attention (dsa.py): its indexer's keys cached after the latent.
        self.index_topk = config.index_topk
        self.index_head_dim = config.index_head_dim
        self.indexer = Indexer(config.hidden_size, config.q_lora_rank, config.index_n_heads, config.index_head_dim) \
            if config.index_topk and layer not in config.index_shared_layers else None  # GLM-5's shared ones: none

    def forward(self, x, cos, sin, batch: AttentionBatch, kv: PagedKVPool, lora,
                q_mult: torch.Tensor | None = None) -> torch.Tensor:
        """``q_mult`` (``[T, 1, 1]``): Mistral 4's query scale by position; queries scale linearly through W_UK's
        absorption, so the absorbed query takes it."""
        t = x.shape[0]

        def linear(name: str, inputs: torch.Tensor) -> torch.Tensor:
            return adapted(getattr(self, name), inputs, lora, self.layer, f"self_attn.{name}")

        q_compressed = linear("q_a_proj", x) if hasattr(self, "q_b_proj") else None
        q_resid = self.q_a_layernorm._norm(q_compressed) if q_compressed is not None else None
        if self.gated:
            q_nope, q_rope, gate = self.q_b_proj(torch.cat([q_resid, q_compressed], dim=-1)).view(
                t, self.heads, -1).split([self.nope, self.rope, self.v], dim=-1)
        else:
            q = linear("q_b_proj", q_resid) if q_resid is not None else linear("q_proj", x)
            q_nope, q_rope = q.view(t, self.heads, -1).split([self.nope, self.rope], dim=-1)
        c, k_rope = linear("kv_a_proj_with_mqa", x).split([self.rank, self.rope], dim=-1)
        c = self.kv_a_layernorm._norm(c)
        rotated = torch.cat([q_rope, k_rope[:, None]], dim=1)
        if cos is not None:  # None: no positions (Kimi Linear: the block is a plain part of the key)
            rotated = RotaryEmbedding.apply(rotated, cos, sin)  # one pass
        w = self.kv_b_proj.weight.view(self.heads, self.nope + self.v, self.rank)
        q_lat = torch.einsum("thn,hnr->thr", q_nope, w[:, : self.nope])  # W_UK absorbed into the query
        adapters = [] if lora is None else lora.groups_of(self.layer, "self_attn.kv_b_proj")
        for rows, kv_b in adapters:  # W_UK + s·B_UK·A absorbed alike: s·(q·B_UK)·A more
            b = kv_b.bt.T.unflatten(0, (self.heads, -1))[:, : self.nope]
            _add_rows(q_lat, rows, q_nope, lambda qn, b=b, kv_b=kv_b: torch.einsum("thn,hnk->thk", qn, b) @ kv_b.a,
                      kv_b.scaling)
        query = torch.cat([q_lat, rotated[:, : self.heads]], dim=-1) * self.q_scale
        if q_mult is not None:
            query = (query * q_mult).to(query.dtype)
        cache, _ = kv.layer(self.kv_layer)  # one latent per token: the pool's K and V views are the same
        if self.index_topk:
            index_q, index_k, index_weights = self.indexer(x, q_resid, cos, sin) if self.indexer is not None else (
                None, c.new_zeros(t, self.index_head_dim), None)  # a layer sharing another's choice: no index key
            key = torch.cat([c, rotated[:, self.heads], index_k], dim=-1)[:, None]  # [T, 1, rank + rope + index]
            o = indexed_attention(query, key, index_q, index_weights, cache, batch, self.index_topk)
        else:
            key = torch.cat([c, rotated[:, self.heads]], dim=-1)[:, None]  # [T, 1, rank + rope]: the cache entry
            o = paged_attention(query, key, key, cache, cache, batch)  # the latents are the values too
        out = torch.einsum("thr,hvr->thv", o[..., : self.rank], w[:, self.nope :])  # W_UV
        for rows, kv_b in adapters:  # and s·B_UV·A's
            b = kv_b.bt.T.unflatten(0, (self.heads, -1))[:, self.nope :]
            _add_rows(out, rows, o[..., : self.rank],
                      lambda lat, b=b, kv_b=kv_b: torch.einsum("thk,hvk->thv", lat @ kv_b.a.T, b), kv_b.scaling)
        if self.gated:
            out = (out * torch.sigmoid(gate.float())).to(out.dtype)
        return linear("o_proj", out.reshape(t, self.heads * self.v))


def _add_rows(y: torch.Tensor, rows: slice | torch.Tensor, x: torch.Tensor, delta, scaling: float) -> None:
    """``y[rows] += scaling * delta(x[rows])``, rows a slice or indices (an adapter's tokens)."""
    if isinstance(rows, slice):
        y[rows].add_(delta(x[rows]), alpha=scaling)
    else:
        y.index_add_(0, rows, delta(x.index_select(0, rows)), alpha=scaling)


def softmax_scale(config: ModelConfig) -> float:
    """transformers' score scale: qk_head_dim ** -0.5, times YaRN's mscale_all_dim correction squared."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    scaling = config.rope_scaling or {}
    if config.rope_type != "default" and scaling.get("mscale_all_dim"):
        scale *= yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"])) ** 2
    return scale
