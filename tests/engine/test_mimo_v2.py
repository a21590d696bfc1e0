"""MiMo-V2-Flash (services/engine/mimo_v2.py) read as transformers reads it: its default layout, the sliding
layers' KV heads and sinks, values narrower than keys, the window of ``sliding_window_size``, and what is refused.
The oracle runs are in test_architectures.py ("mimo-v2-flash": fp32 both paths, bf16 bit for bit),
tests/seawall/offline/test_layer_kv_shapes.py (every scheduling path) and tests/e2e/test_layer_kv_shapes_mesh.py."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.errors import InvalidArgument, ModelLoadError
from services.common.lora import read_lora
from services.common.step import LoraRef
from services.engine.checkpoint_report import kv_bytes_per_token
from services.engine.model_config import ModelConfig

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")

ARCH = "MiMoV2FlashForCausalLM"


def test_named_alone_it_takes_transformers_defaults():
    """MiMo-V2-Flash's shape: 48 layers, full attention in the first and every sixth (4 KV heads), sliding in the
    rest (8, with sinks); heads of 192 whose values are 128 wide, scaled by 0.707; 256 experts, 8 a token, after a
    dense first layer; a third of each head rotated, at 5e6 in the full layers and 1e4 in the sliding ones."""
    config, hf = ModelConfig.from_dict({"architectures": [ARCH]}), transformers.MiMoV2FlashConfig()
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
            config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.max_position_embeddings,
            config.rms_norm_eps, config.tie_word_embeddings) == (
        hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads,
        hf.num_key_value_heads, hf.head_dim, hf.max_position_embeddings, hf.rms_norm_eps, hf.tie_word_embeddings)
    sliding = tuple(i for i, t in enumerate(hf.layer_types) if t == "sliding_attention")
    assert config.sliding_layers == sliding and config.sliding_window == hf.sliding_window
    assert config.sink_layers == sliding and config.attention_sinks
    assert all(config.layer_heads(i) == ((8 if i in sliding else 4), 192) for i in range(48))
    assert (config.value_head_dim, config.value_scale) == (hf.v_head_dim, hf.attention_value_scale)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (
        hf.n_routed_experts, hf.num_experts_per_tok, hf.moe_intermediate_size)
    assert config.moe_layers == tuple(i for i, t in enumerate(hf.mlp_layer_types) if t == "sparse")
    assert config.moe_routing == "sigmoid" and not config.shared_expert_intermediate_size
    assert (config.rope_theta, config.local_rope_theta, config.rotary_dim) == (5e6, 1e4, int(192 * 0.334))
    # 9 full layers of 4 KV heads, 39 sliding of 8: runs of one and two slots of 4 x 192 keys and values.
    assert len(sliding) == 39 and (config.kv_slot, config.kv_slots) == ((4, 192), 9 + 39 * 2)
    assert kv_bytes_per_token(config, "bfloat16") == (9 * 4 + 39 * 8) * 192 * 2 * 2
    assert not config.plain_attention  # the fused forward calls its attention module


def test_the_window_of_sliding_window_size_and_the_hub_routing_scale():
    """``sliding_window_size`` counts the keys before the query (transformers adds one); the hub's config says
    null for the routing scale, which is 1."""
    raw = {"architectures": [ARCH], "num_hidden_layers": 6, "sliding_window_size": 128,
           "routed_scaling_factor": None}
    hf = transformers.MiMoV2FlashConfig(num_hidden_layers=6, sliding_window_size=128, routed_scaling_factor=None)
    config = ModelConfig.from_dict(raw)
    assert config.sliding_window == hf.sliding_window == 129
    assert config.routed_scaling_factor == hf.routed_scaling_factor == 1.0


@pytest.mark.parametrize(("fields", "message"), [
    ({"v_head_dim": 32}, "v_head_dim must be in 1..head_dim \\(24\\)"),
    ({"num_attention_heads": 2, "num_key_value_heads": 2, "hidden_size": 48},
     "sliding layers' 4 KV heads \\(twice num_key_value_heads\\) must divide num_attention_heads \\(2\\)"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types must name each of the 2 layers"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6},
                          "sliding_attention": {"rope_theta": 1e4}}}, "served with default RoPE only"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e6, "partial_rotary_factor": 0.5},
                          "sliding_attention": {"rope_theta": 1e4, "partial_rotary_factor": 0.25}}},
     "must rotate the same share of each head"),
])
def test_what_cannot_run_is_refused_saying_why(fields, message):
    raw = {"architectures": [ARCH], "hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 1,
           "head_dim": 24, "v_head_dim": 16, "num_hidden_layers": 2, **fields}
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict(raw)


def test_a_lora_adapter_is_refused_saying_why(tmp_path):
    config = ModelConfig.from_dict({"architectures": [ARCH], "num_hidden_layers": 2, "hidden_size": 96,
                                    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 24,
                                    "v_head_dim": 16})
    with pytest.raises(InvalidArgument, match="MiMoV2FlashForCausalLM takes no LoRA adapters"):
        read_lora(LoraRef("sql", str(tmp_path)), config.lora_shape, 96)


@pytest.mark.parametrize(("fields", "message"), [
    ({"sliding_layer_heads": (3, 24)}, "sliding_layer_heads \\(3, 24\\): .* dividing num_attention_heads \\(4\\)"),
    ({"full_layer_heads": (0, 24)}, "full_layer_heads \\(0, 24\\)"),
    ({"value_head_dim": 25}, "value_head_dim 25 must be in 1..head_dim"),
    ({"value_scale": 0.0}, "value_scale must be a positive number"),
    ({"sink_layers": (5,)}, "sink_layers \\(5,\\) are layers with attention sinks"),
    ({"attention_sinks": False}, "sink_layers \\(1,\\) are layers with attention sinks: set attention_sinks"),
])
def test_layer_shape_fields_are_checked(fields, message):
    config = ModelConfig.from_dict({"architectures": [ARCH], "num_hidden_layers": 2, "hidden_size": 96,
                                    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 24,
                                    "v_head_dim": 16})
    with pytest.raises(ModelLoadError, match=message):
        dataclasses.replace(config, **fields)
