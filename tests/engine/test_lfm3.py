"""LFM3 (services/engine/lfm3.py) read as transformers reads it: its defaults, its two RoPEs (the sliding layers'
default one at a base of their own, the full layers' proportional one, bit for bit), and what is refused. The
oracle runs of whole checkpoints are in test_architectures.py ("lfm3", "lfm3-plain") and, through every
scheduling path, tests/seawall/offline/test_linear_attention.py."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ModelLoadError
from services.engine.model_config import ModelConfig
from services.engine.rope import inverse_frequencies

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")


def test_defaults_read_as_transformers_reads_them():
    """Named alone: conv layers but every fourth from the third (full) and from the fifth (sliding, a window of
    256), the heads gated, sandwich norms, a 7-wide convolution window, the head tied."""
    config, hf = ModelConfig.from_dict({"architectures": ["Lfm3ForCausalLM"]}), transformers.Lfm3Config()
    types = hf.layer_types
    assert config.linear_layers == tuple(i for i, t in enumerate(types) if t == "conv")
    assert config.kv_layers == tuple(i for i, t in enumerate(types) if t != "conv")
    assert config.sliding_layers == tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    assert (config.sliding_window, config.head_dim, config.rms_norm_eps, config.tie_word_embeddings) == (
        hf.sliding_window, hf.head_dim, hf.norm_eps, hf.tie_word_embeddings)
    assert (config.bos_token_id, config.eos_token_ids, config.vocab_size, config.intermediate_size) == (
        hf.bos_token_id, (hf.eos_token_id,), hf.vocab_size, hf.intermediate_size)
    assert config.rope_type == "proportional" and config.rotary_dim == config.head_dim
    assert (config.rope_theta, config.local_rope_theta) == (
        hf.rope_parameters["full_attention"]["rope_theta"], hf.rope_parameters["sliding_attention"]["rope_theta"])
    assert (config.sandwich_norms, config.attn_output_gate, config.qk_norm) == (True, "per_head", True)
    assert config.linear_attention.conv_kernel == hf.conv_L_cache and not config.linear_attention.bias


@pytest.mark.parametrize("share", [0.5, 0.25, 1.0])
def test_both_ropes_have_transformers_frequencies(share):
    from transformers.models.lfm3.modeling_lfm3 import Lfm3RotaryEmbedding

    rope = {"full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": share},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    hf = Lfm3RotaryEmbedding(transformers.Lfm3Config(head_dim=64, rope_parameters=rope, num_hidden_layers=8))
    config = ModelConfig.from_dict({"architectures": ["Lfm3ForCausalLM"], "head_dim": 64, "rope_parameters": rope,
                                    "num_hidden_layers": 8})
    assert torch.equal(inverse_frequencies(config), hf.full_attention_inv_freq)
    assert torch.equal(inverse_frequencies(config, local=True), hf.sliding_attention_inv_freq)


def test_what_is_refused():
    base = {"architectures": ["Lfm3ForCausalLM"], "num_hidden_layers": 3}
    with pytest.raises(ModelLoadError, match="conv, full_attention or sliding_attention; got mamba"):
        ModelConfig.from_dict({**base, "layer_types": ["conv", "mamba", "full_attention"]})
    with pytest.raises(ModelLoadError, match="without an attention layer"):
        ModelConfig.from_dict({**base, "layer_types": ["conv"] * 3})
    with pytest.raises(ModelLoadError, match="sliding layers are served with default RoPE only"):
        ModelConfig.from_dict({**base, "layer_types": ["conv", "sliding_attention", "full_attention"],
                               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                   "sliding_attention": {"rope_type": "linear", "factor": 2.0}}})
    with pytest.raises(ModelLoadError, match="conv_L_cache must be >= 2"):
        ModelConfig.from_dict({**base, "conv_L_cache": 1})
