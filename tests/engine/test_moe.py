"""The mixture-of-experts MLP's pieces (services/engine/moe.py); whole models against transformers are in
test_architectures.py."""

from __future__ import annotations

import pytest
import torch

from services.engine.grouped_mm import grouped_mm, looped_mm
from services.engine.moe import copy_expert, missing_experts


def test_grouped_and_looped_matmuls_agree_with_empty_groups_anywhere():
    """Older torch (or an older GPU) runs one matmul per expert; both give each group its own weights."""
    g = torch.Generator().manual_seed(0)
    rows, weights = torch.randn(11, 16, generator=g), torch.randn(5, 16, 8, generator=g)
    offsets = torch.tensor([0, 4, 4, 9, 11], dtype=torch.int32)  # experts 0 and 2 get no rows
    want = torch.cat([rows[0:4] @ weights[1], rows[4:9] @ weights[3], rows[9:11] @ weights[4]])
    assert torch.allclose(grouped_mm(rows, weights, offsets), want, atol=1e-6)
    assert torch.allclose(looped_mm(rows, weights, offsets), want, atol=1e-6)


def test_expert_weights_land_in_their_slices_and_misfits_are_named():
    stacked = torch.zeros(3, 8, 5)  # 3 experts, gate and up 4 rows each
    copy_expert(stacked, 1, "up", torch.ones(4, 5))
    copy_expert(stacked, 2, "gate", torch.full((4, 5), 2.0))
    assert stacked[1, 4:].eq(1).all() and stacked[1, :4].eq(0).all() and stacked[2, :4].eq(2).all()
    assert missing_experts("l.mlp.experts.gate_up_proj", {(1, "up"), (2, "gate")}, 3) == \
        "l.mlp.experts.gate_up_proj: missing expert 0 gate, expert 0 up, expert 1 gate ... weights"
    with pytest.raises(KeyError, match=r"expert 0 gate weight has shape \(4, 6\); the config implies \(4, 5\)"):
        copy_expert(stacked, 0, "gate", torch.ones(4, 6))
    with pytest.raises(KeyError, match="expert 3 down weight: the config has 3 experts"):
        copy_expert(stacked, 3, "down", torch.ones(8, 5))


@pytest.mark.parametrize("arch", ["AXK2ForCausalLM", "DeepseekV3ForCausalLM"])
def test_experts_outside_the_chosen_groups_are_scored_as_transformers_scores_them(arch):
    """Correction biases that leave most scores negative: A.X K2's routing scores the other groups' experts 0, so
    it may choose them over its own group's; DeepSeek-V3's scores them -inf. Against transformers' routers."""
    transformers = pytest.importorskip("transformers")
    from services.engine.model_config import ModelConfig
    from services.engine.moe import SparseMoE

    shape = dict(hidden_size=16, n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1,
                 routed_scaling_factor=1.5, norm_topk_prob=True)
    config = ModelConfig.from_dict({"architectures": [arch], "num_hidden_layers": 2, "num_attention_heads": 4,
                                    "vocab_size": 64, "intermediate_size": 32, "moe_intermediate_size": 8,
                                    "kv_lora_rank": 16, "q_lora_rank": 8, "qk_rope_head_dim": 4,
                                    "qk_nope_head_dim": 4, "v_head_dim": 4, "first_k_dense_replace": 1, **shape})
    hf_config = (transformers.AXK2Config if arch == "AXK2ForCausalLM" else transformers.DeepseekV3Config)(**shape)
    hf = (transformers.models.axk2.modeling_axk2.AXK2TopkRouter if arch == "AXK2ForCausalLM"
          else transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter)(hf_config)
    ours = SparseMoE(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(8, 16, generator=g))
        hf.e_score_correction_bias.copy_(torch.linspace(-1.5, -0.2, 8))
        ours.gate.weight.copy_(hf.weight)
        ours.gate.e_score_correction_bias.copy_(hf.e_score_correction_bias)
    x = torch.randn(64, 16, generator=g)
    _, want_weights, want_experts = hf(x)
    weights, experts = ours._route(x)
    order, want_order = experts.sort(-1), want_experts.sort(-1)
    assert torch.equal(order.values, want_order.values)
    assert torch.allclose(weights.gather(1, order.indices), want_weights.gather(1, want_order.indices))
