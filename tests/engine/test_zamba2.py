"""Zamba2 (services/engine/zamba2.py, zamba2_layer.py) read as transformers reads it: its default layout, the shared
blocks' layers and adapters, attention over twice the hidden width, the checkpoint's names, and what is refused.
The oracle runs of whole checkpoints are in test_architectures.py ("zamba2", "zamba2-1.2b") and, through every
scheduling path, tests/seawall/offline/test_linear_attention.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.common.errors import InvalidArgument, ModelLoadError
from services.common.lora import read_lora
from services.common.step import LoraRef
from services.engine.model_config import ModelConfig
from services.engine.zamba2 import SharedBlocks, checkpoint_names

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")


def _read(**fields) -> tuple[ModelConfig, object]:
    hf = transformers.Zamba2Config(**fields)
    return ModelConfig.from_dict({**hf.to_dict(), "architectures": ["Zamba2ForCausalLM"]}), hf


def test_the_default_layout_reads_as_transformers_builds_it():
    """Zamba2-2.7B's shape: 54 layers, Mamba-2 in each, a shared block in nine; attention 2 x 2560 wide."""
    config, hf = _read()
    blocks = config.shared_blocks
    assert config.num_hidden_layers == 54 and config.linear_layers == tuple(range(54))
    assert blocks.layers == tuple(hf.hybrid_layer_ids) == config.kv_layers
    assert (blocks.num_blocks, blocks.adapter_rank, blocks.attention_adapters, blocks.use_rope) == (1, 128, False,
                                                                                                    False)
    assert (config.head_dim, config.num_key_value_heads) == (hf.attention_head_dim, hf.num_key_value_heads)
    assert config.attn_scale == pytest.approx((hf.attention_head_dim / 2) ** -0.5)
    assert config.nope_layers == blocks.layers  # no RoPE without use_mem_rope
    m = config.linear_attention
    assert (m.num_heads, m.head_dim, m.state_size, m.n_groups, m.chunk_size) == (
        hf.n_mamba_heads, hf.mamba_headdim, hf.mamba_d_state, hf.mamba_ngroups, hf.chunk_size)
    assert (m.gated_norm, m.norm_eps, m.conv_bias, m.time_step_limit) == ("gate_then_norm", 1e-5, True,
                                                                          (hf.time_step_min, float("inf")))
    assert config.intermediate_size == hf.intermediate_size == 4 * 2560 and config.tie_word_embeddings
    assert not config.fused_blocks  # the torch forward computes its layers


def test_legacy_layer_names_long_context_rope_and_biases():
    config, hf = _read(layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], num_hidden_layers=4,
                       num_mem_blocks=2, use_shared_attention_adapter=True, use_mem_rope=True, use_long_context=True,
                       add_bias_linear=True, hidden_size=64, num_attention_heads=4)
    assert config.shared_blocks == SharedBlocks((1, 3), 2, 128, True, True) and config.nope_layers == ()
    assert config.max_position_embeddings == hf.max_position_embeddings == 16384
    assert config.mlp_bias and config.linear_attention.proj_bias


@pytest.mark.parametrize(("fields", "message"), [
    ({"hidden_act": "silu"}, "hidden_act 'silu'; Zamba2's MLP gates through gelu"),
    ({"num_attention_heads": 3}, "num_attention_heads \\(3\\) must divide 2 \\* hidden_size"),
    ({"use_shared_attention_adapter": True, "num_key_value_heads": 2},
     "use_shared_attention_adapter needs num_key_value_heads equal to num_attention_heads"),
    ({"layers_block_type": ["mamba", "attention"]}, "layers_block_type holds attention; each Zamba2 layer is mamba"),
])
def test_what_cannot_run_is_refused_saying_why(fields, message):
    raw = {"architectures": ["Zamba2ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
           "layers_block_type": ["mamba", "hybrid"], **fields}
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict(raw)


def test_checkpoint_names_put_each_adapter_under_its_layer():
    """Layers 1, 3 and 4 run blocks 0, 1, 0: block 0's weights live under layer 1, with its layers' adapters
    (hybrid ranks 0 and 2); the slots of block 1's layer there are transformers' identities, with no weight."""
    blocks = SharedBlocks((1, 3, 4), 2, 8, True, True)
    t = torch.zeros(1)
    names = [n for n, _ in checkpoint_names(iter([
        ("model.layers.1.shared_transformer.self_attn.linear_q_adapter_list.0.0.weight", t),
        ("model.layers.1.shared_transformer.self_attn.linear_k_adapter_list.2.1.weight", t),
        ("model.layers.3.shared_transformer.feed_forward.gate_up_proj_adapter_list.1.0.weight", t),
        ("model.layers.1.shared_transformer.feed_forward.gate_up_proj_adapter_list.1.0.weight", t),
        ("model.layers.3.mamba_decoder.mamba.in_proj.weight", t), ("model.layers.3.linear.weight", t),
        ("model.final_layernorm.weight", t)]), blocks)]
    assert names == ["model.layers.1.shared_transformer.self_attn.q_adapter.0.weight",
                     "model.layers.4.shared_transformer.self_attn.k_adapter.1.weight",
                     "model.layers.3.shared_transformer.feed_forward.gate_up_adapter.0.weight",
                     "model.layers.3.mamba.in_proj.weight", "model.layers.3.linear.weight", "model.norm.weight"]


def test_shared_blocks_outside_the_mamba_layers_are_refused():
    config, _ = _read(layers_block_type=["mamba", "hybrid"], num_hidden_layers=2, hidden_size=64, num_attention_heads=4)
    with pytest.raises(ModelLoadError, match="must be linear layers"):
        dataclasses.replace(config, linear_layers=(0,))


def test_a_lora_adapter_is_refused_saying_why(tmp_path):
    config, _ = _read(layers_block_type=["mamba", "hybrid"], num_hidden_layers=2, hidden_size=64,
                      num_attention_heads=4)
    with pytest.raises(InvalidArgument, match="Zamba2 takes no LoRA adapters"):
        read_lora(LoraRef("sql", str(tmp_path)), config.lora_shape, 64)
