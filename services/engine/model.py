"""A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over paged KV; Gemma 2 / 3's
differences (sandwich norms, GELU gating, scaled embeddings and queries, soft-capped logits, a RoPE of the
sliding layers' own), and those of the other architectures ``model_config.py`` lists, are options of the same
modules, set by ``ModelConfig``; a mixture-of-experts layer has a ``SparseMoE`` (moe.py) where the others have
an ``MLP``.

The model knows nothing about scheduling: it takes flat token ids and positions plus an ``AttentionBatch``
that says where each token's K/V lives. q/k/v and gate/up projections are fused at load time (one matmul
each instead of three and two); ``load_weights`` maps Hugging Face names onto the fused parameters.

Two paths over the same weights: the modules' own ``forward`` (torch ops, any device and dtype), and, when
the batch carries the fused CPU kernels and the model's blocks are Llama-shaped (``fused_blocks``; a hybrid's
linear layers and gated attention are called as modules there), ``_forward_fused``: one flat loop over each
layer's tensors. On the
tiny model a 64-decode pass is ~1.6 ms, and the modules' calls and attribute look-ups cost ~0.1 ms of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.activations import ACTIVATIONS, rms_norm, weightless_rms_norm
from services.engine.attention import AttentionBatch, paged_attention
from services.engine.bitnet import quantize_activations
from services.engine.gated_delta_net import GatedDeltaNet
from services.engine.kda import KimiDeltaAttention
from services.engine.kv_pool import PagedKVPool
from services.engine.lightning import LightningAttention
from services.engine.linear_attention_config import (
    KdaShape,
    LightningShape,
    LinearAttentionShape,
    Mamba1Shape,
    Mamba2Shape,
    RgLruShape,
    ShortConvShape,
)
from services.engine.lora import LoraBatch, adapted
from services.engine.mamba1 import Mamba1Mixer
from services.engine.mamba2 import Mamba2Mixer
from services.engine.mla import LatentAttention
from services.engine.model_config import ModelConfig
from services.engine.moe import SparseMoE, copy_expert, expert_target, missing_experts
from services.engine.rglru import RecurrentBlock
from services.engine.rope import RotaryEmbedding
from services.engine.short_conv import GatedShortConv
from services.engine.weight_names import checkpoint_name

if TYPE_CHECKING:
    from services.engine.cpu_kernels import CpuKernels


class RMSNorm(nn.Module):
    def __init__(self, size: int | tuple[int, ...], eps: float, scale_in_fp32: bool = False) -> None:
        """``scale_in_fp32``: Gemma's order in low precision, the weight applied before the cast back."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.scale_in_fp32 = scale_in_fp32

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm with the residual add folded in, as vLLM does: returns ``(norm(x + residual), x + residual)``,
        or ``(norm(x), x)`` without a residual."""
        if residual is not None:
            x = x + residual
        return self._norm(x), x

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.scale_in_fp32)


class LayerNorm(RMSNorm):
    """Cohere's LayerNorm: the mean subtracted, no bias, in fp32 (``layer_norm``); RMSNorm's interface."""

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.eps)


def norms_in_fp32(model: nn.Module) -> None:
    """A model whose RMSNorms scale by 1 + w (Gemma's, Qwen3-Next's) keeps their weights in fp32, as transformers
    computes 1 + w in fp32 each time: rounded to a low-precision dtype once, the scale would round otherwise."""
    for module in model.modules():
        if type(module) is RMSNorm:
            module.float()


class SelfGatedRMSNorm(RMSNorm):
    """A.X K2's gated norm: the RMSNorm's output ``y`` times ``sigmoid(fc2(silu(fc1(y))))`` (a low-rank MLP of it,
    the sigmoid in fp32, the product cast back), as transformers' ``AXK2GatedRMSNorm`` computes it."""

    def __init__(self, size: int, eps: float, rank: int) -> None:
        super().__init__(size, eps)
        self.fc1 = nn.Linear(size, rank, bias=False)
        self.fc2 = nn.Linear(rank, size, bias=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        y = super()._norm(x)
        return (y * torch.sigmoid(self.fc2(F.silu(self.fc1(y))).float())).to(y.dtype)


class Fp32StreamRMSNorm(RMSNorm):
    """Mamba's norms with ``residual_in_fp32``: the stream adds up in float32 (the mixer's output promoted), a
    layer's norm reads it cast to the model's dtype, and the final norm reads it as it is, its weight applied in
    float32 and the result cast back for the head, as transformers' Mamba blocks and norm_f compute. The same
    numbers as RMSNorm in float32."""

    def __init__(self, size: int, eps: float, final: bool) -> None:
        super().__init__(size, eps)
        self.final = final

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        stream = x.float() if residual is None else residual + x
        if x.dtype == torch.float32:
            return self._norm(stream), stream
        if not self.final:
            return self._norm(stream.to(x.dtype)), stream
        h = stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * h).to(x.dtype), stream


class WeightlessLayerNorm(nn.Module):
    """OLMo's LayerNorm: no weight, no bias, in fp32; RMSNorm's interface."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.shape, self.eps = (size,), eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        return self._norm(x), x

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.shape, None, None, self.eps).to(x.dtype)


class WeightlessRMSNorm(WeightlessLayerNorm):
    """nanochat's RMSNorm: no weight, in fp32 and cast back; RMSNorm's interface."""

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return weightless_rms_norm(x, self.eps)


class BiasedLayerNorm(RMSNorm):
    """StarCoder2's LayerNorm: torch's, with a bias, in the model's dtype; RMSNorm's interface."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__(size, eps)
        self.bias = nn.Parameter(torch.zeros(size))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm without a bias over the last dimension, as transformers' Cohere computes it: in fp32, the
    weight applied before the cast back; ``weight`` may hold one row per head (``[heads, dim]``)."""
    h = x.float()
    h = h - h.mean(-1, keepdim=True)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * h).to(x.dtype)


def norm_heads(qk: torch.Tensor, heads: int, q_weight: torch.Tensor, k_weight: torch.Tensor,
               eps: float, scale_in_fp32: bool = False) -> torch.Tensor:
    """Qwen3's (and Gemma 3's) per-head RMSNorm of q (the first ``heads`` heads of ``qk``) and of k, as a new
    ``[T, heads + kv_heads, D]`` tensor."""
    return torch.cat([rms_norm(qk[:, :heads], q_weight, eps, scale_in_fp32),
                      rms_norm(qk[:, heads:], k_weight, eps, scale_in_fp32)], dim=1)


def norm_projections(qkv: torch.Tensor, q_size: int, kv_size: int, q_weight: torch.Tensor, k_weight: torch.Tensor,
                     eps: float, scale_in_fp32: bool = False) -> torch.Tensor:
    """OLMo's RMSNorm of the whole q and k projections (not per head), as a new ``[T, q_size + kv_size]``
    tensor."""
    return torch.cat([rms_norm(qkv[:, :q_size], q_weight, eps, scale_in_fp32),
                      rms_norm(qkv[:, q_size : q_size + kv_size], k_weight, eps, scale_in_fp32)], dim=1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.kv_layer = config.kv_layers.index(layer)  # its layer of the KV pool (which linear layers skip)
        self.sliding = config.attends_locally(layer)
        # Llama 4: RoPE layers L2-norm q and k after rotating them.
        self.l2_norm_eps = config.rms_norm_eps if config.qk_l2_norm and layer not in config.nope_layers else None
        # MiMo-V2-Flash's sliding layers have more KV heads.
        self.heads, (self.kv_heads, self.head_dim) = config.query_heads(layer), config.layer_heads(layer)
        self.q_size, self.kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        # MiMo-V2-Flash's values are narrower than its keys: cached padded to head_dim with zeros, which weigh
        # nothing in attention's output (its first value_dim features, exactly as unpadded).
        self.value_dim = config.value_head_dim or self.head_dim
        self.value_scale = config.value_scale
        self.v_size = self.kv_heads * self.value_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + self.kv_size + self.v_size,
                                  bias=config.attention_bias)
        self.o_proj = nn.Linear(self.heads * self.value_dim, config.hidden_size, bias=config.o_proj_bias)
        # BitNet: o_proj reads attention's output RMS-normed.
        self.attn_sub_norm = RMSNorm(self.heads * self.value_dim, config.rms_norm_eps) if config.sub_norms else None
        # BitNet's ternary projections read their inputs rounded per token to 8 bits (bitnet.py).
        self.ternary = config.ternary_weights is not None
        self.clip_qkv = config.clip_qkv
        # AFMoE, MiniCPM5-MoE: the output gated per feature by the sigmoid of a projection of the input; LFM3: per
        # head.
        self.gate_per_head = config.attn_output_gate == "per_head"
        self.gate_softplus = config.attn_gate_softplus  # Laguna's
        self.gate_proj = None if config.attn_output_gate is None else nn.Linear(
            config.hidden_size, self.heads if self.gate_per_head else self.q_size,
            bias=config.attn_output_gate == "in_query" and config.attention_bias)
        self.gate_bias = nn.Parameter(torch.zeros(self.heads)) if config.attn_gate_head_bias else None  # Beam's
        # GPT-OSS: a learned logit per head that joins its softmax (attention.py).
        self.sinks = nn.Parameter(torch.empty(self.heads)) if config.attention_sinks and (
            config.sink_layers is None or layer in config.sink_layers) else None
        # MiMo-V2-Flash's layers without sinks take their softmax as those with them do (max-shifted, in the
        # scores' dtype: transformers runs its eager attention in every layer): a sink of -inf, which weighs
        # nothing, gives that form.
        self.sinkless_eager = config.attention_sinks and self.sinks is None
        self.sink_scaled = config.sinks_scale_output  # GraniteSWA's form of them
        self.q_norm = self.k_norm = None
        self.qk_norm_whole = config.qk_norm_whole
        self.norm_after_rope = config.qk_norm_after_rope  # Hunyuan
        self.qk_layer_norm = config.qk_norm and config.layer_norm
        if self.qk_layer_norm and config.norm_bias:  # Persimmon: torch's, with a bias, one for every head
            self.q_norm = BiasedLayerNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = BiasedLayerNorm(config.head_dim, config.rms_norm_eps)
        elif self.qk_layer_norm:  # Cohere (Command R+): a LayerNorm weight per head
            self.q_norm = LayerNorm((self.heads, config.head_dim), config.rms_norm_eps)
            self.k_norm = LayerNorm((self.kv_heads, config.head_dim), config.rms_norm_eps)
        elif config.qk_norm:
            whole = config.qk_norm_whole
            self.q_norm = RMSNorm(self.q_size if whole else config.head_dim, config.rms_norm_eps,
                                  config.norm_scale_in_fp32)
            self.k_norm = RMSNorm(self.kv_size if whole else config.head_dim, config.rms_norm_eps,
                                  config.norm_scale_in_fp32)
        # Attention scales scores by head_dim ** -0.5, or by this (Gemma's query_pre_attn_scalar ** -0.5, ...).
        self.attn_scale = config.attn_scale
        # ALiBi's slope per head (BLOOM, MPT), fp32 whatever the weights' dtype: set as the model loads.
        self.alibi: torch.Tensor | None = None
        self.alibi_bf16 = config.alibi_bf16
        # A checkpoint's calibrated (key, value) scales (kv_cache_scheme), set as the model loads; a float8 pool
        # uses them (kv_quant.py), another ignores them.
        self.kv_scale: tuple[float, float] | None = None

    def forward(self, x, cos, sin, batch: AttentionBatch, kv: PagedKVPool, lora: LoraBatch | None,
                q_mult: torch.Tensor | None = None) -> torch.Tensor:
        """``q_mult`` (``[T, 1, 1]``): each token's query scale by position, where the model has one for this layer
        (``query_scales``)."""
        qkv = self.qkv_proj(quantize_activations(x) if self.ternary else x)
        if lora is not None:
            lora.add(qkv, x, self.layer, "qkv")
        return self.attend(qkv, x, cos, sin, batch, kv, lora, q_mult)

    def attend(self, qkv, x, cos, sin, batch: AttentionBatch, kv: PagedKVPool, lora: LoraBatch | None,
               q_mult: torch.Tensor | None = None) -> torch.Tensor:
        """The rest of ``forward`` from the fused q/k/v projection of ``x`` (Zamba2 adds its adapters' first)."""
        t = x.shape[0]
        if self.clip_qkv is not None:  # OLMo
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        # q and k rotate in one pass: they are adjacent in the fused projection's output.
        if self.qk_norm_whole:
            qk = norm_projections(qkv, self.q_size, self.kv_size, self.q_norm.weight, self.k_norm.weight,
                                  self.q_norm.eps, self.q_norm.scale_in_fp32).view(t, -1, self.head_dim)
        else:
            qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)
            if self.qk_layer_norm:
                qk = torch.cat([self.q_norm._norm(qk[:, : self.heads]), self.k_norm._norm(qk[:, self.heads :])], dim=1)
            elif self.q_norm is not None and not self.norm_after_rope:
                qk = norm_heads(qk, self.heads, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps,
                                self.q_norm.scale_in_fp32)
        if cos is not None:  # None: a layer without positions (SmolLM3's NoPE layers)
            qk = RotaryEmbedding.apply(qk, cos, sin)
        if self.norm_after_rope:
            qk = norm_heads(qk, self.heads, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps,
                            self.q_norm.scale_in_fp32)
        if self.l2_norm_eps is not None:
            qk = weightless_rms_norm(qk, self.l2_norm_eps)  # each head over its root mean square
        q, k = qk[:, : self.heads], qk[:, self.heads :]
        if q_mult is not None:
            q = (q * q_mult).to(q.dtype)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.kv_heads, self.value_dim)
        if self.value_scale != 1.0:  # MiMo-V2-Flash
            v = v * self.value_scale
        if self.value_dim < self.head_dim:
            v = F.pad(v, (0, self.head_dim - self.value_dim))
        k_cache, v_cache = kv.layer(self.kv_layer)
        sinks = self.sinks if not self.sinkless_eager else self._no_sinks(q.device)
        o = paged_attention(q, k, v, k_cache, v_cache, batch, self.sliding, sinks, self.attn_scale,
                            self.alibi, self.alibi_bf16, self.kv_scale, self.sink_scaled)
        o = o.reshape(t, self.q_size) if self.value_dim == self.head_dim else o[..., : self.value_dim].reshape(t, -1)
        if self.gate_proj is not None:
            gate = adapted(self.gate_proj, x, lora, self.layer, "self_attn.gate_proj")
            if self.gate_bias is not None:  # one per head, over its features
                gate = (gate.view(t, self.heads, -1) + self.gate_bias[:, None]).view(t, -1)
            gate = F.softplus(gate.float()).to(gate.dtype) if self.gate_softplus else torch.sigmoid(gate)
            o = (o.view(t, self.heads, -1) * gate[..., None]).view(t, -1) if self.gate_per_head else o * gate
        if self.attn_sub_norm is not None:
            o = self.attn_sub_norm._norm(o)
        out = self.o_proj(quantize_activations(o) if self.ternary else o)
        return out if lora is None else lora.add(out, o, self.layer, "o")

    def _no_sinks(self, device: torch.device) -> torch.Tensor:
        """A sink of -inf per head (fp32, as the fused kernels take sinks), made once."""
        cached = self.__dict__.get("_no_sinks_cache")
        if cached is None or cached.device != device:
            cached = self.__dict__["_no_sinks_cache"] = torch.full((self.heads,), float("-inf"), device=device)
        return cached


def query_scales(config: ModelConfig, positions: torch.Tensor, dtype: torch.dtype,
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Each token's query scale by position, ``[T, 1, 1]``, computed once a pass, for (NoPE layers, RoPE layers),
    as transformers computes them (None where the model has none). Llama 4's NoPE layers (fp32, the product
    cast back): ``1 + attn_scale * log1p(floor((p + 1) / floor_scale))``, so that attention over a long context
    stays sharp; Ministral 3's RoPE layers (cast to the model's dtype first): ``1 + beta * log(1 + floor(p /
    period))``."""
    nope = rope = None
    if config.nope_temperature is not None:
        floor_scale, attn_scale = config.nope_temperature
        nope = (torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0)[:, None, None]
    if config.nope_query_power is not None:  # Beam's
        power, scale = config.nope_query_power
        nope = torch.exp(power * torch.log1p((positions.float() + 1) / scale))[:, None, None]
    if config.q_position_scale is not None:
        beta, period = config.q_position_scale
        rope = (1 + beta * torch.log(1 + torch.floor(positions.float() / period)))[:, None, None].to(dtype)
    return nope, rope


class XIELU(nn.Module):
    """The xIELU activation (Apertus; arXiv 2411.13010) as transformers computes it: quadratic above zero,
    an expm1 curve below, its two slopes learned (stored before softplus), ``beta`` and ``eps`` fixed."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha_p = nn.Parameter(torch.empty(1))
        self.alpha_n = nn.Parameter(torch.empty(1))
        self.beta = nn.Parameter(torch.empty(()))
        self.eps = nn.Parameter(torch.empty(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, intermediate: int | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.intermediate = intermediate or config.intermediate_size
        self.gated = config.mlp_gated
        bias = config.mlp_bias
        if self.gated:
            self.gate_up_proj = nn.Linear(config.hidden_size, 2 * self.intermediate, bias=bias)
        else:  # GPT-2, Arcee, StarCoder2: no gate
            self.up_proj = nn.Linear(config.hidden_size, self.intermediate, bias=bias)
        self.down_proj = nn.Linear(self.intermediate, config.hidden_size, bias=bias)
        # BitNet: down_proj reads the gated product RMS-normed.
        self.ffn_sub_norm = RMSNorm(self.intermediate, config.rms_norm_eps) if config.sub_norms else None
        self.ternary = config.ternary_weights is not None  # BitNet's (bitnet.py)
        if config.hidden_act == "xielu":  # Apertus: an activation with learned parameters, per layer
            self.act_fn = XIELU()
            self.act = self.act_fn.forward  # a bound method: the module is registered once, as act_fn
        else:
            self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor, lora: LoraBatch | None) -> torch.Tensor:
        x_in = quantize_activations(x) if self.ternary else x
        if not self.gated:
            up = self.up_proj(x_in)
            h = self.act(up if lora is None else lora.add(up, x, self.layer, "gate_up"))
        else:
            gate_up = self.gate_up_proj(x_in)
            if lora is not None:
                lora.add(gate_up, x, self.layer, "gate_up")
            gate, up = gate_up.split(self.intermediate, dim=-1)
            h = self.act(gate) * up
        if self.ffn_sub_norm is not None:
            h = self.ffn_sub_norm._norm(h)
        out = self.down_proj(quantize_activations(h) if self.ternary else h)
        return out if lora is None else lora.add(out, h, self.layer, "down")


# A linear layer's mixer by its shape: the attribute it is held by (the name checkpoints give it) and its class.
_LINEAR_MIXERS = {LinearAttentionShape: ("linear_attn", GatedDeltaNet), Mamba2Shape: ("mamba", Mamba2Mixer),
                  Mamba1Shape: ("mamba", Mamba1Mixer), ShortConvShape: ("conv", GatedShortConv),
                  KdaShape: ("self_attn", KimiDeltaAttention), LightningShape: ("self_attn", LightningAttention),
                  RgLruShape: ("self_attn", RecurrentBlock)}


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        def norm():
            return _norm(config, config.hidden_size)

        # Nemotron-H: this layer is one sublayer, its mixer or its MLP, behind input_layernorm.
        self.sublayer = config.sublayers[layer] if config.sublayers else None
        if self.sublayer is not None:
            self.input_layernorm = norm()
            self.mixer = self._add_mixer(config, layer) if self.sublayer == "mixer" else None
            if self.sublayer == "mlp":
                self.mlp = _mlp(config, layer)
            return
        self.pre_norms = config.pre_norms or layer in config.pre_norm_layers
        if self.pre_norms:
            self.input_layernorm = _gated_norm(config) if config.self_gated_norm_rank else norm()
        else:  # OLMo 2, EXAONE 4: the MLP's output is normed, and no sublayer's input
            self.post_feedforward_layernorm = norm()
        # DeepSeek-V2's and -V3's latent attention, the others' grouped-query attention, or in a hybrid's linear
        # layers Gated DeltaNet or Mamba-2 (under the names checkpoints hold them by), called as attention is.
        self.mixer = self._add_mixer(config, layer)
        self.parallel = config.parallel_block
        self.parallel_outputs_first = config.parallel_outputs_first
        self.parallel_mlp_norm = config.parallel_mlp_norm
        if not self.parallel or self.parallel_mlp_norm:  # Cohere: one norm per layer, which the MLP reads too
            self.post_attention_layernorm = _gated_norm(config) if config.self_gated_norm_rank and config.is_moe(layer) \
                else norm()
        self.mlp = _mlp(config, layer)
        self.sandwich = config.sandwich_norms
        # Beam: (out's, the stream's) factors of attention's and of the MLP's depth-scaled adds.
        self.depth_scales = None if not config.depth_scaled_residuals else tuple(
            (1 / math.sqrt(n), math.sqrt((n - 1) / n)) for n in (2 * (layer + 1), 2 * (layer + 1) + 1))
        self.residual_scale = config.residual_scale
        # MiniMax-Text-01: (attention's alpha, beta, the MLP's alpha, beta) of its normed stream, by the layer's kind.
        factors = config.normed_stream
        self.normed_stream = None if factors is None else (
            (*factors[2:4], *factors[4:]) if layer in config.linear_layers else (*factors[:2], *factors[4:]))
        if self.sandwich:
            self.pre_feedforward_layernorm = norm()
            self.post_feedforward_layernorm = norm()

    def _add_mixer(self, config: ModelConfig, layer: int) -> str:
        """Adds the layer's mixer under the name checkpoints hold it by, and returns that name (Falcon-H1's two:
        the method that runs them side by side)."""
        if layer in config.linear_layers:
            name, mixer = _LINEAR_MIXERS[type(config.linear_attention)]
            setattr(self, name, mixer(config, layer))
            if not config.parallel_mixers:
                return name
        self.self_attn = LatentAttention(config, layer, RMSNorm) if config.mla else Attention(config, layer)
        return "mix_in_parallel" if config.parallel_mixers else "self_attn"

    def mix_in_parallel(self, h, cos, sin, batch: AttentionBatch, kv, lora: LoraBatch | None = None,
                        q_mult: torch.Tensor | None = None) -> torch.Tensor:
        """Falcon-H1: the Mamba-2 mixer's output plus attention's, both of the layer's norm (their multipliers
        are in the weights), as transformers adds them."""
        return self.mamba(h, cos, sin, batch, kv, lora) + self.self_attn(h, cos, sin, batch, kv, lora)

    def forward(self, x, residual, cos, sin, batch: AttentionBatch, kv, lora: LoraBatch | None = None,
                q_mult: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` is the previous block's output, ``residual`` the stream before it (None for the first layer);
        returns the same pair for the next layer, so each residual add rides along with the next norm.
        ``q_mult``: the queries' scale by position, for attention that has one (``query_scales``)."""
        if self.sublayer is not None:  # Nemotron-H: one sublayer
            h, residual = self.input_layernorm(x, residual)
            if self.mixer is None:
                return self.mlp(h, lora), residual
            return getattr(self, self.mixer)(h, cos, sin, batch, kv, lora), residual
        attn = getattr(self, self.mixer)
        if not self.pre_norms:  # OLMo 2, EXAONE 4: sublayers read the stream as it is, their outputs are normed
            residual = x if residual is None else x + residual
            residual = residual + self.post_attention_layernorm._norm(attn(residual, cos, sin, batch, kv,
                                                                                    lora))
            return self.post_feedforward_layernorm._norm(self.mlp(residual, lora)), residual
        if self.normed_stream is not None:
            return self._normed_stream(x, residual, attn, cos, sin, batch, kv, lora)
        h, residual = self.input_layernorm(x, residual)
        if self.parallel:  # in transformers' order: the MLP's output (or both outputs' sum) is the next x
            out = attn(h, cos, sin, batch, kv, lora)
            if self.parallel_mlp_norm:  # GPT-NeoX: the MLP's own norm of the stream attention read
                h = self.post_attention_layernorm._norm(residual)
            if self.parallel_outputs_first:
                return out + self.mlp(h, lora), residual
            return self.mlp(h, lora), residual + out
        h = attn(h, cos, sin, batch, kv, lora) if q_mult is None else attn(
            h, cos, sin, batch, kv, lora, q_mult)
        if self.sandwich:  # the attention's output is normed before it joins the stream, the MLP's too
            h, _ = self.post_attention_layernorm(h)
            if self.depth_scales is not None:  # Beam: each add weighs the output and the stream by depth
                (attn_out, attn_stream), (mlp_out, mlp_stream) = self.depth_scales
                stream = h * attn_out + residual * attn_stream
                h, _ = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm._norm(stream), lora))
                return h * mlp_out, stream * mlp_stream
            if self.residual_scale != 1.0:  # HyperCLOVA X: Granite's scale after the norm
                h = h * self.residual_scale
            h, residual = self.pre_feedforward_layernorm(h, residual)
            h, _ = self.post_feedforward_layernorm(self.mlp(h, lora))
            return h if self.residual_scale == 1.0 else h * self.residual_scale, residual
        if self.residual_scale != 1.0:  # Granite scales each sublayer's output before it joins the stream
            h, residual = self.post_attention_layernorm(h * self.residual_scale, residual)
            return self.mlp(h, lora) * self.residual_scale, residual
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h, lora), residual

    def _normed_stream(self, x, residual, attn, cos, sin, batch: AttentionBatch, kv, lora: LoraBatch | None,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """MiniMax-Text-01's block, in transformers' order: ``h = norm(stream)``, ``a = alpha * h + beta *
        attn(h)``, ``h2 = norm(a)``, the next stream ``alpha' * h2 + beta' * mlp(h2)``; returned as the pair the next
        norm adds (``beta' * mlp(h2)``, ``alpha' * h2``)."""
        attn_alpha, attn_beta, mlp_alpha, mlp_beta = self.normed_stream
        h = self.input_layernorm._norm(x if residual is None else x + residual)
        h = self.post_attention_layernorm._norm(h * attn_alpha + attn(h, cos, sin, batch, kv, lora) * attn_beta)
        return self.mlp(h, lora) * mlp_beta, h * mlp_alpha


class NormedSparseMoE(SparseMoE):
    """A.X K1's MoE block: its output (experts plus shared expert) RMS-normed."""

    def __init__(self, config: ModelConfig, shared_expert: nn.Module | None, layer: int) -> None:
        super().__init__(config, shared_expert, layer)
        self.post_mlp_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None,
                act_mul: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        return self.post_mlp_layernorm._norm(super().forward(x, lora, act_mul))


def _mlp(config: ModelConfig, layer: int) -> MLP | SparseMoE:
    """The layer's MLP: experts (beside a shared MLP where the model has one) or a dense MLP."""
    if config.is_moe(layer):
        shared = config.shared_expert_intermediate_size
        return (NormedSparseMoE if config.moe_output_norm else SparseMoE)(
            config, MLP(config, layer, shared) if shared else None, layer)
    return MLP(config, layer)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # Given its (uninitialized) weight, Embedding skips reset_parameters: on the meta device its normal_
        # goes through torch._refs, whose first use imports torch._dynamo (~3 s of each worker's start-up).
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        # OPT's and GPT-2's learned positions, added to the embeddings.
        self.embed_positions = None if config.learned_positions is None else nn.Embedding(
            config.max_position_embeddings + config.learned_positions, config.hidden_size,
            _weight=torch.empty(config.max_position_embeddings + config.learned_positions, config.hidden_size))
        self.embed_norm = _norm(config, config.hidden_size) if config.embed_norm else None  # BLOOM's
        if config.gemma4 is not None:  # Gemma 4's layers build on this module's MLP and norm
            from services.engine.gemma4_layer import Gemma4Layer, add_per_layer_inputs

            self.layers = nn.ModuleList(Gemma4Layer(config, i) for i in range(config.num_hidden_layers))
            if config.gemma4.per_layer_input:
                add_per_layer_inputs(self, config)
        elif config.shared_blocks is None:
            self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        else:  # Zamba2's; its module builds on this one's attention, MLP and norm
            from services.engine.zamba2_layer import Zamba2Layer, tie_shared_blocks

            self.layers = nn.ModuleList(Zamba2Layer(config, i) for i in range(config.num_hidden_layers))
            tie_shared_blocks(self.layers, config.shared_blocks)
        self.norm = _norm(config, config.hidden_size, final=True)


def _gated_norm(config: ModelConfig) -> SelfGatedRMSNorm:
    return SelfGatedRMSNorm(config.hidden_size, config.rms_norm_eps, config.self_gated_norm_rank)


def _norm(config: ModelConfig, size: int, final: bool = False) -> RMSNorm | WeightlessLayerNorm:
    """The model's norm of ``size`` features: an RMSNorm, Cohere's LayerNorm, or StarCoder2's with a bias;
    ``final``: the one after the last layer."""
    if config.residual_in_fp32:
        return Fp32StreamRMSNorm(size, config.rms_norm_eps, final)
    if config.norm_bias:
        return BiasedLayerNorm(size, config.rms_norm_eps)
    if not config.norm_affine:
        return (WeightlessLayerNorm if config.layer_norm else WeightlessRMSNorm)(size, config.rms_norm_eps)
    if config.layer_norm:
        return LayerNorm(size, config.rms_norm_eps)
    return RMSNorm(size, config.rms_norm_eps, config.norm_scale_in_fp32)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, lm_head: bool = True) -> None:
        """``lm_head`` False: an embedding model's checkpoint without an output head (pooling.py); the model
        gives hidden states only."""
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.rotary = RotaryEmbedding(config.full_attention)
        self.local_rotary = RotaryEmbedding(config, local=True) if config.local_rope_theta is not None else None
        self.lm_head = nn.Linear(config.hidden_size, config.head_vocab_size or config.vocab_size,
                                 bias=config.lm_head_bias) if lm_head else None
        if config.tie_word_embeddings and lm_head:
            self.lm_head.weight = self.model.embed_tokens.weight
        # A sequence classifier's head (``score``, as transformers names it), applied to pooled hidden states.
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False) if config.num_labels else None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        batch: AttentionBatch,
        kv: PagedKVPool,
        logits_index: torch.Tensor,
        lora: LoraBatch | None = None,
        hidden: bool = False,
    ) -> torch.Tensor:
        """Runs the flat batch and returns logits ``[len(logits_index), vocab]`` of the selected tokens only, or
        with ``hidden`` their final hidden states (after the last norm; ``head`` makes logits of them);
        ``lora``: the adapters of the batch's sequences (lora.py)."""
        c = self.config
        if c.gemma4 is not None:
            from services.engine import gemma4_layer

            x = gemma4_layer.forward(self, input_ids, positions, batch, kv, logits_index)
            return x if hidden else self.head(x)
        if batch.kernels is not None and c.fused_blocks:
            x = self._forward_fused(input_ids, positions, batch, kv, logits_index, batch.kernels, lora)
            return x if hidden else self.head(x)
        x = self.model.embed_tokens(input_ids)
        if c.embed_scale != 1.0:  # Gemma's rounded to the weights' dtype first, as transformers scales
            x = x * (torch.tensor(c.embed_scale, dtype=x.dtype) if c.embed_scale_rounded else c.embed_scale)
        if self.model.embed_positions is not None:  # after the tokens' scale (BioGPT's), as transformers adds them
            x = x + self.model.embed_positions(positions + c.learned_positions)
        if self.model.embed_norm is not None:
            x, _ = self.model.embed_norm(x)
        rope_dtype = torch.float32 if c.rope_in_fp32 else x.dtype
        rope = self.rotary.cos_sin(positions, rope_dtype)
        local = self.local_rotary.cos_sin(positions, rope_dtype) if self.local_rotary is not None else rope
        nope_scale, rope_scale = query_scales(c, positions, x.dtype)
        residual = None
        embeddings = x if c.shared_blocks is not None else None  # Zamba2's shared blocks read them again
        for i, layer in enumerate(self.model.layers):
            nope = i in c.nope_layers
            cos, sin = (None, None) if nope else local if c.slides(i) else rope
            if embeddings is not None:
                x, residual = layer(x, residual, cos, sin, batch, kv, embeddings)
            else:
                x, residual = layer(x, residual, cos, sin, batch, kv, lora, nope_scale if nope else rope_scale)
        x, _ = self.model.norm(x[logits_index], residual[logits_index])
        return x if hidden else self.head(x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (fp32) of final hidden states ``x`` (``forward(..., hidden=True)``)."""
        c = self.config
        if self.lm_head is None:
            raise ValueError("this checkpoint has no output head (an embedding model): it cannot sample tokens")
        logits = self.lm_head(x)
        if c.logits_divisor != 1.0:  # Granite
            logits = logits / c.logits_divisor
        if c.logit_scale != 1.0:  # Cohere
            logits = logits * c.logit_scale
        if c.final_softcap is not None:  # Gemma 2
            logits = torch.tanh(logits / c.final_softcap) * c.final_softcap
        if logits.shape[-1] < c.vocab_size:  # Apertus 1.5's pruned head: the other tokens never sampled
            return F.pad(logits.float(), (0, c.vocab_size - logits.shape[-1]), value=float("-inf"))
        return logits.float()

    def _forward_fused(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                       kv: PagedKVPool, logits_index: torch.Tensor, kernels: CpuKernels,
                       lora: LoraBatch | None) -> torch.Tensor:
        """``forward`` with the fused CPU kernels for norms (residual add folded in), RoPE and SiLU·mul; the same
        ops in the same order as the modules, so the same numbers as the torch path up to the kernels' rounding.
        A layer whose mixer is not plain attention (a hybrid's linear layers, gated attention) has its mixer
        module called, with the kernels in ``batch``. Returns the selected tokens' final hidden states."""
        c = self.config
        t, eps, d = input_ids.shape[0], c.rms_norm_eps, c.head_dim
        q_size, kv_size = c.num_attention_heads * d, c.num_key_value_heads * d
        x = F.embedding(input_ids, self.model.embed_tokens.weight)
        rope = self.rotary.cos_sin(positions, x.dtype)
        local = self.local_rotary.cos_sin(positions, x.dtype) if self.local_rotary is not None else rope
        residual = None
        for i, w in enumerate(self._layer_weights()):
            h = kernels.add_rms_norm(x, residual, w.input_norm, eps)
            residual = x if residual is None else residual  # the kernel added x into residual in place
            cos, sin = (None, None) if i in c.nope_layers else local if c.slides(i) else rope
            if w.mixer is not None:
                x = self._fused_tail(w.mixer(h, cos, sin, batch, kv, lora), residual, w, i, kernels, lora)
                continue
            qkv = F.linear(h, w.qkv, w.qkv_bias)
            if lora is not None:
                lora.add(qkv, h, i, "qkv")
            if c.qk_norm_whole:  # OLMoE
                qk = norm_projections(qkv, q_size, kv_size, w.q_norm, w.k_norm, eps).view(t, -1, d)
            else:
                qk = qkv[:, : q_size + kv_size].view(t, -1, d)  # q and k rotate in one pass, as in Attention
                if w.q_norm is not None and not c.qk_norm_after_rope:
                    qk = norm_heads(qk, c.num_attention_heads, w.q_norm, w.k_norm, eps)
            if cos is not None:
                kernels.rope_(qk, cos, sin)
            if c.qk_norm_after_rope:  # Hunyuan
                qk = norm_heads(qk, c.num_attention_heads, w.q_norm, w.k_norm, eps)
            v = qkv[:, q_size + kv_size :].view(t, c.num_key_value_heads, d)
            k_cache, v_cache = kv.layer(w.kv_layer)
            o = paged_attention(qk[:, : c.num_attention_heads], qk[:, c.num_attention_heads :], v, k_cache, v_cache,
                                batch, c.attends_locally(i))
            o = o.view(t, q_size)
            out = F.linear(o, w.o)
            out = out if lora is None else lora.add(out, o, i, "o")
            del qkv, qk, v, o  # freed before the MLP's big temporaries, as when Attention.forward returned
            x = self._fused_tail(out, residual, w, i, kernels, lora)
        return kernels.add_rms_norm(x[logits_index], residual[logits_index], self.model.norm.weight, eps)

    def _fused_tail(self, out: torch.Tensor, residual: torch.Tensor, w: _LayerWeights, layer: int,
                    kernels: CpuKernels, lora: LoraBatch | None) -> torch.Tensor:
        """The rest of a block after its mixer's output ``out``: into the stream (``residual``, in place), the
        MLP's norm, the MLP; with sandwich norms (Gemma 2's, LFM3's) both outputs normed before they join it.
        Returns the MLP's output, which the next norm adds in."""
        eps = self.config.rms_norm_eps
        if w.pre_ff_norm is None:
            return self._fused_mlp(kernels.add_rms_norm(out, residual, w.post_norm, eps), w, layer, kernels, lora)
        h = kernels.add_rms_norm(kernels.add_rms_norm(out, None, w.post_norm, eps), residual, w.pre_ff_norm, eps)
        return kernels.add_rms_norm(self._fused_mlp(h, w, layer, kernels, lora), None, w.post_ff_norm, eps)

    @staticmethod
    def _fused_mlp(h: torch.Tensor, w: _LayerWeights, layer: int, kernels: CpuKernels,
                   lora: LoraBatch | None) -> torch.Tensor:
        if w.moe is not None:
            return w.moe(h, lora, act_mul=kernels.silu_mul)
        if lora is None:
            return F.linear(kernels.silu_mul(F.linear(h, w.gate_up)), w.down)
        act = kernels.silu_mul(lora.add(F.linear(h, w.gate_up), h, layer, "gate_up"))
        return lora.add(F.linear(act, w.down), act, layer, "down")

    def _layer_weights(self) -> list[_LayerWeights]:
        """Each layer's tensors, looked up once (the runner never moves or replaces a loaded model's parameters:
        ``load_weights`` copies into them)."""
        cached = self.__dict__.get("_layer_weights_cache")
        if cached is None:
            cached = [self._weights_of(i, layer) for i, layer in enumerate(self.model.layers)]
            self.__dict__["_layer_weights_cache"] = cached
        return cached

    def _weights_of(self, i: int, layer: DecoderLayer) -> _LayerWeights:
        mlp = (None, None, layer.mlp) if isinstance(layer.mlp, SparseMoE) else (
            layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight, None)
        sandwich = (layer.pre_feedforward_layernorm.weight, layer.post_feedforward_layernorm.weight) \
            if self.config.sandwich_norms else (None, None)
        if i in self.config.linear_layers or not self.config.plain_attention:
            return _LayerWeights(layer.input_layernorm.weight, None, None, None, layer.post_attention_layernorm.weight,
                                 *mlp, None, None, getattr(layer, layer.mixer), 0, *sandwich)
        attn = layer.self_attn
        return _LayerWeights(layer.input_layernorm.weight, attn.qkv_proj.weight, attn.qkv_proj.bias,
                             attn.o_proj.weight, layer.post_attention_layernorm.weight, *mlp,
                             *((attn.q_norm.weight, attn.k_norm.weight) if self.config.qk_norm else (None, None)),
                             None, attn.kv_layer, *sandwich)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads Hugging Face-named tensors into the fused q/k/v and gate/up and the stacked experts, each as it
        streams by. Raises ``KeyError`` naming what is missing."""
        params = dict(self.named_parameters(remove_duplicate=False))
        c = self.config
        # Where each part of a fused q/k/v projection goes, by its attention's widths (a layer's own where layer
        # types have their own); gate/up: halves of whatever width the target has.
        widths = {f"{name}.qkv_proj": (m.q_size, m.kv_size, m.v_size) for name, m in self.named_modules()
                  if hasattr(m, "qkv_proj") and hasattr(m, "v_size")}  # Gemma 4's too, v_size 0 where k is v
        widths.update({f"{name}.in_proj_qkv": (m.shape.key_dim, m.shape.key_dim, m.shape.value_dim)
                       for name, m in self.named_modules() if isinstance(m, GatedDeltaNet) and not m.grouped})
        fused_parts: dict[str, set[str]] = {}  # fused parameter -> parts copied into it
        experts: dict[str, set[tuple[int, str]]] = {}  # stacked expert parameter -> (expert, part) copied
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (c.mtp_layers and _layer_of(name) >= c.num_hidden_layers) \
                    or name.startswith("mtp."):
                # The RoPE buffer old checkpoints saved (recomputed); multi-token-prediction layers, after the
                # model's own or in a module of their own (Qwen3-Next), which transformers skips too.
                continue
            if self.config.norm_unit_offset and name.endswith("norm.weight") and ".linear_attn." not in name:
                # Gemma stores w for a scale of 1 + w, which transformers adds in fp32 to w in the model's dtype
                # (an RMSNorm's weight stays fp32 then: norms_in_fp32) or in the weight's dtype (Nemotron's).
                tensor = tensor.to(self.model.embed_tokens.weight.dtype).float() + 1.0
            name = checkpoint_name(name, c.architecture)
            if name == "lm_head.weight":
                self._untie_head(params)
            expert = expert_target(name, c.mlp_gated)
            if expert is not None:
                target, index, part = expert
                if target not in params:
                    raise KeyError(f"unexpected weight {name!r} in checkpoint (no mixture of experts there)")
                copy_expert(params[target], index, part, tensor, c.mlp_gated)
                experts.setdefault(target, set()).add((index, part))
                continue
            fused = _fused_target(name)
            if fused is None or fused[0] not in params:  # not fused here (latent attention's q_proj is its own)
                _copy(params, name, tensor)
                loaded.add(name)
                continue
            # Each part straight into its rows of the fused parameter, as it streams by: holding the parts until
            # the end held most of the model's weights twice.
            target, part = fused
            _copy_rows(params[target], name, *_rows(part, params[target].shape[0], widths.get(target.rsplit(".", 1)[0])),
                       tensor)
            fused_parts.setdefault(target, set()).add(part)
        for target, parts in fused_parts.items():
            wide = widths.get(target.rsplit(".", 1)[0], (1, 1, 1))
            qkv = bool(parts & {"q", "k", "v"})
            missing = [p for p, width in (zip("qkv", wide, strict=True) if qkv else (("gate", 1), ("up", 1)))
                       if width and p not in parts]
            if missing:
                raise KeyError(f"{target}: missing {missing} projection weights")
            loaded.add(target)
        for target, seen in experts.items():
            missing = missing_experts(target, seen, self.config.num_experts)
            if missing:
                raise KeyError(missing)
            loaded.add(target)
        if self.config.tie_word_embeddings and self.lm_head is not None:
            loaded.add("lm_head.weight")
            self._retie_head()
        tied = {id(params[name]) for name in loaded if name in params}  # Zamba2's shared blocks: one tensor, many names
        absent = sorted(name for name in set(params) - loaded if id(params[name]) not in tied)
        if absent:
            raise KeyError(f"checkpoint lacks weights: {', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}")

    def _untie_head(self, params: dict[str, nn.Parameter]) -> None:
        """A head the checkpoint stores wins over tying, as in transformers (Mistral3's published configs imply
        a tie their weights do not have)."""
        if self.lm_head.weight is self.model.embed_tokens.weight:
            self.lm_head.weight = params["lm_head.weight"] = nn.Parameter(torch.empty_like(self.lm_head.weight))

    def _retie_head(self) -> None:
        """A tied head stored anyway (equal to the embeddings) is kept once."""
        head, embed = self.lm_head.weight, self.model.embed_tokens.weight
        if head is not embed and torch.equal(head, embed):
            self.lm_head.weight = embed


class _LayerWeights(NamedTuple):
    input_norm: torch.Tensor
    qkv: torch.Tensor | None  # the attention's tensors are None where ``mixer`` is called instead
    qkv_bias: torch.Tensor | None
    o: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor | None  # None in a mixture-of-experts layer, whose MLP is ``moe``
    down: torch.Tensor | None
    moe: SparseMoE | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    # A layer whose mixer is not plain attention (linear attention, gated; Falcon-H1's two side by side).
    mixer: Callable[..., torch.Tensor] | None = None
    kv_layer: int = 0  # the attention's layer of the KV pool (a hybrid's linear layers have none)
    # Sandwich norms: the MLP's input norm and its output's (post_norm is then attention's output norm).
    pre_ff_norm: torch.Tensor | None = None
    post_ff_norm: torch.Tensor | None = None


_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "linear_attn.q_proj": ("linear_attn.in_proj_qkv", "q"),  # OLMo Hybrid's Gated DeltaNet
    "linear_attn.k_proj": ("linear_attn.in_proj_qkv", "k"),
    "linear_attn.v_proj": ("linear_attn.in_proj_qkv", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", "gate"),
    "mlp.up_proj": ("mlp.gate_up_proj", "up"),
    "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", "gate"),  # Qwen2-MoE
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", "up"),
}


def _layer_of(name: str) -> int:
    """The decoder layer a weight belongs to, -1 for none."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return int(m[1]) if m else -1


def _fused_target(name: str) -> tuple[str, str] | None:
    for src, (dst, part) in _FUSED.items():
        if f".{src}." in name:
            return name.replace(src, dst), part
    return None


def _rows(part: str, width: int, attention: tuple[int, int, int] | None) -> tuple[int, int]:
    """Where ``part`` of a fused projection ``width`` rows wide goes: q, k or v by its attention's (q, k, v) widths;
    gate or up, a half."""
    if part in ("gate", "up"):
        half = width // 2
        return (0, half) if part == "gate" else (half, 2 * half)
    q, k, v = attention
    return {"q": (0, q), "k": (q, q + k), "v": (q + k, q + k + v)}[part]


def _copy_rows(param: nn.Parameter, name: str, start: int, end: int, tensor: torch.Tensor) -> None:
    """``tensor`` (a checkpoint's q, k, v, gate or up weight or bias) into rows ``start:end`` of a fused parameter."""
    target = param[start:end]
    if tuple(target.shape) != tuple(tensor.shape):
        raise KeyError(f"weight {name!r} has shape {tuple(tensor.shape)}, the config implies {tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(tensor.to(param.dtype))


def _copy(params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> None:
    if name not in params:
        raise KeyError(f"unexpected weight {name!r} in checkpoint")
    param = params[name]
    if tuple(param.shape) != tuple(tensor.shape):
        raise KeyError(f"weight {name!r} has shape {tuple(tensor.shape)}, the config implies {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
