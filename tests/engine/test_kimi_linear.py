"""Kimi Linear (services/engine/kimi_linear.py, kda.py) read and computed as transformers does: its config with
the layer layout nested as its checkpoints nest it, its defaults, what is refused, Kimi Delta Attention's two
forms against transformers' torch kernels, and its tensor names. The oracle runs of whole checkpoints are in
test_architectures.py ("kimi-linear") and, through every scheduling path, tests/seawall/offline/
test_linear_attention.py."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ModelLoadError
from services.engine.kda import chunked_delta_rule, recurrent_step
from services.engine.kimi_linear import checkpoint_names
from services.engine.model_config import ModelConfig

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")

# The layout as Kimi-Linear-48B-A3B's config.json nests it (1-based layer lists), at 8 layers, under its own names.
NESTED = {"architectures": ["KimiLinearForCausalLM"], "num_hidden_layers": 8, "hidden_size": 256,
          "num_attention_heads": 4, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32,
          "v_head_dim": 32, "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 2,
          "moe_intermediate_size": 64, "moe_renormalize": True, "num_expert_group": 1, "first_k_dense_replace": 1,
          "model_max_length": 4096, "mla_use_nope": True, "moe_router_activation_func": "sigmoid",
          "linear_attn_config": {"full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7], "num_heads": 4,
                                 "head_dim": 64, "short_conv_kernel_size": 4}}


def test_the_nested_layout_and_names_read_as_transformers_reads_them():
    config = ModelConfig.from_dict(NESTED)
    hf = transformers.KimiLinearConfig(**{k: v for k, v in NESTED.items() if k != "architectures"})
    assert config.kv_layers == tuple(i for i, t in enumerate(hf.layer_types) if t == "full_attention") == (3, 7)
    assert config.linear_layers == (0, 1, 2, 4, 5, 6)
    kda = config.linear_attention
    assert (kda.num_heads, kda.head_dim, kda.conv_kernel) == (hf.linear_num_heads, hf.linear_head_dim,
                                                              hf.linear_conv_kernel_dim)
    assert config.moe_layers == tuple(i for i, t in enumerate(hf.mlp_layer_types) if t == "sparse")
    assert (config.num_experts, config.num_experts_per_tok, config.norm_topk_prob, config.max_position_embeddings) == (
        hf.num_local_experts, hf.num_experts_per_tok, hf.norm_topk_prob, hf.max_position_embeddings)
    assert config.shared_expert_intermediate_size == hf.moe_intermediate_size * hf.n_shared_experts
    assert config.moe_routing == "sigmoid" and not config.shared_expert_gated
    assert config.mla and config.q_lora_rank is None and not config.rope_interleaved
    assert config.nope_layers == tuple(range(8))  # latent attention without positions


def test_defaults_and_what_is_refused():
    config, hf = ModelConfig.from_dict({"architectures": ["KimiLinearForCausalLM"]}), transformers.KimiLinearConfig()
    assert config.kv_layers == tuple(i for i, t in enumerate(hf.layer_types) if t == "full_attention")
    assert (config.vocab_size, config.hidden_size, config.num_experts, config.routed_scaling_factor,
            config.kv_lora_rank, config.v_head_dim, config.eos_token_ids) == (
        hf.vocab_size, hf.hidden_size, hf.num_local_experts, hf.routed_scaling_factor, hf.kv_lora_rank,
        hf.v_head_dim, (hf.eos_token_id,))
    with pytest.raises(ModelLoadError, match="kda_layers must list layers 1 to 8, got 9"):
        ModelConfig.from_dict({**NESTED, "linear_attn_config": {**NESTED["linear_attn_config"],
                                                               "kda_layers": [1, 2, 3, 5, 6, 9]}})
    with pytest.raises(ModelLoadError, match="must each be full_attention or linear_attention"):
        ModelConfig.from_dict({**NESTED, "layer_types": ["mamba"] * 8})


def test_both_forms_compute_what_transformers_kernels_compute():
    """A decode step and a 150-token chunk after a non-zero state, against transformers' recurrent and chunked
    KDA (q and k L2-normed inside, as its layer calls them); the chunked form also matches stepping token by
    token to fp32 rounding."""
    from transformers.models.kimi_linear.modeling_kimi_linear import (
        chunk_kimi_delta_attention,
        recurrent_kimi_delta_attention,
    )

    g = torch.Generator().manual_seed(0)
    b, n, h, d = 2, 150, 3, 16
    q, k, v = (torch.randn(b, n, h, d, generator=g) for _ in range(3))
    decay = -torch.rand(b, n, h, d, generator=g) * 0.3
    beta = torch.rand(b, n, h, generator=g)
    state = torch.randn(b, h, d, d, generator=g) * 0.1
    want, want_state = chunk_kimi_delta_attention(q, k, v, decay, beta, initial_state=state, output_final_state=True,
                                                  use_qk_l2norm_in_kernel=True)
    got, got_state = chunked_delta_rule(q, k, v, decay, beta, state)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_state, want_state, rtol=0, atol=1e-6)
    one = [x[:, :1] for x in (q, k, v, decay, beta)]
    want, want_state = recurrent_kimi_delta_attention(*one, initial_state=state, output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)
    got, got_state = recurrent_step(*(x[:, 0] for x in one), state)
    assert torch.equal(got, want[:, 0]) and torch.equal(got_state, want_state)
    stepped = state
    for i in range(n):
        out, stepped = recurrent_step(q[:, i], k[:, i], v[:, i], decay[:, i], beta[:, i], stepped)
    torch.testing.assert_close(out, chunked_delta_rule(q, k, v, decay, beta, state)[0][:, -1], rtol=1e-4, atol=1e-5)


def test_checkpoint_names_join_q_k_v_and_take_either_layout():
    """The released layout (three convolutions and q, k, v projections, the forget gate on the layer, A_log
    ``[1, 1, H, 1]``) and transformers' (one conv1d, a forget_gate module) load as the same tensors; KDA layers'
    q, k and v join (rows in that order), latent attention's q_proj stays its own; a missing part is named."""
    kda = [(f"model.layers.0.self_attn.{c}_conv1d.weight", torch.full((4, 1, 3), float(i)))
           for i, c in enumerate("qkv")]
    kda += [(f"model.layers.0.self_attn.{c}_proj.weight", torch.full((4, 2), float(i))) for i, c in enumerate("qkv")]
    released = [*kda, ("model.layers.0.self_attn.A_log", torch.zeros(1, 1, 2, 1)),
                ("model.layers.1.self_attn.q_proj.weight", torch.zeros(3, 2)),
                ("model.layers.0.block_sparse_moe.shared_experts.up_proj.weight", torch.zeros(2, 2))]
    names = dict(checkpoint_names(iter(released), kda_layers=(0,)))
    assert sorted(names) == ["model.layers.0.mlp.shared_experts.up_proj.weight", "model.layers.0.self_attn.A_log",
                             "model.layers.0.self_attn.conv1d.weight", "model.layers.0.self_attn.qkv_proj.weight",
                             "model.layers.1.self_attn.q_proj.weight"]
    assert names["model.layers.0.self_attn.conv1d.weight"][:, 0, 0].tolist() == [0.0] * 4 + [1.0] * 4 + [2.0] * 4
    assert names["model.layers.0.self_attn.qkv_proj.weight"][:, 0].tolist() == [0.0] * 4 + [1.0] * 4 + [2.0] * 4
    assert names["model.layers.0.self_attn.A_log"].shape == (2,)
    theirs = dict(checkpoint_names(iter([("model.layers.0.self_attn.forget_gate.dt_bias", torch.zeros(8)),
                                         ("model.layers.0.self_attn.conv1d.weight", torch.zeros(12, 1, 3))]), (0,)))
    assert sorted(theirs) == ["model.layers.0.self_attn.conv1d.weight", "model.layers.0.self_attn.dt_bias"]
    with pytest.raises(KeyError, match="model.layers.0.self_attn.conv1d: a KDA layer lacks"):
        dict(checkpoint_names(iter(released[:2]), (0,)))
