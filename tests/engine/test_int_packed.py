"""compressed-tensors' pack-quantized integer checkpoints (services/engine/int_packed.py): weights packed by
compressed-tensors itself, unpacked exactly as it unpacks them, and served as transformers serves the same
files (dense), or as the engine serves compressed-tensors' own decompression of them (experts)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from seawall.offline.engine import OfflineEngine
from services.common.errors import ModelLoadError
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.engine.int_packed import dequantize_packed, unpack
from services.engine.model_config import ModelConfig
from services.scheduler.core.scheduler import SchedulerConfig
from tests.engine.test_architectures import CASES, MAX_TOKENS, assert_matches_transformers, save_checkpoint

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

compressed_tensors = pytest.importorskip("compressed_tensors")
transformers = pytest.importorskip("transformers")
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402

GROUP = 16  # divides every projection's inputs here


def scheme(bits: int, strategy: str, symmetric: bool = True) -> QuantizationScheme:
    return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=bits, type="int", symmetric=symmetric, strategy=strategy,
        group_size=GROUP if strategy == "group" else None))


def pack(weight: torch.Tensor, bits: int, strategy: str, dtype=torch.bfloat16, symmetric=True
         ) -> dict[str, torch.Tensor]:
    """``weight`` quantized (absmax scales in ``dtype``; asymmetric: min-max, with zero points) and packed by
    compressed-tensors."""
    rows = weight.shape[0]
    spread = weight.float().view(rows, -1, GROUP) if strategy == "group" else weight.float().view(rows, 1, -1)
    state = {"weight": weight.to(dtype)}
    if symmetric:
        state["weight_scale"] = (spread.abs().amax(-1) / ((1 << (bits - 1)) - 1)).clamp(min=1e-8).to(dtype)
    else:
        low, high = spread.amin(-1).clamp(max=0), spread.amax(-1).clamp(min=0)
        state["weight_scale"] = ((high - low) / ((1 << bits) - 1)).clamp(min=1e-8).to(dtype)
        zero = torch.round(-low / state["weight_scale"].float()) - (1 << (bits - 1))
        state["weight_zero_point"] = zero.clamp(-(1 << (bits - 1)), (1 << (bits - 1)) - 1).to(torch.int8)
    return PackedQuantizationCompressor.compress(state, scheme(bits, strategy, symmetric))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("strategy", ["group", "channel"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "zero-points"])
def test_unpacked_weights_are_compressed_tensors_own_decompression(bits, strategy, dtype, symmetric):
    torch.manual_seed(bits)
    parts = pack(torch.randn(24, 64) + 0.5, bits, strategy, dtype, symmetric)
    assert ("weight_zero_point" in parts) == (not symmetric)
    want = PackedQuantizationCompressor.decompress(parts, scheme(bits, strategy, symmetric))["weight"]
    got = unpack("x.weight", parts, bits)
    assert got.dtype == want.dtype and torch.equal(got, want)


def quant_config(bits: int, strategy: str, symmetric: bool = True) -> dict:
    """What llm-compressor writes for W4A16 (group; W4A16_ASYM: with zero points) or W8A16 (channel)."""
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric, "dynamic": False, "strategy": strategy,
               "group_size": GROUP if strategy == "group" else None, "actorder": None}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                                                 "input_activations": None}}}


def write_packed(src, out, bits, strategy, decompressed=None, symmetric=True):
    """``src``'s checkpoint with every projection (experts' too) packed, written to ``out``; with
    ``decompressed``, also compressed-tensors' decompression of it as a plain checkpoint there."""
    out.mkdir()
    tensors, plain = {}, {}
    for name, t in load_file(str(src / "model.safetensors")).items():
        if name.endswith("proj.weight") or ".experts." in name:
            parts = pack(t, bits, strategy, symmetric=symmetric)
            module = name.removesuffix(".weight")
            tensors |= {f"{module}.{part}": value for part, value in parts.items()}
            plain[name] = PackedQuantizationCompressor.decompress(parts, scheme(bits, strategy, symmetric))[
                "weight"].float()
        else:
            tensors[name] = plain[name] = t
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": quant_config(bits, strategy,
                                                                                               symmetric)}))
    for target, weights, extra in ((out, None, {}), (decompressed, plain, config)):
        if target is None:
            continue
        target.mkdir(exist_ok=True)
        if weights is not None:
            save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
            (target / "config.json").write_text(json.dumps(extra))
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (src / name).exists():
                (target / name).write_bytes((src / name).read_bytes())
    return out


def generate(path, prompts):
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32"), SchedulerConfig(chunk_size=16))
    return engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                                    logprobs=0)] * len(prompts))


PROMPTS = [torch.randint(3, 4096, (n,), generator=torch.Generator().manual_seed(9)).tolist() for n in (3, 40)]


@pytest.mark.parametrize("bits, strategy, symmetric", [(4, "group", True), (8, "channel", True), (4, "group", False)])
def test_a_packed_checkpoint_matches_transformers_loading_the_same_files(tmp_path, tiny_model_dir, bits, strategy,
                                                                          symmetric):
    save_checkpoint(CASES["qwen2"](), tmp_path / "fp32", tiny_model_dir)
    path = write_packed(tmp_path / "fp32", tmp_path / "packed", bits, strategy, symmetric=symmetric)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32,
        quantization_config=transformers.CompressedTensorsConfig(run_compressed=False)).eval()
    assert type(ref.model.layers[0].mlp.down_proj) is torch.nn.Linear  # decompressed, as the engine holds it
    assert_matches_transformers(ref, PROMPTS, generate(path, PROMPTS))


def test_packed_experts_serve_as_their_decompressed_weights(tmp_path, tiny_model_dir):
    """Kimi K2 Thinking packs its experts: per-expert packed tensors load into the stacked experts."""
    save_checkpoint(CASES["qwen3-moe"](), tmp_path / "fp32", tiny_model_dir)
    path = write_packed(tmp_path / "fp32", tmp_path / "packed", 4, "group", decompressed=tmp_path / "plain")
    packed, plain = generate(path, PROMPTS), generate(tmp_path / "plain", PROMPTS)
    for a, b in zip(packed, plain, strict=True):
        assert a.token_ids == b.token_ids and [lp.logprob for lp in a.logprobs] == [lp.logprob for lp in b.logprobs]


def test_what_cannot_be_loaded_is_refused_saying_why():
    base = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = quant_config(4, "group")
    weights = config["config_groups"]["group_0"]["weights"]
    assert ModelConfig.from_dict({**base, "quantization_config": config}).packed_int_bits == 4
    asymmetric = ModelConfig.from_dict({**base, "quantization_config": {**config, "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {**weights, "symmetric": False}}}}})
    assert asymmetric.packed_int_zero_points
    for change, error in [({"num_bits": 3}, "4- or 8-bit integer"),
                          ({"strategy": "tensor"}, "weight strategy 'tensor'"), ({"group_size": None}, "group_size"),
                          ({"actorder": "group"}, "actorder 'group' stores groups out of order")]:
        bad = {**config, "config_groups": {"group_0": {"targets": ["Linear"], "weights": {**weights, **change}}}}
        with pytest.raises(ModelLoadError, match=error):
            ModelConfig.from_dict({**base, "quantization_config": bad})
    w8a8 = {**config, "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                                    "input_activations": {"num_bits": 8, "type": "int"}}}}
    with pytest.raises(ModelLoadError, match="W4A16 and W8A16 are"):
        ModelConfig.from_dict({**base, "quantization_config": w8a8})
    parts = pack(torch.randn(4, 32), 4, "group")
    with pytest.raises(KeyError, match="packed weight m.weight lacks m.weight_shape"):
        list(dequantize_packed([("m.weight_packed", parts["weight_packed"]),
                                ("m.weight_scale", parts["weight_scale"])], 4))
    with pytest.raises(KeyError, match="cannot hold a weight of shape"):
        unpack("m.weight", {**parts, "weight_shape": torch.tensor([4, 64])}, 4)
