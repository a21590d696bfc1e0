"""FP8 checkpoints (services/engine/fp8.py): quantized here as Qwen's and DeepSeek's FP8 releases are (e4m3
weights, one fp32 scale per tile) and as llm-compressor writes compressed-tensors ones (per channel, per
tensor or per block), and compared with transformers loading the same files (it dequantizes them on a
machine without an FP8 GPU; compressed-tensors ones with run_compressed=False)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from seawall.offline.engine import OfflineEngine
from services.common.errors import ModelLoadError
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.engine.fp8 import dequantize
from services.engine.model_config import ModelConfig
from services.scheduler.core.scheduler import SchedulerConfig
from tests.engine.test_architectures import (
    CASES,
    MAX_TOKENS,
    assert_matches_transformers,
    engine_matches_transformers,
    save_checkpoint,
)

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

transformers = pytest.importorskip("transformers")

BLOCK = [32, 16]  # not square; divides every projection, as transformers needs (the unit test covers partial tiles)
FP8_MAX = 448.0  # e4m3's largest value
FP8_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": BLOCK}


def quantize(weight: torch.Tensor, block=BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 weight and its scales (per tile; "channel": per row; "tensor": one), each scaled to use e4m3's
    whole range; "ue8m0": per tile, each scale the power of two at or above that one, saved as its exponent byte."""
    if block == "ue8m0":
        q, scales = quantize(weight)
        exponents = torch.ceil(torch.log2(scales)).clamp(-127, 127)
        tiles = torch.exp2(exponents).repeat_interleave(BLOCK[0], 0).repeat_interleave(BLOCK[1], 1)
        q = (weight / tiles[: weight.shape[0], : weight.shape[1]]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return q, (exponents + 127).to(torch.uint8)
    if block in ("channel", "tensor"):
        scales = (weight.abs().amax(dim=1, keepdim=True) if block == "channel" else weight.abs().amax()) / FP8_MAX
        return (weight / scales).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scales.reshape(-1, 1)[
            : weight.shape[0] if block == "channel" else 1]
    rows, cols = weight.shape
    grid = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    padded = torch.zeros(grid[0] * block[0], grid[1] * block[1])
    padded[:rows, :cols] = weight
    tiles = padded.view(grid[0], block[0], grid[1], block[1])
    scales = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (tiles / scales[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(padded.shape)[:rows, :cols].contiguous(), scales


def write_fp8(src, out, quant_config=None, strategy=BLOCK, scale_name="weight_scale_inv"):
    """``src``'s checkpoint with every projection (experts' too) quantized, written to ``out``."""
    out.mkdir()
    tensors = {}
    for name, t in load_file(str(src / "model.safetensors")).items():
        if name.endswith("proj.weight") or ".experts." in name:
            tensors[name], tensors[name.removesuffix("weight") + scale_name] = quantize(t, strategy)
        else:
            tensors[name] = t
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quant_config or FP8_CONFIG
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists():
            (out / name).write_bytes((src / name).read_bytes())
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3-moe"])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_fp8_checkpoints_match_transformers_loading_the_same_files(tmp_path, tiny_model_dir, arch, cpu_kernels):
    save_checkpoint(CASES[arch](), tmp_path / "bf16", tiny_model_dir)
    path = write_fp8(tmp_path / "bf16", tmp_path / "fp8")
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine_matches_transformers(path, ref, cpu_kernels)


def test_ue8m0_scales_saved_as_bytes_match_transformers_loading_the_same_files(tmp_path, tiny_model_dir):
    """scale_fmt ue8m0 (DeepSeek-V3.2's, MXFP8's): each tile's scale a power of two, saved as its exponent byte."""
    save_checkpoint(CASES["llama"](), tmp_path / "bf16", tiny_model_dir)
    path = write_fp8(tmp_path / "bf16", tmp_path / "fp8", {**FP8_CONFIG, "scale_fmt": "ue8m0"}, "ue8m0")
    assert load_file(str(path / "model.safetensors"))["model.layers.0.mlp.down_proj.weight_scale_inv"].dtype == \
        torch.uint8
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine_matches_transformers(path, ref, cpu_kernels=False)


def compressed_tensors_config(strategy) -> dict:
    """llm-compressor's FP8-dynamic scheme (channel), FP8 (tensor) or FP8-block."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
               "strategy": "block" if isinstance(strategy, list) else strategy}
    if isinstance(strategy, list):
        weights["block_structure"] = strategy
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "config_groups": {"group_0": {
                "targets": ["Linear"], "weights": weights,
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}


@pytest.mark.parametrize("strategy", ["channel", "tensor", BLOCK])
def test_compressed_tensors_fp8_matches_transformers_loading_the_same_files(tmp_path, tiny_model_dir, strategy):
    pytest.importorskip("compressed_tensors")
    save_checkpoint(CASES["qwen2"](), tmp_path / "bf16", tiny_model_dir)
    path = write_fp8(tmp_path / "bf16", tmp_path / "fp8", compressed_tensors_config(strategy), strategy,
                     "weight_scale")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32,
        quantization_config=transformers.CompressedTensorsConfig(run_compressed=False)).eval()
    assert type(ref.model.layers[0].mlp.down_proj) is torch.nn.Linear  # decompressed, as the engine holds it
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (3, 40)]
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32"), SchedulerConfig(chunk_size=16))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                                   logprobs=0)] * len(prompts))
    assert_matches_transformers(ref, prompts, got)


def test_dequantized_weights_are_the_tiles_times_their_scales():
    """Tiles at the edges may be partial (ceil(rows / bm) x ceil(cols / bn) scales), as vLLM reads them."""
    w = torch.randn(70, 100)
    q, scales = quantize(w, block=[32, 48])
    assert scales.shape == (3, 3)
    ((name, got),) = list(dequantize([("x.weight", q), ("x.weight_scale_inv", scales)], "weight_scale_inv",
                                     (32, 48)))
    assert name == "x.weight" and got.dtype == torch.float32
    assert torch.equal(got[31, 47], q[31, 47].float() * scales[0, 0])  # last element of the first tile
    assert torch.equal(got[32, 48], q[32, 48].float() * scales[1, 1])
    assert torch.equal(got[69, 99], q[69, 99].float() * scales[2, 2])  # the partial corner tile
    assert torch.allclose(got, w, rtol=0.07, atol=1e-3)  # e4m3 keeps 3 mantissa bits
    q, exponents = quantize(w[:64, :96], "ue8m0")  # ue8m0's: 2 ** (byte - 127)
    ((_, got),) = list(dequantize([("x.weight", q), ("x.weight_scale_inv", exponents)], "weight_scale_inv", BLOCK))
    assert torch.equal(got[40, 20], q[40, 20].float() * 2.0 ** (int(exponents[1, 1]) - 127))
    assert torch.allclose(got, w[:64, :96], rtol=0.07, atol=1e-3)
    for strategy in ("channel", "tensor"):  # compressed-tensors' scales, after the weight or before it
        q, scales = quantize(w, strategy)
        ((_, got),) = list(dequantize([("x.weight_scale", scales), ("x.weight", q)], "weight_scale", None))
        assert torch.equal(got, q.float() * scales) and torch.allclose(got, w, rtol=0.07, atol=1e-3)


KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def test_an_fp8_kv_cache_scheme_is_read_with_or_without_quantized_weights():
    """llm-compressor's FP8 KV cache beside FP8 or packed integer weights, or alone (a KV-only recipe: no
    config_groups, the weights as stored): each attention layer's calibrated scales are read (kv_scales)."""
    base = dict(CASES["llama"]().to_dict(), architectures=["LlamaForCausalLM"])
    fp8 = ModelConfig.from_dict({**base, "quantization_config": {**compressed_tensors_config("channel"),
                                                                 "kv_cache_scheme": KV_SCHEME}})
    assert fp8.kv_scales and fp8.fp8_scales == "weight_scale"
    alone = ModelConfig.from_dict({**base, "quantization_config": {
        "quant_method": "compressed-tensors", "format": "dense", "config_groups": {}, "kv_cache_scheme": KV_SCHEME}})
    assert alone.kv_scales and alone.fp8_scales is None and not alone.packed_int_bits
    assert not ModelConfig.from_dict({**base, "quantization_config": compressed_tensors_config("channel")}).kv_scales
    deepseek = {**CASES["deepseek-v3"]().to_dict(), "architectures": ["DeepseekV3ForCausalLM"]}
    with pytest.raises(ModelLoadError, match="calibrated KV scales .* for latent attention are not supported"):
        ModelConfig.from_dict({**deepseek, "quantization_config": {**compressed_tensors_config("channel"),
                                                                   "kv_cache_scheme": KV_SCHEME}})


def test_what_cannot_be_loaded_is_refused_saying_why(tmp_path, tiny_model_dir):
    base = dict(CASES["llama"]().to_dict(), architectures=["LlamaForCausalLM"])
    for quant, message in [
        ({"quant_method": "awq", "bits": 4}, "quantization 'awq' is not supported; FP8 checkpoints"),
        ({"quant_method": "compressed-tensors"}, "compressed-tensors format None is not supported"),
        ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": BLOCK},
         "activation_scheme 'static' is not supported"),
        ({"quant_method": "fp8", "weight_block_size": None}, "per-tensor FP8 scales are not supported"),
        ({**FP8_CONFIG, "scale_fmt": "e5m2"}, "scale_fmt 'e5m2' is not supported; .* float or ue8m0 scales are"),
        ({**compressed_tensors_config("channel"), "format": "naive-quantized"},
         "format 'naive-quantized' is not supported; float-quantized .* and pack-quantized"),
        ({**compressed_tensors_config("channel"), "format": "pack-quantized"},  # FP8 weights declared packed
         "static 4- or 8-bit integer weights are supported"),
        ({**compressed_tensors_config("channel"), "kv_cache_scheme": {"num_bits": 8}},
         "kv_cache_scheme .* is not supported; static symmetric 8-bit float scales per tensor"),
        ({**compressed_tensors_config("channel"), "kv_cache_scheme": {**KV_SCHEME, "strategy": "attn_head"}},
         "kv_cache_scheme .* is not supported"),
        ({**compressed_tensors_config("channel"), "kv_cache_scheme": {**KV_SCHEME, "dynamic": True}},
         "kv_cache_scheme .* is not supported"),
        (_static_activations(), "static activation scales are not supported; dynamic ones"),
    ]:
        with pytest.raises(ModelLoadError, match=message):
            ModelConfig.from_dict({**base, "quantization_config": quant})
    with pytest.raises(ModelLoadError, match="blocks two positive sizes"):
        dataclasses.replace(ModelConfig.from_dict(base), fp8_scales="weight_scale_inv", fp8_block=(128, 0))
    save_checkpoint(CASES["llama"](), tmp_path / "bf16", tiny_model_dir)
    path = write_fp8(tmp_path / "bf16", tmp_path / "fp8")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight_scale_inv"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="FP8 weight 'model.layers.1.mlp.down_proj.weight' has no "
                                             "'model.layers.1.mlp.down_proj.weight_scale_inv' beside it"):
        OfflineEngine(EngineConfig(model=str(path), dtype="float32"), SchedulerConfig())
    config = json.loads((path / "config.json").read_text())
    del config["quantization_config"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="is FP8 but config.json has no quantization_config"):
        OfflineEngine(EngineConfig(model=str(path), dtype="float32"), SchedulerConfig())


def _static_activations() -> dict:
    config = compressed_tensors_config("tensor")
    config["config_groups"]["group_0"]["input_activations"]["dynamic"] = False
    return config
