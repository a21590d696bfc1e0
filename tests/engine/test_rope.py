"""RoPE frequencies and cos/sin scale against transformers' own initializers, bit for bit, for each scaling
the engine supports, in the shapes configs come in (hub ``rope_scaling`` with ``type``, DeepSeek's mscale)."""

from __future__ import annotations

import pytest
import torch

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
