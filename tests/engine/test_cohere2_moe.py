"""Command A MoE (services/engine/cohere2_moe.py) read as transformers reads it: its default layout, a dense prefix
from ``first_k_dense_replace`` with its own window pattern, the layers that rotate, and what is refused. The oracle
runs are in test_architectures.py ("cohere2-moe", "cohere2-moe-sigmoid": fp32 tokens and logprobs, both paths)."""

from __future__ import annotations

import pytest

from services.common.errors import ModelLoadError
from services.engine.model_config import ModelConfig

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")

ARCH = "Cohere2MoeForCausalLM"


def _read(**fields) -> tuple[ModelConfig, object]:
    hf = transformers.Cohere2MoeConfig(**fields)
    return ModelConfig.from_dict({**hf.to_dict(), "architectures": [ARCH]}), hf


def _rotating(hf) -> set[int]:
    """The layers transformers' attention rotates: the sliding ones, and the dense prefix's with a pattern of 1."""
    forced = hf.prefix_dense_sliding_window_pattern == 1
    return {i for i, (kind, mlp) in enumerate(zip(hf.layer_types, hf.mlp_layer_types, strict=True))
            if (kind == "sliding_attention" and hf.sliding_window) or (forced and mlp == "dense")}


def test_named_alone_it_takes_transformers_defaults():
    """Its shape: 40 layers, every fourth full attention (without RoPE), 8 experts, 2 a token, as wide as
    intermediate_size, softmax over the top 2; Cohere's LayerNorms, tied embeddings, logits scaled by 1/16."""
    config, hf = ModelConfig.from_dict({"architectures": [ARCH]}), transformers.Cohere2MoeConfig()
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim, config.max_position_embeddings, config.rms_norm_eps,
            config.bos_token_id, config.eos_token_ids, config.logit_scale, config.sliding_window) == (
        hf.vocab_size, hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads,
        hf.head_dim, hf.max_position_embeddings, hf.layer_norm_eps, hf.bos_token_id, (hf.eos_token_id,),
        hf.logit_scale, hf.sliding_window)
    assert config.layer_norm and config.parallel_block and config.tie_word_embeddings and config.rope_interleaved
    assert config.sliding_layers == tuple(i for i, t in enumerate(hf.layer_types) if t == "sliding_attention")
    assert set(config.nope_layers) == set(range(40)) - _rotating(hf)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size, config.moe_routing,
            config.moe_layers, config.shared_expert_intermediate_size) == (8, 2, hf.intermediate_size, "topk_softmax",
                                                                          tuple(range(40)), 0)
    assert config.architecture == ARCH


def test_a_dense_prefix_has_its_width_window_pattern_and_rope():
    """``first_k_dense_replace`` dense layers of ``prefix_dense_intermediate_size`` before the routed ones, whose
    window pattern counts from the first routed layer; with a prefix pattern of 1 the dense layers are full
    attention and rotate all the same; with 2, every other one slides and the full ones do not rotate."""
    for prefix in (1, 2):
        config, hf = _read(num_hidden_layers=9, first_k_dense_replace=3, prefix_dense_intermediate_size=512,
                           intermediate_size=256, prefix_dense_sliding_window_pattern=prefix, num_shared_experts=2,
                           expert_selection_fn="sigmoid", norm_topk_prob=False, rms_norm_eps=1e-6)
        assert config.moe_layers == (3, 4, 5, 6, 7, 8) and hf.mlp_layer_types[:3] == ["dense"] * 3
        assert (config.intermediate_size, config.moe_intermediate_size, config.shared_expert_intermediate_size) == (
            512, 256, 512)
        assert config.sliding_layers == tuple(i for i, t in enumerate(hf.layer_types) if t == "sliding_attention")
        assert config.sliding_layers[-5:] == (3, 4, 5, 7, 8)  # the routed layers' pattern of 4 from layer 3
        assert set(config.nope_layers) == set(range(9)) - _rotating(hf)
        assert (1 in config.nope_layers) == (prefix == 2) and 0 not in config.nope_layers
        # RMSNorms with rms_norm_eps; sigmoid weights not renormalized; the shared MLP added, not averaged.
        assert not config.layer_norm and config.rms_norm_eps == 1e-6
        assert config.moe_routing == "topk_sigmoid" and not config.norm_topk_prob
        assert config.shared_expert_averaged == (hf.shared_expert_combination_strategy == "average")


def test_the_new_moe_fields_are_refused_where_they_have_nothing_to_act_on():
    """An average with no shared expert to average in, an output norm with no layer that routes."""
    import dataclasses

    config, _ = _read(num_hidden_layers=2, num_shared_experts=1, head_dim=16, hidden_size=64, num_attention_heads=4,
                      intermediate_size=32)
    with pytest.raises(ModelLoadError, match="shared_expert_averaged needs a shared expert"):
        dataclasses.replace(config, shared_expert_intermediate_size=0)
    with pytest.raises(ModelLoadError, match="moe_output_norm layers that route"):
        dataclasses.replace(config, moe_output_norm=True, shared_expert_averaged=False, moe_layers=())


def test_without_a_window_only_a_forced_prefix_rotates():
    config, hf = _read(num_hidden_layers=4, first_k_dense_replace=1, sliding_window=None, head_dim=16,
                       hidden_size=64, num_attention_heads=4, intermediate_size=32)
    assert config.sliding_window is None and config.nope_layers == (1, 2, 3) == tuple(
        sorted(set(range(4)) - _rotating(hf)))


@pytest.mark.parametrize(("fields", "message"), [
    ({"expert_selection_fn": "relu"}, "expert_selection_fn must be softmax or sigmoid, got 'relu'"),
    ({"shared_expert_combination_strategy": "max"}, "shared_expert_combination_strategy must be average or sum"),
    ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types must name each of the 4 layers dense or sparse"),
    ({"layer_types": ["chunked_attention"] * 4}, "layer_types must name each of the 4 layers"),
])
def test_what_cannot_run_is_refused_saying_why(fields, message):
    raw = {"architectures": [ARCH], "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
           "intermediate_size": 32, "vocab_size": 512, "num_hidden_layers": 4, **fields}
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict(raw)
