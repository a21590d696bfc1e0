"""Falcon-H1 (services/engine/falcon_h1.py) read and computed as transformers does: its released config, its
defaults, what is refused, the three ways its Mamba-2 output meets the gate, and its µP multipliers folded into
the weights. The oracle runs of whole checkpoints are in test_architectures.py ("falcon-h1", "falcon-h1-normed")
and, through every scheduling path, tests/seawall/offline/test_linear_attention.py."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ModelLoadError
from services.engine.falcon_h1 import Multipliers, scaled_weights
from services.engine.gated_norm import GatedRMSNorm
from services.engine.mamba2 import silu_gate
from services.engine.model_config import ModelConfig

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")

# Falcon-H1-0.5B-Instruct's config.json as released.
FALCON_H1_0_5B = {
    "architectures": ["FalconH1ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_in_multiplier": 1.0, "attention_out_multiplier": 0.9375, "attn_layer_indices": None, "bos_token_id": 1,
    "embedding_multiplier": 5.656854249492381, "eos_token_id": 11, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 2048, "key_multiplier": 0.39062499999999994,
    "lm_head_multiplier": 0.0390625, "mamba_chunk_size": 128, "mamba_conv_bias": True, "mamba_d_conv": 4,
    "mamba_d_head": 64, "mamba_d_ssm": 1536, "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1,
    "mamba_n_heads": 24, "mamba_norm_before_gate": False, "mamba_proj_bias": False, "mamba_rms_norm": False,
    "mamba_use_mlp": True, "max_position_embeddings": 16384, "mlp_bias": False, "mlp_expansion_factor": 8,
    "mlp_multipliers": [0.8838834764831844, 0.5859375], "model_type": "falcon_h1", "num_attention_heads": 8,
    "num_hidden_layers": 36, "num_key_value_heads": 2, "num_logits_to_keep": 1, "pad_token_id": 0,
    "projectors_bias": False, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 100000000000.0,
    "ssm_in_multiplier": 1.25,
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    "ssm_out_multiplier": 0.23570226039551587, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 32784}


def test_the_released_config_reads_as_transformers_reads_it():
    """Attention and Mamba-2 in all 36 layers (each keeps KV and a state), a 1536-wide mixer of 24 heads, gated
    without a norm, the multipliers, and the logits' scale the head applies; the fused CPU forward serves it."""
    config, hf = ModelConfig.from_dict(FALCON_H1_0_5B), transformers.FalconH1Config(**FALCON_H1_0_5B)
    assert config.kv_layers == config.linear_layers == tuple(range(36)) and config.parallel_mixers
    assert (config.head_dim, config.num_key_value_heads, config.rope_theta, config.eos_token_ids) == (
        hf.head_dim, hf.num_key_value_heads, hf.rope_parameters["rope_theta"], (11,))
    m = config.linear_attention
    assert (m.num_heads, m.head_dim, m.intermediate, m.state_size, m.n_groups, m.chunk_size) == (
        hf.mamba_n_heads, hf.mamba_d_head, hf.mamba_d_ssm, hf.mamba_d_state, hf.mamba_n_groups, hf.mamba_chunk_size)
    assert (m.gated_norm, m.norm_weight_in_fp32, m.proj_bias, m.out_bias, m.conv_bias) == (
        "gate", True, False, False, True)
    assert config.logit_scale == hf.lm_head_multiplier and config.embed_scale == 1.0  # folded into the table
    assert config.multipliers == Multipliers(
        embedding=hf.embedding_multiplier, attention_in=1.0, key=hf.key_multiplier,
        attention_out=hf.attention_out_multiplier, ssm_in=hf.ssm_in_multiplier, ssm_out=hf.ssm_out_multiplier,
        ssm=tuple(hf.ssm_multipliers), mlp_gate=hf.mlp_multipliers[0], mlp_down=hf.mlp_multipliers[1])
    assert config.fused_blocks and not config.is_llama_like


def test_defaults_norm_placement_biases_and_what_is_refused():
    """Named alone: transformers' defaults (a 1024-wide mixer of 128 heads, no multipliers); mamba_rms_norm
    norms before or after the gate by mamba_norm_before_gate; projectors_bias is out_proj's alone."""
    config, hf = ModelConfig.from_dict({"architectures": ["FalconH1ForCausalLM"]}), transformers.FalconH1Config()
    m = config.linear_attention
    assert (m.intermediate, m.num_heads, m.head_dim, m.state_size) == (
        hf.mamba_d_ssm, hf.mamba_n_heads, hf.mamba_d_head, hf.mamba_d_state)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (
        hf.num_hidden_layers, hf.hidden_size, hf.vocab_size)
    assert config.multipliers is None and config.logit_scale == 1.0
    unset = {k: v for k, v in FALCON_H1_0_5B.items() if k != "mamba_d_ssm"}
    assert ModelConfig.from_dict({**unset, "mamba_d_ssm": None, "mamba_d_head": "auto", "mamba_n_heads": 32}
                                 ).linear_attention.intermediate == 2 * 1024  # mamba_expand * hidden_size
    normed = {**FALCON_H1_0_5B, "mamba_rms_norm": True, "projectors_bias": True}
    assert ModelConfig.from_dict(normed).linear_attention.gated_norm == "gate_then_norm"
    first = ModelConfig.from_dict({**normed, "mamba_norm_before_gate": True}).linear_attention
    assert (first.gated_norm, first.proj_bias, first.out_bias) == ("norm_then_gate", False, True)
    with pytest.raises(ModelLoadError, match="ssm_multipliers must list 5 numbers"):
        ModelConfig.from_dict({**FALCON_H1_0_5B, "ssm_multipliers": [1.0, 1.0]})
    with pytest.raises(ModelLoadError, match="must fill mamba_d_ssm \\(1000\\)"):
        ModelConfig.from_dict({**FALCON_H1_0_5B, "mamba_d_ssm": 1000})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rms_norm,norm_first", [(False, False), (True, False), (True, True)])
def test_the_gated_norm_computes_what_transformers_computes(dtype, rms_norm, norm_first):
    """Each of the three placements, bit for bit, in bf16 too (Falcon-H1 applies the norm's weight in fp32)."""
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1RMSNormGated

    torch.manual_seed(0)
    x, gate = torch.randn(5, 96, dtype=dtype), torch.randn(5, 96, dtype=dtype)
    if not rms_norm:
        assert torch.equal(silu_gate(x, gate), x * torch.nn.functional.silu(gate))
        return
    theirs = FalconH1RMSNormGated(96, eps=1e-5, n_groups=2, norm_before_gate=norm_first).to(dtype)
    ours = GatedRMSNorm(96, 1e-5, 2, norm_first=norm_first, weight_in_fp32=True).to(dtype)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.2)
        ours.weight.copy_(theirs.weight)
    assert torch.equal(ours(x, gate), theirs(x, gate))


def test_multipliers_folded_into_the_weights_give_transformers_projections():
    """A layer's projections with the folded tensors against transformers' modules applying the multipliers
    (to fp32 rounding); a tied head keeps the embeddings as stored."""
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1ForCausalLM

    raw = {**FALCON_H1_0_5B, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "mamba_d_ssm": 64, "mamba_n_heads": 4,
           "mamba_d_head": 16, "mamba_d_state": 8, "vocab_size": 128, "attention_bias": True, "mlp_bias": True,
           "mamba_proj_bias": True, "projectors_bias": True, "attention_in_multiplier": 1.5, "torch_dtype": "float32"}
    torch.manual_seed(0)
    model = FalconH1ForCausalLM(transformers.FalconH1Config(**raw)).eval()
    config = ModelConfig.from_dict(raw)
    state = {k: v.clone() for k, v in model.state_dict().items() if "mup_vector" not in k}
    folded = dict(scaled_weights(iter(state.items()), config.multipliers, config.linear_attention, tied=False))
    layer, h, wide = model.model.layers[0], torch.randn(3, 64), torch.randn(3, 96)
    mult = config.multipliers

    def linear(name: str, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, folded[f"model.layers.0.{name}.weight"],
                                          folded[f"model.layers.0.{name}.bias"])

    with torch.no_grad():
        want = layer.mamba.in_proj(h * mult.ssm_in) * layer.mamba.mup_vector.reshape(-1)
        torch.testing.assert_close(linear("mamba.in_proj", h), want)
        torch.testing.assert_close(linear("self_attn.k_proj", h), layer.self_attn.k_proj(h * mult.attention_in) * mult.key)
        torch.testing.assert_close(linear("self_attn.q_proj", h), layer.self_attn.q_proj(h * mult.attention_in))
        torch.testing.assert_close(linear("self_attn.o_proj", h), layer.self_attn.o_proj(h) * mult.attention_out)
        torch.testing.assert_close(linear("mamba.out_proj", h), layer.mamba.out_proj(h) * mult.ssm_out)
        torch.testing.assert_close(linear("feed_forward.gate_proj", h), layer.feed_forward.gate_proj(h) * mult.mlp_gate)
        torch.testing.assert_close(linear("feed_forward.down_proj", wide), layer.feed_forward.down_proj(wide) * mult.mlp_down)
    embed = state["model.embed_tokens.weight"]
    assert torch.equal(folded["model.embed_tokens.weight"], embed * mult.embedding)
    tied = list(scaled_weights(iter([("model.embed_tokens.weight", embed)]), mult, config.linear_attention, tied=True))
    assert [n for n, _ in tied] == ["lm_head.weight", "model.embed_tokens.weight"] and tied[0][1] is embed
