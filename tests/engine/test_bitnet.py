"""BitNet b1.58's ternary checkpoints (services/engine/bitnet.py): weights packed four to a byte by transformers'
own ``pack_weights``, scaled ternary weights and float masters rounded as they load, each served as transformers
serves the same files (its ``BitLinear`` / ``AutoBitLinear``, activations rounded per token)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.common.errors import ModelLoadError
from services.engine.bitnet import quantize_activations, ternary_weights, unpack
from services.engine.model_config import ModelConfig
from tests.engine.test_architectures import COMMON, greedy_matches_transformers, save_checkpoint

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

# Rounding activations to 8-bit levels magnifies fp32's last-bit differences (the paged attention's sums are not
# transformers' SDPA's): a value ~1e-6 from a level's midpoint rounds the other way, moving by a whole level (a
# 127th of the token's largest feature). Measured: the projections' inputs agree to ~2e-6, logprobs to ~0.02 (to
# 1e-5 with the rounding switched off on both sides); the greedy tokens are the same.
LOGPROB_TOL = 0.05

transformers = pytest.importorskip("transformers")
from transformers.integrations.bitnet import pack_weights  # noqa: E402


@pytest.fixture(autouse=True)
def _eager():
    """transformers' BitNet layers are ``torch.compile``d: run eagerly (compiling them took ~25 s of the CPU)."""
    with torch.compiler.set_stance("force_eager"):
        yield


QUANT = {"packed": {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline"},
         "scaled": {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "offline"},
         "online": {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online"}}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _ternary(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values in -1, 0, 1; the scale that maps the weight onto them): transformers' WeightQuant."""
    scale = 1.0 / weight.abs().mean().clamp(min=1e-5)
    return (weight * scale).round().clamp(-1, 1), scale


def quantized_checkpoint(config, layout: str, out, tiny_model_dir):
    """A checkpoint of ``config`` whose projections are stored as ``layout`` says; returns transformers' model
    loaded from it (its BitNet quantizer)."""
    save_checkpoint(config, out, tiny_model_dir)
    tensors = load_file(out / "model.safetensors")
    if layout != "online":
        for name in [n for n in tensors if n.rpartition(".")[0].rpartition(".")[2] in PROJECTIONS]:
            values, scale = _ternary(tensors[name])
            module = name.removesuffix(".weight")
            # bitlinear divides the output by its scale, autobitlinear multiplies by it; packed where "packed",
            # scaled weights stored as floats of -1, 0 and 1 in one layer, packed in the others.
            packed = layout == "packed" or ".layers.0." not in name
            tensors[name] = pack_weights(values.to(torch.int8)) if packed else values
            tensors[f"{module}.weight_scale"] = (scale if layout == "packed" else 1.0 / scale).reshape(1)
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**raw, "quantization_config": QUANT[layout]}))
    return transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()


@pytest.mark.parametrize("layout", list(QUANT))
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_ternary_checkpoints_serve_as_transformers_serves_them(layout, cpu_kernels, tmp_path, tiny_model_dir):
    model = quantized_checkpoint(transformers.BitNetConfig(**COMMON), layout, tmp_path, tiny_model_dir)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (1, 17, 40, 150)]
    greedy_matches_transformers(tmp_path, model, prompts, cpu_kernels, LOGPROB_TOL)


def test_a_ternary_llama_is_served_off_the_fused_path(tmp_path, tiny_model_dir):
    """HF1BitLLM's Llama 3 form: a Llama (SwiGLU, which the fused CPU forward would take) with packed ternary
    projections and no sub-norms."""
    model = quantized_checkpoint(transformers.LlamaConfig(**COMMON), "packed", tmp_path, tiny_model_dir)
    config = ModelConfig.from_dir(tmp_path)
    assert config.ternary_weights == "packed" and not config.sub_norms and not config.fused_blocks
    g = torch.Generator().manual_seed(12)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (5, 60)]
    greedy_matches_transformers(tmp_path, model, prompts, True, LOGPROB_TOL)


def test_unpacking_is_transformers_unpacking():
    from transformers.integrations.bitnet import unpack_weights

    values = torch.randint(-1, 2, (24, 5), generator=torch.Generator().manual_seed(0))
    packed = pack_weights(values.clone())
    assert packed.shape == (6, 5) and packed.dtype == torch.uint8
    assert torch.equal(unpack(packed), values.to(torch.int8))
    assert torch.equal(unpack(packed).float(), unpack_weights(packed, dtype=torch.float32))


def test_activations_round_per_token_as_transformers_rounds_them():
    from transformers.integrations.bitnet import ActQuant

    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1)) * torch.tensor([[0.01], [1], [10], [0], [3]])
    got = quantize_activations(x)
    assert torch.equal(got, ActQuant.apply(x))
    assert all(len(torch.unique(row)) <= 255 for row in got)  # 8-bit levels per token


def test_missing_or_malformed_scales_are_named():
    w = pack_weights(torch.ones(8, 4, dtype=torch.int8))
    with pytest.raises(KeyError, match=r"model.layers.0.mlp.up_proj.weight lacks model.layers.0.mlp.up_proj.weight_scale"):
        list(ternary_weights([("model.layers.0.mlp.up_proj.weight", w)], "packed"))
    with pytest.raises(KeyError, match="one number per tensor"):
        list(ternary_weights([("model.layers.0.mlp.up_proj.weight", w),
                              ("model.layers.0.mlp.up_proj.weight_scale", torch.ones(2))], "packed"))
    with pytest.raises(KeyError, match="packed in uint8"):
        list(ternary_weights([("model.layers.0.mlp.up_proj.weight", torch.ones(8, 4)),
                              ("model.layers.0.mlp.up_proj.weight_scale", torch.ones(1))], "packed"))
    with pytest.raises(KeyError, match="is offline"):
        list(ternary_weights([("model.layers.0.mlp.up_proj.weight_scale", torch.ones(1))], "online"))
    # Norms, embeddings and the head pass as stored.
    norm = torch.ones(4)
    assert list(ternary_weights([("model.norm.weight", norm)], "online"))[0][1] is norm


def test_bitnet_configs_read_as_released_and_what_is_refused():
    """microsoft/bitnet-b1.58-2B-4T's config.json (packed weights), and its -bf16 masters' (online)."""
    released = {"architectures": ["BitNetForCausalLM"], "bos_token_id": 128000, "eos_token_id": 128001,
                "hidden_act": "relu2", "hidden_size": 2560, "intermediate_size": 6912,
                "max_position_embeddings": 4096, "model_type": "bitnet", "num_attention_heads": 20,
                "num_hidden_layers": 30, "num_key_value_heads": 5, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
                "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 128256,
                "quantization_config": {"linear_class": "bitlinear", "quant_method": "bitnet",
                                        "quantization_mode": "offline"}}
    config = ModelConfig.from_dict(released)
    assert (config.ternary_weights, config.sub_norms, config.hidden_act, config.head_dim, config.num_key_value_heads,
            config.rope_theta, config.tie_word_embeddings) == ("packed", True, "relu2", 128, 5, 500000.0, True)
    assert "ternary" in config.lora_shape.no_adapters
    masters = ModelConfig.from_dict({**released, "quantization_config": QUANT["online"]})
    assert masters.ternary_weights == "online"
    assert ModelConfig.from_dict({k: v for k, v in released.items() if k != "quantization_config"}).ternary_weights \
        is None  # unquantized bf16 weights: served as stored, as transformers serves them
    for bad, match in ((dict(use_rms_norm=True), "use_rms_norm"), (dict(linear_class="other"), "not supported"),
                       (dict(modules_to_not_convert=["lm_head", "model.layers.0.mlp"]), "modules_to_not_convert")):
        with pytest.raises(ModelLoadError, match=match):
            ModelConfig.from_dict({**released, "quantization_config": {**QUANT["packed"], **bad}})
    with pytest.raises(ModelLoadError, match="dense MLPs"):
        ModelConfig.from_dict({"architectures": ["MixtralForCausalLM"], "vocab_size": 64, "hidden_size": 16,
                               "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                               "quantization_config": QUANT["packed"]})
