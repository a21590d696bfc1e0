"""The ``quantization_config`` of a ``config.json``: how an FP8 checkpoint's weights are scaled (fp8.py
dequantizes them), whether its experts are MXFP4 (mxfp4.py), how many bits its packed integer weights have
(int_packed.py), whether its projections are BitNet's ternary ones (bitnet.py), every other quantization
refused saying what is served; no torch."""

from __future__ import annotations

from typing import Any

from services.common.errors import ModelLoadError


def quant_fields(quant: Any) -> dict[str, Any]:
    """How an FP8 checkpoint's weights are scaled, or that its experts are MXFP4; refuses every other
    quantization, saying what is served, instead of loading weights it would misread."""
    if quant is None:
        return {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "mxfp4":  # GPT-OSS: the experts in 4 bits; the rest of the model as stored
        return dict(mxfp4=True)
    if method == "bitnet":
        return _bitnet(quant)
    if method == "fp8":
        return dict(fp8_scales="weight_scale_inv", fp8_block=_fp8_block(quant))
    if method == "compressed-tensors" and not quant.get("config_groups") and quant.get("kv_cache_scheme"):
        return _kv_cache_scheme(quant)  # llm-compressor's KV-only recipe: the weights as stored
    if method == "compressed-tensors" and quant.get("format") == "pack-quantized":
        return {**_packed_int(quant), **_kv_cache_scheme(quant)}
    if method == "compressed-tensors":
        return dict(fp8_scales="weight_scale", fp8_block=_compressed_fp8_block(quant), **_kv_cache_scheme(quant))
    raise ModelLoadError(f"config.json: quantization {method!r} is not supported; FP8 checkpoints (quant_method fp8, "
                         "or compressed-tensors' float-quantized format), compressed-tensors' pack-quantized INT4 "
                         "and INT8 weights, MXFP4 ones (GPT-OSS) and BitNet's ternary ones are, dequantized when they "
                         "load, and unquantized ones")


def _fp8_block(quant: dict[str, Any]) -> tuple[int, int]:
    # MiniMax-M2 writes the format as torch names it (float8_e4m3fn), DeepSeek-V3 as e4m3.
    fmt = str(quant.get("fmt", "e4m3")).lower()
    fmt = {"float8_e4m3fn": "e4m3"}.get(fmt, fmt)
    # scale_fmt "ue8m0" (DeepSeek-V3.1/V3.2, MXFP8 checkpoints): each scale a power of two, stored as a float or
    # as its 8-bit exponent (fp8.py reads both).
    unsupported = [f"{key} {quant[key]!r}" for key, ok in (("activation_scheme", ("dynamic",)), ("fmt", ("e4m3",)),
                                                            ("scale_fmt", ("float", "ue8m0")), ("expert_dtype", ("fp8",)))
                   if (fmt if key == "fmt" else str(quant.get(key, ok[0])).lower()) not in ok]
    if unsupported:
        raise ModelLoadError(f"config.json: FP8 with {', '.join(unsupported)} is not supported; dynamic activation "
                             "scales, e4m3 weights and float or ue8m0 scales are")
    block = quant.get("weight_block_size")
    if not _is_block(block):
        raise ModelLoadError(f"config.json: FP8 weight_block_size must list two positive integers, got {block!r} "
                             "(per-tensor FP8 scales are not supported with quant_method fp8)")
    return block[0], block[1]


def _compressed_fp8_block(quant: dict[str, Any]) -> tuple[int, int] | None:
    """compressed-tensors: every group's weights 8-bit float, symmetric, with static scales per channel, per
    tensor or per block (one block shape), and activations dynamic or unquantized."""
    where = "config.json: compressed-tensors"
    if quant.get("format") != "float-quantized":
        raise ModelLoadError(f"{where} format {quant.get('format')!r} is not supported; float-quantized (FP8 "
                             "weights) and pack-quantized (INT4 and INT8 weights) are")
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ModelLoadError(f"{where} needs config_groups saying how weights are quantized")
    blocks = set()
    for name, group in groups.items():
        w, act = group.get("weights") or {}, group.get("input_activations")
        if (w.get("type"), w.get("num_bits"), w.get("symmetric", True), w.get("dynamic", False)) != ("float", 8, True,
                                                                                                      False):
            raise ModelLoadError(f"{where} group {name!r}: weights {w}; static symmetric 8-bit float weights are "
                                 "supported")
        if w.get("strategy") not in ("channel", "tensor", "block"):
            raise ModelLoadError(f"{where} group {name!r}: weight strategy {w.get('strategy')!r} is not supported; "
                                 "channel, tensor and block are")
        if w.get("strategy") == "block":
            if not _is_block(w.get("block_structure")):
                raise ModelLoadError(f"{where} group {name!r}: block_structure must list two positive integers")
            blocks.add(tuple(w["block_structure"]))
        if act is not None and not act.get("dynamic"):
            raise ModelLoadError(f"{where} group {name!r}: static activation scales are not supported; dynamic "
                                 "ones (FP8-dynamic) are")
    if len(blocks) > 1 or (blocks and len(groups) > 1):
        raise ModelLoadError(f"{where}: groups with different weight strategies are not supported")
    return next(iter(blocks), None)


def _packed_int(quant: dict[str, Any]) -> dict[str, Any]:
    """compressed-tensors' pack-quantized format: every group's weights 4- or 8-bit integers, with static
    scales (and zero points, if asymmetric) per channel or per group of inputs, in contiguous groups;
    activations unquantized (W4A16, W8A16)."""
    where = "config.json: compressed-tensors pack-quantized"
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ModelLoadError(f"{where} needs config_groups saying how weights are quantized")
    bits, symmetric = set(), set()
    for name, group in groups.items():
        w = group.get("weights") or {}
        if w.get("type") != "int" or w.get("num_bits") not in (4, 8) or w.get("dynamic", False):
            raise ModelLoadError(f"{where} group {name!r}: weights {w}; static 4- or 8-bit integer weights are "
                                 "supported")
        if w.get("strategy") not in ("channel", "group") or (w.get("strategy") == "group" and not (
                isinstance(w.get("group_size"), int) and w["group_size"] > 0)):
            raise ModelLoadError(f"{where} group {name!r}: weight strategy {w.get('strategy')!r} (group_size "
                                 f"{w.get('group_size')!r}); channel, and group with a positive group_size, are")
        if w.get("actorder") not in (None, "weight"):
            raise ModelLoadError(f"{where} group {name!r}: actorder {w['actorder']!r} stores groups out of order "
                                 "(g_idx), which is not supported; none or \"weight\" is")
        if group.get("input_activations") is not None:
            raise ModelLoadError(f"{where} group {name!r}: quantized activations are not supported with integer "
                                 "weights; W4A16 and W8A16 are")
        bits.add(w["num_bits"])
        symmetric.add(bool(w.get("symmetric", True)))
    if len(bits) > 1 or len(symmetric) > 1:
        raise ModelLoadError(f"{where}: groups of {sorted(bits)} bits, symmetric {sorted(symmetric)}; one width "
                             "and one kind for every group is supported")
    return dict(packed_int_bits=bits.pop(), packed_int_zero_points=not symmetric.pop())


def _bitnet(quant: dict[str, Any]) -> dict[str, Any]:
    """BitNet b1.58's ternary projections (bitnet.py), by transformers' ``linear_class`` and
    ``quantization_mode``: ``bitlinear`` packed (whatever the mode), ``autobitlinear`` offline (scaled ternary
    weights) or online (float weights rounded as they load); every decoder projection, not the output head."""
    linear, mode = quant.get("linear_class", "bitlinear"), quant.get("quantization_mode", "offline")
    if linear not in ("bitlinear", "autobitlinear") or mode not in ("offline", "online"):
        raise ModelLoadError(f"config.json: bitnet linear_class {linear!r} with quantization_mode {mode!r} is not "
                             "supported; bitlinear, and autobitlinear offline or online, are")
    if quant.get("use_rms_norm"):
        raise ModelLoadError("config.json: bitnet use_rms_norm (a norm inside each ternary layer) is not supported")
    skip = quant.get("modules_to_not_convert")
    if skip is not None and set(skip) != {"lm_head"}:
        raise ModelLoadError(f"config.json: bitnet modules_to_not_convert {skip!r} is not supported; every decoder "
                             "projection ternary and the output head not (None or [\"lm_head\"]) is")
    return dict(ternary_weights="packed" if linear == "bitlinear" else "scaled" if mode == "offline" else "online")


def _kv_cache_scheme(quant: dict[str, Any]) -> dict[str, Any]:
    """llm-compressor's FP8 KV cache: a calibrated scale per attention layer for its keys and one for its values
    (``self_attn.k_scale`` / ``v_scale``), which a float8 pool (``--kv-cache-dtype fp8``) divides by as it writes
    and multiplies by as it reads (kv_quant.py); other schemes are refused."""
    scheme = quant.get("kv_cache_scheme")
    if not scheme:
        return {}
    got = (scheme.get("type"), scheme.get("num_bits"), scheme.get("strategy", "tensor"),
           bool(scheme.get("dynamic", False)), bool(scheme.get("symmetric", True)))
    if got != ("float", 8, "tensor", False, True):
        raise ModelLoadError(f"config.json: compressed-tensors kv_cache_scheme {scheme} is not supported; static "
                             "symmetric 8-bit float scales per tensor (a key scale and a value scale per layer) are")
    return {"kv_scales": True}


def _is_block(block: Any) -> bool:
    return isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
