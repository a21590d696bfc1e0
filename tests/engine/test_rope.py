"""RoPE frequencies and cos/sin scale against transformers' own initializers, bit for bit, for each scaling
the engine supports, in the shapes configs come in (hub ``rope_scaling`` with ``type``, DeepSeek's mscale)."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument, ModelLoadError
from services.engine.model_config import ModelConfig
from services.engine.rope import attention_factor, inverse_frequencies

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

BASE = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=131072, rope_theta=1000000.0)
SCALINGS = {
    "linear": {"type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192},
    "yarn-qwen2.5": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
                    "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 65536,
                              "attention_factor": 1.25, "truncate": False},
}


@pytest.mark.parametrize("name", SCALINGS)
def test_frequencies_and_scale_equal_transformers(name):
    raw = dict(BASE, architectures=["Qwen2ForCausalLM"], rope_scaling=SCALINGS[name])
    hf = transformers.Qwen2Config(**{k: v for k, v in raw.items() if k != "architectures"})
    rope_type = hf.rope_parameters["rope_type"]
    want_freq, want_scale = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    config = ModelConfig.from_dict(raw)
    assert config.rope_type == rope_type
    assert torch.equal(inverse_frequencies(config), want_freq)
    assert attention_factor(config) == pytest.approx(want_scale, rel=1e-12)


@pytest.mark.parametrize("partial", [1.0, 0.75])
def test_longrope_picks_its_factors_by_the_served_context(partial):
    """Phi-3.5 / Phi-4-mini: the long factors when the served context exceeds the pretrained one (transformers
    uses them once a pass reaches past it), the short ones under ``--max-model-len`` at or below it; cos and
    sin scaled by the checkpoint's factor either way."""
    rotated = int(64 * partial) // 2
    raw = dict(BASE, architectures=["Phi3ForCausalLM"], original_max_position_embeddings=4096,
               partial_rotary_factor=partial,
               rope_scaling={"type": "longrope", "short_factor": [1.0 + i / 100 for i in range(rotated)],
                             "long_factor": [1.5 + i for i in range(rotated)]})
    hf = transformers.Phi3Config(**{k: v for k, v in raw.items() if k != "architectures"})
    config = ModelConfig.from_dict(raw)
    assert config.rotary_dim == 2 * rotated and config.max_model_len == 131072
    long_freq, want_scale = ROPE_INIT_FUNCTIONS["longrope"](hf, torch.device("cpu"), seq_len=4097)
    short_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](hf, torch.device("cpu"))
    assert not torch.equal(long_freq, short_freq)
    assert torch.equal(inverse_frequencies(config), long_freq)
    assert torch.equal(inverse_frequencies(config.with_max_model_len(4097)), long_freq)
    assert torch.equal(inverse_frequencies(config.with_max_model_len(4096)), short_freq)
    for served in (config, config.with_max_model_len(4096)):
        assert attention_factor(served) == pytest.approx(want_scale, rel=1e-12) and want_scale > 1


def test_longrope_and_partial_rotary_configs_are_checked():
    raw = dict(BASE, architectures=["Phi3ForCausalLM"], original_max_position_embeddings=4096,
               rope_scaling={"type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32})
    with pytest.raises(ModelLoadError, match="short_factor must list 24 positive numbers"):
        ModelConfig.from_dict({**raw, "partial_rotary_factor": 0.75})
    with pytest.raises(ModelLoadError, match="long_factor must list 32"):
        ModelConfig.from_dict({**raw, "rope_scaling": {**raw["rope_scaling"], "long_factor": [0.0] * 32}})
    with pytest.raises(ModelLoadError, match="needs original_max_position_embeddings"):
        ModelConfig.from_dict({k: v for k, v in raw.items() if k != "original_max_position_embeddings"})
    with pytest.raises(ModelLoadError, match="even number of rotated features"):
        ModelConfig.from_dict({**raw, "rope_scaling": None, "partial_rotary_factor": 0.01})
    with pytest.raises(ModelLoadError, match="RoPE over part of each head is supported for Phi3ForCausalLM"):
        ModelConfig.from_dict({**raw, "architectures": ["LlamaForCausalLM"], "partial_rotary_factor": 0.5})
    with pytest.raises(InvalidArgument, match="max_model_len 131073 must be between 1 and"):
        ModelConfig.from_dict(raw).with_max_model_len(131073)
    assert ModelConfig.from_dict(raw).with_max_model_len(100).max_model_len == 100
