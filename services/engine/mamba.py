"""Attention-free state space models (``MambaForCausalLM``: state-spaces' Mamba 130M-2.8B; ``FalconMambaForCausalLM``:
Falcon Mamba 7B; ``Mamba2ForCausalLM``: Mamba-2, Mistral's Mamba-Codestral 7B): what sets them apart, read from
their configs as transformers reads them. No torch (the scheduler reads configs).

* Every layer is one mixer behind its own RMSNorm, added to the stream (``ModelConfig.sublayers``, as Nemotron-H's
  layers): Mamba (mamba1.py; Falcon Mamba's dt, B and C RMS-normed without weights) or Mamba-2 (mamba2.py, its
  output gated then RMS-normed in ``n_groups`` groups). No attention and no MLP: the KV pool holds nothing
  (``ModelConfig.attention_free``), and a sequence's whole past is its recurrent state.
* ``residual_in_fp32``: transformers adds each layer's output to a float32 stream; in float32 that is the model's
  own dtype.
* Checkpoints hold them under ``backbone.`` with Nemotron-H's names (``nemotron_h.checkpoint_names``).
"""

from __future__ import annotations

import math
from typing import Any

from services.common.errors import ModelLoadError
from services.engine.linear_attention_config import Mamba1Shape, Mamba2Shape, json_float

MAMBA, FALCON_MAMBA, MAMBA2 = "MambaForCausalLM", "FalconMambaForCausalLM", "Mamba2ForCausalLM"
ARCHS = (MAMBA, FALCON_MAMBA, MAMBA2)
# transformers' defaults of each config; the attention fields Llama's reading requires stand for no layer (the
# model has none), and the context is not bounded by the model: served contexts are --max-model-len's.
_COMMON = {"num_attention_heads": 1, "num_key_value_heads": 1, "max_position_embeddings": 1 << 20}
DEFAULTS = {
    MAMBA: {**_COMMON, "vocab_size": 50280, "hidden_size": 768, "num_hidden_layers": 32, "rms_norm_eps": 1e-5,
            "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": True},
    FALCON_MAMBA: {**_COMMON, "vocab_size": 50280, "hidden_size": 768, "num_hidden_layers": 32, "rms_norm_eps": 1e-5,
                   "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": True},
    MAMBA2: {**_COMMON, "vocab_size": 32768, "hidden_size": 4096, "num_hidden_layers": 64, "rms_norm_eps": 1e-5,
             "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": False},
}
NAMES = {"layer_norm_epsilon": "rms_norm_eps", "use_bias": "mamba_use_bias"}
# Their options for kernels, initialization and training, and Llama fields they do not read.
IGNORED = ("use_mambapy", "use_associative_scan", "use_falcon_mambapy", "rescale_prenorm_residual",
           "initializer_range", "time_step_scale", "time_step_min", "time_step_max", "time_step_init_scheme",
           "time_step_floor", "use_cache", "attention_bias", "rope_theta", "rope_scaling", "rope_parameters",
           "sliding_window")


def rewrite(raw: dict[str, Any]) -> dict[str, Any]:
    """The mixers' width as intermediate_size, as the config classes set it (older configs leave it out)."""
    return {**raw, "intermediate_size": int(raw.get("expand") or 2) * int(raw["hidden_size"])}


def fields(raw: dict[str, Any], arch: str) -> dict[str, Any]:
    """The ``ModelConfig`` fields of attention-free ``arch``: every layer a mixer, each a Mamba or Mamba-2 layer."""
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"config.json: hidden_act {raw['hidden_act']!r}; {arch}'s layers convolve through silu")
    layers, hidden = int(raw["num_hidden_layers"]), int(raw["hidden_size"])
    width = int(raw.get("expand") or 2) * hidden
    shape = _mamba2_shape(raw, width) if arch == MAMBA2 else _mamba1_shape(raw, arch, width, hidden)
    return {"sublayers": ("mixer",) * layers, "linear_layers": tuple(range(layers)), "linear_attention": shape,
            "nope_layers": tuple(range(layers)), "residual_in_fp32": bool(raw.get("residual_in_fp32", True)),
            "architecture": arch}


def _mamba1_shape(raw: dict[str, Any], arch: str, width: int, hidden: int) -> Mamba1Shape:
    rank = raw.get("time_step_rank", "auto")
    shape = Mamba1Shape(intermediate=width, state_size=int(raw.get("state_size") or 16),
                        conv_kernel=int(raw.get("conv_kernel") or 4),
                        dt_rank=math.ceil(hidden / 16) if rank in (None, "auto") else int(rank),
                        conv_bias=bool(raw.get("use_conv_bias", True)), proj_bias=bool(raw.get("mamba_use_bias")),
                        bcdt_norms="unweighted" if arch == FALCON_MAMBA else "none",
                        bcdt_norm_eps=1e-6 if raw.get("mixer_rms_eps") is None else float(raw["mixer_rms_eps"]))
    if shape.conv_kernel < 2 or min(shape.state_size, shape.dt_rank) < 1:
        raise ModelLoadError(f"config.json: {arch}'s layers need a convolution of at least 2 ({shape.conv_kernel}) "
                             f"and positive widths (state {shape.state_size}, time step rank {shape.dt_rank})")
    return shape


def _mamba2_shape(raw: dict[str, Any], width: int) -> Mamba2Shape:
    heads = int(raw.get("num_heads") or 128)
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    shape = Mamba2Shape(num_heads=heads, head_dim=int(raw.get("head_dim") or 64),
                        state_size=int(raw.get("state_size") or 128), n_groups=int(raw.get("n_groups") or 8),
                        conv_kernel=int(raw.get("conv_kernel") or 4), chunk_size=int(raw.get("chunk_size") or 256),
                        conv_bias=bool(raw.get("use_conv_bias", True)), proj_bias=bool(raw.get("mamba_use_bias")),
                        time_step_limit=(json_float(limit[0]), json_float(limit[1])))
    if shape.intermediate != width or heads % shape.n_groups or shape.conv_kernel < 2 or shape.chunk_size < 1:
        raise ModelLoadError(f"config.json: Mamba-2 layers of {heads} heads of {shape.head_dim} must fill expand * "
                             f"hidden_size ({width}), in n_groups groups that divide the heads ({shape.n_groups}), "
                             f"with a convolution of at least 2 ({shape.conv_kernel})")
    return shape
