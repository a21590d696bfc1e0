"""Mellum 2 (services/engine/mellum.py) read as transformers reads it: its default layout, per-type RoPE and windows,
dense layers by ``mlp_layer_types``, its multi-token-prediction layer skipped, and what is refused. The oracle runs
are in test_architectures.py ("mellum": fp32 tokens and logprobs both paths, bf16 bit for bit)."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ModelLoadError
from services.engine.model_config import ModelConfig

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")

ARCH = "MellumForCausalLM"
_S, _F = "sliding_attention", "full_attention"


def test_named_alone_it_takes_transformers_defaults():
    """Its shape: 28 layers of full attention (a RoPE base of 5e5), every one routing to 8 of 64 experts of 896,
    renormalized; q/k norms; untied embeddings."""
    config, hf = ModelConfig.from_dict({"architectures": [ARCH]}), transformers.MellumConfig()
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
            config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.max_position_embeddings,
            config.rms_norm_eps, config.tie_word_embeddings, config.rope_theta) == (
        hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads,
        hf.num_key_value_heads, hf.head_dim, hf.max_position_embeddings, hf.rms_norm_eps, hf.tie_word_embeddings,
        hf.rope_parameters[_F]["rope_theta"])
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size, config.norm_topk_prob,
            config.moe_layers) == (hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size,
                                   hf.norm_topk_prob, tuple(range(28)))
    assert config.sliding_window is None and config.qk_norm and config.architecture == ARCH


def test_layer_types_set_windows_rope_bases_and_dense_layers():
    hf = transformers.MellumConfig(num_hidden_layers=6, layer_types=[_S, _S, _F] * 2, sliding_window=512,
                                   mlp_layer_types=["dense", "dense"] + ["sparse"] * 4)
    config = ModelConfig.from_dict({**hf.to_dict(), "architectures": [ARCH]})
    assert (config.sliding_window, config.sliding_layers) == (512, (0, 1, 3, 4))
    assert (config.rope_theta, config.local_rope_theta) == (500000.0, 10000.0)
    assert config.moe_layers == (2, 3, 4, 5)
    every = ModelConfig.from_dict({**transformers.MellumConfig(num_hidden_layers=2, layer_types=[_S, _S]).to_dict(),
                                   "architectures": [ARCH]})
    assert (every.sliding_window, every.sliding_layers) == (1024, None)  # None: every layer slides


def test_its_multi_token_prediction_layer_is_skipped(tmp_path, tiny_model_dir):
    """A checkpoint with its ``mtp.*`` tensors loads as transformers loads it, ignoring them, and generates as
    transformers does."""
    from safetensors.torch import load_file, save_file

    from seawall.offline.engine import OfflineEngine
    from services.common.sampling_params import SamplingParams
    from services.engine.config import EngineConfig
    from services.scheduler.core.scheduler import SchedulerConfig
    from tests.engine.test_architectures import CASES, save_checkpoint

    model = save_checkpoint(CASES["mellum"](), tmp_path, tiny_model_dir)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["mtp.layers.0.eh_proj.weight"] = torch.ones(64, 128)
    weights["mtp.layers.0.enorm.weight"] = torch.ones(64)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    prompt = list(range(10, 40))
    engine = OfflineEngine(EngineConfig(model=str(tmp_path), dtype="float32"), SchedulerConfig())
    got = engine.generate([prompt], [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)])[0].token_ids
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0,
                              eos_token_id=None)[0, len(prompt):].tolist()
    assert got == want


@pytest.mark.parametrize(("fields", "message"), [
    ({"layer_types": [_F, "chunked_attention"]}, "layer_types must name each of the 2 layers"),
    ({"mlp_layer_types": ["dense"]}, "mlp_layer_types must name each of the 2 layers dense or sparse"),
    ({"rope_parameters": {_F: {"rope_type": "default", "rope_theta": 1e4},
                          _S: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "sliding layers are served with default RoPE only"),
    ({"rope_parameters": {_F: {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
                          _S: {"rope_type": "default", "rope_theta": 1e4}}}, "the same share of each head"),
    ({"layer_types": [_S, _F], "sliding_window": None}, "sliding_window must be >= 1 where layers slide"),
])
def test_what_cannot_run_is_refused_saying_why(fields, message):
    raw = {"architectures": [ARCH], "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
           "intermediate_size": 32, "vocab_size": 512, "num_hidden_layers": 2, **fields}
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict(raw)
