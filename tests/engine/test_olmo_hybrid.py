"""OLMo Hybrid's config and checkpoint layout (services/engine/olmo_hybrid.py); its model against transformers is
in test_architectures.py ("olmo-hybrid")."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.common.errors import ModelLoadError
from services.engine import olmo_hybrid
from services.engine.model_config import ModelConfig

SMALL = {"architectures": [olmo_hybrid.ARCH], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
         "num_attention_heads": 4, "vocab_size": 256}


def test_configs_read_with_transformers_defaults_and_refuse_a_model_of_one_kind():
    config = ModelConfig.from_dict(SMALL)
    # A full-attention layer every fourth; the others linear, pre-norm, around Gated DeltaNet.
    assert config.linear_layers == config.pre_norm_layers == (0, 1, 2, 4, 5) and not config.pre_norms
    s = config.linear_attention
    assert (s.num_key_heads, s.num_value_heads, s.key_head_dim, s.value_head_dim) == (4, 4, 12, 24)
    assert (s.beta_scale, s.norm_eps, s.separate_qkv, s.grouped_projections) == (2.0, 1e-5, True, False)
    assert config.qk_norm and config.qk_norm_whole and config.sliding_layers is None
    three = ModelConfig.from_dict({**SMALL, "num_hidden_layers": 3})
    assert three.linear_layers == (0, 1)  # the last layer attends when no fourth one would
    assert ModelConfig.from_dict({**SMALL, "linear_allow_neg_eigval": False}).linear_attention.beta_scale == 1.0
    for bad in (dict(beta_scale=0.0), dict(norm_eps=0.0), dict(grouped_projections=True)):
        with pytest.raises(ModelLoadError, match="beta_scale and norm_eps must be > 0"):
            dataclasses.replace(s, **bad)
    for kinds in (["linear_attention"] * 6, ["full_attention"] * 6):
        with pytest.raises(ModelLoadError, match="linear_attention and full_attention layers both"):
            ModelConfig.from_dict({**SMALL, "layer_types": kinds})


def test_q_k_and_v_convolutions_join_as_released_or_as_transformers_saves_them():
    config = ModelConfig.from_dict(SMALL)
    s = config.linear_attention
    joined = torch.randn(s.conv_dim, 1, 4)
    prefix = "model.layers.0.linear_attn."
    released = zip((f"{prefix}{c}.weight" for c in ("q_conv1d", "k_conv1d", "v_conv1d")),
                   joined.split(list(s.qkv_widths)), strict=True)
    thirds = zip((f"{prefix}{c}.weight" for c in ("q_conv1d", "k_conv1d", "v_conv1d")),
                 joined.chunk(3), strict=True)  # transformers splits the joined weight evenly as it saves
    other = ("model.layers.0.linear_attn.A_log", torch.zeros(4))
    for layout in (released, thirds):
        got = dict(olmo_hybrid.checkpoint_weights(iter([other, *layout]), config))
        assert set(got) == {other[0], f"{prefix}conv1d.weight"} and torch.equal(got[f"{prefix}conv1d.weight"], joined)
    with pytest.raises(KeyError, match="lacks v_conv1d.weight"):
        list(olmo_hybrid.checkpoint_weights(iter([(f"{prefix}q_conv1d.weight", joined[:12]),
                                                  (f"{prefix}k_conv1d.weight", joined[12:24])]), config))
    with pytest.raises(ModelLoadError, match="have 60 channels; its projections need 192"):
        list(olmo_hybrid.checkpoint_weights(iter([(f"{prefix}{c}.weight", joined[:20]) for c in
                                                  ("q_conv1d", "k_conv1d", "v_conv1d")]), config))
