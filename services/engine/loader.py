"""Loads a checkpoint's safetensors weights (single file or sharded with an index) into the model; its config
and tokenizer are read by ``checkpoint.py``. Every failure names the file and the fix."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from services.common.errors import ModelLoadError
from services.engine import (
    aria,
    bloom,
    codegen,
    dbrx,
    falcon_h1,
    gpt2,
    gpt_bigcode,
    gpt_neo,
    gpt_neox,
    gpt_neox_japanese,
    gptj,
    kimi_linear,
    lara_mini,
    lfm3,
    mamba,
    minimax,
    nanochat,
    nemotron_h,
    olmo_hybrid,
    opt,
    xglm,
    zamba2,
)
from services.engine.attention import alibi_slopes, falcon_alibi_slopes
from services.engine.bitnet import ternary_weights
from services.engine.checkpoint import Checkpoint, read_json
from services.engine.fp8 import FP8_DTYPES, dequantize
from services.engine.gpt_oss_weights import gate_then_up, gpt_oss_weights
from services.engine.int_packed import dequantize_packed
from services.engine.llama4 import ARCH as LLAMA4
from services.engine.llama4 import llama4_weights
from services.engine.lora import Rows
from services.engine.model import Attention, LlamaForCausalLM, norms_in_fp32
from services.engine.moe import routers_in_fp32
from services.engine.mxfp4 import pair_packed
from services.engine.rope import deinterleave_rope, inverse_frequencies
from services.engine.vision_language import language_model_weights
from services.engine.weight_names import ernie_weights, split_query_gates, split_query_key_value
from services.engine.zamba2_layer import tie_shared_blocks


def iter_weights(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) from ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index} has no weight_map")
        files = sorted(set(weight_map.values()))
    elif (model_dir / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{model_dir} has no *.safetensors weights (pytorch .bin files are not supported)")
    for name in files:
        file = model_dir / name
        if not file.exists():
            raise ModelLoadError(f"shard {name} listed in the index is missing from {model_dir}")
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    yield key, f.get_tensor(key)
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{file} is not a readable safetensors file: {exc}") from exc


def load_model(ckpt: Checkpoint, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(ckpt.config, lm_head=ckpt.has_lm_head)
    model = model.to_empty(device=device).to(dtype)
    routers_in_fp32(model)
    if ckpt.config.norm_unit_offset and not ckpt.config.layer_norm:
        norms_in_fp32(model)
    # RoPE frequencies stay fp32 whatever the weights' dtype, as in transformers.
    model.rotary.inv_freq = inverse_frequencies(ckpt.config.full_attention).to(device)
    if model.local_rotary is not None:
        model.local_rotary.inv_freq = inverse_frequencies(ckpt.config, local=True).to(device)
    if ckpt.config.alibi_bias_max is not None:  # fp32 too, one tensor every layer shares
        heads = ckpt.config.num_attention_heads
        slopes = (falcon_alibi_slopes(heads) if ckpt.config.alibi_bf16
                  else alibi_slopes(heads, ckpt.config.alibi_bias_max)).to(device)
        for module in model.modules():
            if isinstance(module, Attention):
                module.alibi = slopes
    if ckpt.config.tie_word_embeddings and ckpt.has_lm_head:
        model.lm_head.weight = model.model.embed_tokens.weight
    if ckpt.config.shared_blocks is not None:  # to_empty gave each of a block's layers tensors of its own
        tie_shared_blocks(model.model.layers, ckpt.config.shared_blocks)
    kv_scales: dict[int, dict[str, float]] = {}  # layer -> "k" / "v" -> scale, filled as the weights stream by
    weights = _checkpoint_weights(ckpt, kv_scales if ckpt.config.kv_scales else None)
    if ckpt.config.architecture == xglm.ARCH:  # its positions' table, which no checkpoint holds
        weights = itertools.chain(weights, [xglm.position_table(ckpt.config)])
    try:
        model.load_weights(weights)
    except KeyError as exc:
        raise ModelLoadError(f"{ckpt.path}: {exc.args[0]}") from exc
    if ckpt.config.kv_scales:
        _set_kv_scales(model, kv_scales, ckpt.path)
    return model.eval()


_KV_SCALE = re.compile(r"model\.layers\.(\d+)\.self_attn\.([kv])_scale$")


def _kv_scales_aside(weights: Iterator[tuple[str, torch.Tensor]],
                     into: dict[int, dict[str, float]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors but its attention layers' KV scales, which go ``into`` (layer -> "k" / "v")."""
    for name, tensor in weights:
        m = _KV_SCALE.match(name)
        if m is None:
            yield name, tensor
            continue
        value = float(tensor.float().reshape(-1)[0]) if tensor.numel() == 1 else float("nan")
        if not (math.isfinite(value) and value > 0):
            raise KeyError(f"KV scale {name!r} must be one positive finite number, got shape "
                           f"{tuple(tensor.shape)} {tensor.reshape(-1)[:4].tolist()}")
        into.setdefault(int(m[1]), {})[m[2]] = value


def _set_kv_scales(model: LlamaForCausalLM, scales: dict[int, dict[str, float]], path: Path) -> None:
    """Each attention layer's (key scale, value scale); every attention layer must have both, no other layer any."""
    layers = {m.layer: m for m in model.modules() if isinstance(m, Attention)}
    for layer, module in layers.items():
        if set(scales.get(layer, ())) != {"k", "v"}:
            raise ModelLoadError(f"{path}: config.json has a kv_cache_scheme but layer {layer}'s self_attn.k_scale "
                                 "and v_scale are not both in the checkpoint")
        module.kv_scale = (scales[layer]["k"], scales[layer]["v"])
    if extra := sorted(set(scales) - set(layers)):
        raise ModelLoadError(f"{path}: KV scales for layers {extra}, which have no attention")


def _checkpoint_weights(ckpt: Checkpoint, kv_scales: dict[int, dict[str, float]] | None = None
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as the model loads them: dequantized, renamed and rearranged as each
    architecture stores them otherwise; with ``kv_scales``, its KV scales set aside there."""
    weights = _under_model(iter_weights(ckpt.path))
    config = ckpt.config
    if config.vision_language:  # before the names dequantizing pairs and renaming rely on
        weights = language_model_weights(weights, config)
    if kv_scales is not None:
        weights = _kv_scales_aside(weights, kv_scales)
    weights = dequantize(weights, config.fp8_scales, config.fp8_block) if config.fp8_scales else _unquantized(weights)
    if config.packed_int_bits:
        weights = dequantize_packed(weights, config.packed_int_bits, config.packed_int_zero_points)
    if config.mxfp4:
        weights = pair_packed(weights)
    if config.ternary_weights:
        weights = ternary_weights(weights, config.ternary_weights)
    return _arranged(weights, ckpt)


def _arranged(weights: Iterator[tuple[str, torch.Tensor]], ckpt: Checkpoint) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantized tensors renamed, split and scaled as the model holds them, where the architecture stores them
    otherwise."""
    config = ckpt.config
    if config.architecture == "GptOssForCausalLM":
        weights = gpt_oss_weights(weights)
    if config.architecture == LLAMA4:
        weights = llama4_weights(weights)
    if config.multipliers is not None:  # Falcon-H1's, before the names change
        weights = falcon_h1.scaled_weights(weights, config.multipliers, config.linear_attention,
                                           config.tie_word_embeddings and ckpt.has_lm_head)
    released = _RELEASED_LAYOUTS.get(config.architecture)
    if released is not None:  # the classic families' released names, buffers and Conv1D weights
        weights = released.checkpoint_weights(weights, config)
    if config.qkv_layout is not None:
        weights = split_query_key_value(weights, config.qkv_layout, config.num_attention_heads,
                                        config.num_key_value_heads)
    if config.architecture == kimi_linear.ARCH:
        weights = kimi_linear.checkpoint_names(weights, config.linear_layers)
    if config.architecture == lfm3.ARCH:
        weights = lfm3.checkpoint_names(weights, config.sandwich_norms)
    if config.architecture == nanochat.ARCH:
        weights = nanochat.rope_rows(weights, config)
    if config.architecture in (nemotron_h.ARCH, *mamba.ARCHS):
        weights = nemotron_h.checkpoint_names(weights, config.sublayers, config.linear_layers)
    if config.shared_blocks is not None:
        weights = zamba2.checkpoint_names(weights, config.shared_blocks)
    if config.architecture in ("Ernie4_5_MoeForCausalLM", "ExaoneMoeForCausalLM"):
        weights = ernie_weights(weights)
    if config.attn_output_gate == "in_query":
        weights = split_query_gates(weights, config.head_dim)
    if config.rope_interleaved:
        weights = ((name, deinterleave_rope(name, tensor, config)) for name, tensor in weights)
    return weights


_RELEASED_LAYOUTS = {m.ARCH: m for m in (gpt_neox, opt, gpt2, gptj, gpt_bigcode, bloom, gpt_neo, dbrx, codegen, xglm,
                                            minimax, lara_mini, olmo_hybrid, aria, gpt_neox_japanese)}


def lora_rows(ckpt: Checkpoint) -> Rows:
    """A LoRA adapter's B (``[out, r]``: a row per output of the projection it adapts) as the model holds the
    rows of the checkpoint weight it adapts: split, reordered and scaled as ``_arranged`` does that weight's
    (the names as they leave it: ``ModelShape.names`` reads them as the model's)."""
    arch = ckpt.config.architecture

    def rows(weight: str, b: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if arch == kimi_linear.ARCH and kimi_linear.joined_part(weight, ckpt.config.linear_layers):
            return [(weight, b)]  # a KDA layer's q, k or v: kda.py adds it to its third of the joined projection
        if ".experts." in weight:  # stacked experts' B, [out, r·E]: GPT-OSS interleaves gate and up outputs
            gpt_oss_gate_up = arch == "GptOssForCausalLM" and weight.endswith(".gate_up_proj")
            return [(weight, gate_then_up(b, dim=0) if gpt_oss_gate_up else b)]
        if arch == gpt2.ARCH and weight.endswith(gpt2.CONV1D):  # stored [in, out]: transposed as it loads
            b = b.t()
        return list(_arranged(iter([(weight, b)]), ckpt))

    return rows


def _under_model(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A base model's tensors (an embedding checkpoint saved from ``Qwen3Model``: ``layers.0...``) under the
    ``model.`` prefix the causal LM holds them by."""
    for name, tensor in weights:
        yield ("model." + name if name.startswith(_BASE_MODEL_NAMES) else name), tensor


_BASE_MODEL_NAMES = ("embed_tokens.", "layers.", "norm.")


def _unquantized(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Refuses FP8 tensors in a checkpoint whose config does not say how they are scaled (cast as they are, they
    would load as different weights)."""
    for name, tensor in weights:
        if tensor.dtype in FP8_DTYPES:
            raise KeyError(f"weight {name!r} is FP8 but config.json has no quantization_config saying how it is "
                           "scaled")
        yield name, tensor
