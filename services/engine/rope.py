"""Rotary position embeddings with the checkpoint's scaling (default, linear, llama3, yarn, longrope, proportional),
over the whole head or its first ``rotary_dim`` features (Phi-4-mini).

The inverse frequencies follow ``transformers``' ``ROPE_INIT_FUNCTIONS`` exactly, so positions rotate
bit-for-bit as the oracle rotates them.
"""

from __future__ import annotations

import math

import torch

from services.engine.model_config import ModelConfig


def inverse_frequencies(config: ModelConfig, local: bool = False) -> torch.Tensor:
    """The frequencies of the model's layers, or with ``local`` of its sliding layers where those have a base
    of their own (``local_rope_theta``, unscaled). Computed on the CPU whatever the default device: under the
    meta device the model is built on, these few ops would import torch._dynamo (~2 s of start-up)."""
    with torch.device("cpu"):
        return _inverse_frequencies(config, local)


def _inverse_frequencies(config: ModelConfig, local: bool) -> torch.Tensor:
    dim = config.local_rotary_dim if local else config.rotary_dim
    theta = config.local_rope_theta if local else config.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if local:
        return inv_freq
    scaling = config.rope_scaling or {}
    rope_type = config.rope_type
    if rope_type == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif rope_type == "llama3":
        inv_freq = _llama3_scale(inv_freq, scaling)
    elif rope_type == "yarn":
        inv_freq = _yarn_frequencies(config, scaling)
    elif rope_type == "longrope":
        inv_freq = _longrope_frequencies(config, scaling)
    elif rope_type == "proportional":
        inv_freq = _proportional_frequencies(config, scaling)
    return inv_freq


def _proportional_frequencies(config: ModelConfig, scaling: dict) -> torch.Tensor:
    """Proportional RoPE (LFM3's full layers): the first ``partial_rotary_factor`` of each half of the head rotates,
    at the frequencies its features would have over the whole head; the rest have frequency 0 (cos 1, sin 0:
    passed through exactly), so the rotation spans the head (``rotary_dim`` is ``head_dim``)."""
    head_dim = config.head_dim
    angles = int(float(scaling.get("partial_rotary_factor", 1.0)) * head_dim // 2)
    rotated = 1.0 / (config.rope_theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim))
    return torch.cat([rotated, torch.zeros(head_dim // 2 - angles)]) / float(scaling.get("factor", 1.0))


def attention_factor(config: ModelConfig, local: bool = False) -> float:
    """What cos and sin are multiplied by: 1, except under YaRN (its attention temperature, sqrt(1/t)) and
    LongRoPE (sqrt(1 + ln(factor) / ln(original context)))."""
    if local or config.rope_type not in ("yarn", "longrope"):
        return 1.0
    scaling = config.rope_scaling or {}
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    if config.rope_type == "longrope" and scaling.get("short_mscale") is not None:
        # Phi-3.5-MoE names its own, for the factors in use (transformers switches by the sequence's length).
        return float(scaling["long_mscale"] if uses_long_factors(config) else scaling["short_mscale"])
    if config.rope_type == "longrope":
        # The factor is the checkpoint's (not the served context's), as in transformers and vLLM.
        original = _original_context(config, scaling)
        factor = scaling.get("factor") or config.max_position_embeddings / original
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    factor = _yarn_factor(config, scaling)
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def _yarn_factor(config: ModelConfig, scaling: dict) -> float:
    if scaling.get("factor") is not None:
        return float(scaling["factor"])
    return config.max_position_embeddings / _original_context(config, scaling)


def _original_context(config: ModelConfig, scaling: dict) -> float:
    return float(scaling.get("original_max_position_embeddings") or config.max_position_embeddings)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_frequencies(config: ModelConfig, scaling: dict) -> torch.Tensor:
    """YaRN (NTK-by-parts): frequencies that rotate fewer than ``beta_slow`` times over the original context
    are interpolated by ``factor``, those that rotate more than ``beta_fast`` times kept, a linear ramp
    between; as transformers' ``_compute_yarn_parameters``, op for op."""
    dim, base = config.rotary_dim, config.rope_theta  # transformers: head_dim * partial_rotary_factor
    factor = _yarn_factor(config, scaling)
    original = _original_context(config, scaling)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no singularity
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def uses_long_factors(config: ModelConfig) -> bool:
    """LongRoPE: whether the long factors apply, for every position. transformers switches by the length of
    each forward pass, which a cache of rotated keys cannot follow (keys rotated one way would meet queries
    rotated the other); like vLLM, the engine picks once, by the context it serves: long when that exceeds
    the pretrained one (--max-model-len at or below it keeps the short factors)."""
    return config.max_model_len > _original_context(config, config.rope_scaling or {})


def _longrope_frequencies(config: ModelConfig, scaling: dict) -> torch.Tensor:
    """LongRoPE (Phi-3.5, Phi-4-mini): each frequency divided by its own rescale factor; as transformers'
    ``_compute_longrope_parameters``, op for op."""
    dim = config.rotary_dim
    factors = scaling["long_factor"] if uses_long_factors(config) else scaling["short_factor"]
    ext_factors = torch.tensor(factors, dtype=torch.float32)
    inv_freq_shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext_factors * config.rope_theta**inv_freq_shape)


def _llama3_scale(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are scaled by factor, short ones kept, the band between interpolated smoothly.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


class RotaryEmbedding(torch.nn.Module):
    """Applies RoPE to flattened ``[num_tokens, heads, head_dim]`` queries and keys at given positions (to the
    first ``rotary_dim`` features of each head: cos and sin are that wide)."""

    def __init__(self, config: ModelConfig, local: bool = False) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inverse_frequencies(config, local), persistent=False)
        self.scale = attention_factor(config, local)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot = cos.shape[-1]
        if rot < x.shape[-1]:  # partial rotary: the other features pass unchanged
            return torch.cat((RotaryEmbedding.apply(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
        half = rot // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        out = x * cos + rotated * sin  # fp32 where cos is (ModelConfig.rope_in_fp32): cast back once
        return out if out.dtype == x.dtype else out.to(x.dtype)


def deinterleave_rope(name: str, tensor: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """A checkpoint whose rotated features are interleaved pairs (DeepSeek's ``rope_interleave``, GLM-4's
    interleaved rotation): each query and key projection's rotated rows (weight or bias) reordered to halves,
    evens then odds, as this module rotates them. q and k are permuted alike, so their dot products, and
    attention, are transformers'; values and the rows RoPE passes are untouched. Other tensors as they are."""
    if config.mla:
        nope, rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        if name.endswith(("self_attn.q_b_proj.weight", "self_attn.q_proj.weight")):
            return _deinterleave(tensor, config.num_attention_heads, nope, rope)
        if name.endswith(("self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_proj_with_mqa.bias")):
            return _deinterleave(tensor, 1, config.kv_lora_rank, rope)  # the latent, then its rotated block
        if config.index_rope_interleaved and name.endswith("self_attn.indexer.wq_b.weight"):  # GLM-5's indexer
            return _deinterleave(tensor, config.index_n_heads, 0, rope)
        if config.index_rope_interleaved and name.endswith(("self_attn.indexer.wk.weight",
                                                            "self_attn.indexer.k_norm.weight",
                                                            "self_attn.indexer.k_norm.bias")):
            # its key's rotated features, and the LayerNorm's weight and bias over them (a LayerNorm's mean and
            # variance do not depend on the features' order)
            return _deinterleave(tensor, 1, 0, rope)
        return tensor
    for proj, heads in (("q_proj", config.num_attention_heads), ("k_proj", config.num_key_value_heads)):
        if name.endswith((f"self_attn.{proj}.weight", f"self_attn.{proj}.bias")):
            return _deinterleave(tensor, heads, 0, config.rotary_dim)
    if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")) and not config.qk_norm_whole:
        # A per-head norm's weight (one row per head, Cohere's, or one for all) scales the features RoPE then
        # rotates: reordered with them.
        heads = tensor.shape[0] if tensor.dim() == 2 else 1
        return _deinterleave(tensor.reshape(-1), heads, 0, config.rotary_dim).reshape(tensor.shape)
    return tensor


def _deinterleave(tensor: torch.Tensor, heads: int, start: int, width: int) -> torch.Tensor:
    """Rows ``[start, start + width)`` of each of ``heads`` equal blocks reordered: evens, then odds."""
    rows = tensor.reshape(heads, -1, *tensor.shape[1:])
    block = rows[:, start : start + width]
    return torch.cat([rows[:, :start], block[:, 0::2], block[:, 1::2], rows[:, start + width :]], dim=1
                     ).reshape(tensor.shape)
