"""MXFP4 checkpoints (services/engine/mxfp4.py, GPT-OSS's released format): experts quantized here as OpenAI's
are (e2m1 codes in blocks of 32 sharing a power-of-two scale) and compared with transformers dequantizing the
same files."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.common.errors import ModelLoadError
from services.engine.gpt_oss_weights import gpt_oss_weights
from services.engine.model_config import ModelConfig
from services.engine.mxfp4 import FP4_VALUES, Packed, pair_packed, unpack
from tests.engine.test_architectures import CASES, engine_matches_transformers, save_checkpoint

transformers = pytest.importorskip("transformers")


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., K]`` (K a multiple of 32) → packed codes ``[..., K / 32, 16]`` and biased exponents
    ``[..., K / 32]``: each block scaled by the power of two that brings its largest value within e2m1's 6,
    each value rounded to the nearest code, two codes a byte, the low nibble first."""
    g = w.unflatten(-1, (-1, 32))
    exp = torch.ceil(torch.log2(g.abs().amax(-1).clamp(min=2.0**-126) / 6.0))
    scaled = g / torch.exp2(exp)[..., None]
    codes = ((scaled.abs()[..., None] - torch.tensor(FP4_VALUES[:8])).abs().argmin(-1) + 8 * (scaled < 0)).to(torch.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous(), (exp + 127).to(torch.uint8)


def write_mxfp4(src, out):
    """``src``'s GPT-OSS checkpoint with its experts' weights packed as the released checkpoints pack them:
    ``[E, out, in]`` (transposed from the unpacked layout) in blocks along ``in``."""
    out.mkdir()
    tensors = {}
    for name, t in load_file(str(src / "model.safetensors")).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name + "_blocks"], tensors[name + "_scales"] = quantize_mxfp4(t.transpose(1, 2))
        else:
            tensors[name] = t
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((src / name).read_bytes())
    return out


def test_unpacking_matches_transformers_for_every_code_and_scale():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks = torch.arange(256, dtype=torch.uint8).repeat(3, 2, 1).view(3, 2, 16, 16)  # every byte, so every code
    scales = torch.tensor([0, 1, 100, 127, 128, 150, 200, 254], dtype=torch.uint8).repeat(12).view(3, 2, 16)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)  # theirs is [E, in, out]
    for dtype in (torch.float32, torch.bfloat16):
        got = unpack(blocks, scales, dtype)
        assert got.shape == (3, 2, 16 * 32) and got.dtype == dtype
        assert torch.equal(got.float(), want)
    # The byte 0x9F holds code 15 (-6) in its low nibble, then code 9 (-0.5); scale 128 doubles them.
    assert unpack(torch.tensor([[0x9F] * 16], dtype=torch.uint8), torch.tensor([128], dtype=torch.uint8),
                  torch.float32)[:2].tolist() == [-12.0, -1.0]


def test_quantizing_then_unpacking_is_close_and_the_errors_name_what_is_wrong():
    w = torch.randn(8, 64)
    blocks, scales = quantize_mxfp4(w)
    assert (unpack(blocks, scales, torch.float32) - w).abs().max() <= w.abs().max() / 4  # e2m1's coarsest step
    with pytest.raises(KeyError, match="expected uint8"):
        unpack(blocks.int(), scales)
    pairs = list(pair_packed([("a.weight", w), ("x_scales", scales), ("b", w), ("x_blocks", blocks)]))
    assert [name for name, _ in pairs] == ["a.weight", "b", "x"] and isinstance(pairs[2][1], Packed)
    with pytest.raises(KeyError, match="'x' has blocks but no scales"):
        list(pair_packed([("x_blocks", blocks)]))
    with pytest.raises(KeyError, match="only GPT-OSS's expert weights are read packed"):
        list(gpt_oss_weights([("model.layers.0.self_attn.q_proj.weight", Packed(blocks, scales))]))


def test_the_config_reads_mxfp4_and_refuses_other_quantizations():
    raw = {**CASES["gpt-oss"]().to_dict(), "quantization_config": {"quant_method": "mxfp4"}}
    assert ModelConfig.from_dict(raw).mxfp4
    with pytest.raises(ModelLoadError, match="quantization 'bitsandbytes' is not supported.*MXFP4"):
        ModelConfig.from_dict({**raw, "quantization_config": {"quant_method": "bitsandbytes"}})


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_mxfp4_checkpoints_match_transformers_dequantizing_the_same_files(tmp_path, tiny_model_dir, cpu_kernels):
    save_checkpoint(CASES["gpt-oss"](), tmp_path / "fp32", tiny_model_dir)
    path = write_mxfp4(tmp_path / "fp32", tmp_path / "mxfp4")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32).eval()
    engine_matches_transformers(path, ref, cpu_kernels)
