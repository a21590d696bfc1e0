"""Architectures served as another one (services/engine/aliases.py) read as transformers reads them: each
alias's defaults against its transformers config class, and published config.json files (legacy values,
fields under their own names, what is refused). The oracle runs of their checkpoints are in
test_architectures.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from services.common.errors import InvalidArgument, ModelLoadError
from services.common.lora import read_lora
from services.common.step import LoraRef
from services.engine.model_config import ModelConfig

pytestmark = [pytest.mark.oracle]

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", ["Glm4MoeLiteForCausalLM", "YoutuForCausalLM"])
def test_deepseek_v3_aliases_read_their_defaults_as_transformers_does(arch):
    """GLM-4.7-Flash and Youtu-LLM served as DeepSeek-V3: a config.json that leaves every field out reads as
    transformers' own config class reads it (their defaults differ from DeepSeek-V3's)."""
    hf = {"Glm4MoeLiteForCausalLM": transformers.Glm4MoeLiteConfig, "YoutuForCausalLM": transformers.YoutuConfig}[arch]()
    config = ModelConfig.from_dict({"architectures": [arch]})
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
            config.num_attention_heads, config.max_position_embeddings, config.rms_norm_eps) == (
        hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads,
        hf.max_position_embeddings, hf.rms_norm_eps)
    assert (config.kv_lora_rank, config.q_lora_rank, config.qk_rope_head_dim, config.qk_nope_head_dim,
            config.v_head_dim, config.rope_interleaved, config.tie_word_embeddings) == (
        hf.kv_lora_rank, hf.q_lora_rank, hf.qk_rope_head_dim, hf.qk_nope_head_dim, hf.v_head_dim,
        hf.rope_interleave, hf.tie_word_embeddings)
    assert (config.bos_token_id, config.eos_token_ids) == (hf.bos_token_id, (hf.eos_token_id,))
    routed = [t == "sparse" for t in getattr(hf, "mlp_layer_types", None) or ["dense"] * hf.num_hidden_layers]
    assert [config.is_moe(i) for i in range(hf.num_hidden_layers)] == routed
    if any(routed):
        assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                config.shared_expert_intermediate_size, config.routed_scaling_factor, config.norm_topk_prob) == (
            hf.n_routed_experts, hf.num_experts_per_tok, hf.moe_intermediate_size,
            hf.n_shared_experts * hf.moe_intermediate_size, hf.routed_scaling_factor, hf.norm_topk_prob)
    else:
        assert config.num_experts == 0


def test_a_x_k1_routes_after_its_dense_layers_and_refuses_other_layouts():
    """Its legacy fields read as its transformers config derives mlp_layer_types: dense first_k_dense_replace
    layers (default 1), then every layer routed; an interleaved layout (moe_layer_freq > 1) is refused."""
    hf = transformers.AXK1Config(num_hidden_layers=5, first_k_dense_replace=2)
    config = ModelConfig.from_dict({**hf.to_dict(), "architectures": ["AXK1ForCausalLM"]})
    assert config.moe_layers == (2, 3, 4) == tuple(i for i, t in enumerate(hf.mlp_layer_types) if t == "sparse")
    assert config.moe_output_norm and config.mla and config.architecture == "AXK1ForCausalLM"
    legacy = ModelConfig.from_dict({"architectures": ["AXK1ForCausalLM"], "num_hidden_layers": 4})
    assert legacy.moe_layers == (1, 2, 3)
    with pytest.raises(ModelLoadError, match="moe_layer_freq 2; A.X K1 is served with its dense layers first"):
        ModelConfig.from_dict({"architectures": ["AXK1ForCausalLM"], "num_hidden_layers": 4, "moe_layer_freq": 2})


def test_gpt_neo_reads_its_layer_kinds_and_skips_its_old_mask_buffers():
    """attention_types expanded as transformers expands them; a layout that does not cover the layers, refused; the
    causal-mask buffers old checkpoints saved are left out as they load."""
    from services.engine.gpt_neo import checkpoint_weights

    config = ModelConfig.from_dict({"architectures": ["GPTNeoForCausalLM"], "num_layers": 6,
                                    "attention_types": [[["global"], 2], [["local", "global"], 2]]})
    assert config.sliding_layers == (2, 4) and config.sliding_window == 256
    with pytest.raises(ModelLoadError, match="attention_types must give each of the 4 layers global or local"):
        ModelConfig.from_dict({"architectures": ["GPTNeoForCausalLM"], "num_layers": 4})
    names = ["transformer.h.0.attn.attention.bias", "transformer.h.0.attn.attention.masked_bias",
             "transformer.h.0.attn.attention.q_proj.weight", "transformer.h.0.attn.attention.out_proj.bias"]
    assert [n for n, _ in checkpoint_weights(iter((n, None) for n in names))] == names[2:]


def test_dbrx_reads_its_nested_fields_as_transformers_does():
    """dbrx-instruct's config.json as published (its attention and experts' fields nested, RoPE's base among the
    attention's); a routing renormalized other than to sum 1 is refused."""
    raw = {"architectures": ["DbrxForCausalLM"], "d_model": 6144, "n_heads": 48, "n_layers": 40, "max_seq_len": 32768,
           "vocab_size": 100352, "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000},
           "ffn_config": {"ffn_act_fn": {"name": "silu"}, "ffn_hidden_size": 10752, "moe_jitter_eps": 0.01,
                          "moe_loss_weight": 0.05, "moe_num_experts": 16, "moe_top_k": 4}}
    config = ModelConfig.from_dict(raw)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers,
            config.max_position_embeddings, config.rope_theta, config.clip_qkv) == (6144, 48, 8, 40, 32768, 500000.0, 8.0)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size, config.moe_layers) == (
        16, 4, 10752, tuple(range(40)))
    assert config.layer_norm and config.norm_topk_prob and not config.tie_word_embeddings
    with pytest.raises(ModelLoadError, match="moe_normalize_expert_weights is 2.0"):
        ModelConfig.from_dict({**raw, "ffn_config": {**raw["ffn_config"], "moe_normalize_expert_weights": 2.0}})


def test_glm_4_7_flash_as_published():
    """GLM-4.7-Flash's config.json fields (DeepSeek-V3's names, topk_method beside them, an MTP layer after its
    47): read as transformers' Glm4MoeLiteConfig reads them; mlp_layer_types that interleave dense layers refused."""
    raw = {"architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "attention_bias": False,
           "eos_token_id": [154820, 154827, 154829], "pad_token_id": 154820, "hidden_act": "silu",
           "hidden_size": 2048, "intermediate_size": 10240, "max_position_embeddings": 202752,
           "moe_intermediate_size": 1536, "topk_method": "noaux_tc", "norm_topk_prob": True,
           "num_attention_heads": 20, "n_group": 1, "topk_group": 1, "n_routed_experts": 64, "n_shared_experts": 1,
           "routed_scaling_factor": 1.8, "num_experts_per_tok": 4, "first_k_dense_replace": 1,
           "num_hidden_layers": 47, "num_key_value_heads": 20, "num_nextn_predict_layers": 1, "kv_lora_rank": 512,
           "q_lora_rank": 768, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
           "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
           "tie_word_embeddings": False, "dtype": "bfloat16", "vocab_size": 154880}
    config, hf = ModelConfig.from_dict(raw), transformers.Glm4MoeLiteConfig(**raw)
    assert [config.is_moe(i) for i in range(47)] == [t == "sparse" for t in hf.mlp_layer_types]
    assert (config.rope_theta, config.mtp_layers, config.head_dim, config.num_key_value_heads) == (1e6, 1, 576, 1)
    assert config.eos_token_ids == (154820, 154827, 154829) and config.moe_routing == "sigmoid"
    with pytest.raises(ModelLoadError, match="the dense ones first"):
        ModelConfig.from_dict({**raw, "mlp_layer_types": ["dense", "sparse", "dense"] + ["sparse"] * 44})
    with pytest.raises(ModelLoadError, match="mlp_layer_types must list"):
        ModelConfig.from_dict({**raw, "mlp_layer_types": ["dense"]})


def test_minicpm5_moe_configs_read_as_transformers_reads_them():
    """MiniCPM5-MoE's defaults (its 15B-A2.5B shape), its older architecture name, first_k_dense_replace as
    transformers reads it without mlp_layer_types, and GLM-4.5's partial rotary left out as its rotary embedding
    leaves it (every feature of a head rotates)."""
    for fields in ({}, {"architectures": ["MiniCPM5MoEForCausalLM"], "first_k_dense_replace": 3,
                        "partial_rotary_factor": 0.5, "attention_bias": True, "use_qk_norm": True}):
        raw = {"architectures": ["MiniCPM5MoeForCausalLM"], **fields}
        config, hf = ModelConfig.from_dict(raw), transformers.MiniCPM5MoeConfig(**raw)
        assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.rms_norm_eps,
                config.max_position_embeddings, config.rope_theta) == (
            hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads,
            hf.num_key_value_heads, hf.head_dim, hf.rms_norm_eps, hf.max_position_embeddings,
            hf.rope_parameters["rope_theta"])
        assert [config.is_moe(i) for i in range(hf.num_hidden_layers)] == [t == "sparse" for t in hf.mlp_layer_types]
        assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                config.shared_expert_intermediate_size, config.routed_scaling_factor) == (
            hf.n_routed_experts, hf.num_experts_per_tok, hf.moe_intermediate_size,
            hf.n_shared_experts * hf.moe_intermediate_size, hf.routed_scaling_factor)
        assert config.eos_token_ids == tuple(hf.eos_token_id) and config.bos_token_id == hf.bos_token_id
        assert config.partial_rotary_factor == 1.0 and not config.qk_norm and config.attn_output_gate == "in_query"
        assert config.o_proj_bias == config.attention_bias == hf.attention_bias


GEMMA_7B = {  # its config.json as released (later revisions add "hidden_activation": null)
    "architectures": ["GemmaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 2,
    "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu", "hidden_size": 3072, "initializer_range": 0.02,
    "intermediate_size": 24576, "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 16,
    "num_hidden_layers": 28, "num_key_value_heads": 16, "pad_token_id": 0, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "vocab_size": 256000}


def test_gemma_7b_as_published():
    """Gemma 7B's legacy "gelu" is the tanh approximation, as transformers reads it; no window, no soft-caps, the
    norms Llama's, queries scaled by the head width, embeddings by the hidden size's root."""
    config, hf = ModelConfig.from_dict(GEMMA_7B), transformers.GemmaConfig(**GEMMA_7B)
    assert config.hidden_act == hf.hidden_act == "gelu_pytorch_tanh"
    assert config.sliding_window is None and config.attn_softcap is None and config.final_softcap is None
    assert not config.sandwich_norms and config.norm_unit_offset and config.tie_word_embeddings
    assert config.attn_scale == 256 ** -0.5 and config.embed_scale == 3072 ** 0.5
    assert ModelConfig.from_dict({**GEMMA_7B, "hidden_activation": None}).hidden_act == "gelu_pytorch_tanh"
    two_b = ModelConfig.from_dict({**GEMMA_7B, "hidden_size": 2048, "num_key_value_heads": 1, "num_hidden_layers": 18})
    assert (two_b.num_key_value_heads, two_b.head_dim, two_b.attn_scale) == (1, 256, 256 ** -0.5)


STABLELM_2_1_6B = {  # its config.json as released
    "architectures": ["StableLmForCausalLM"], "bos_token_id": 100257, "eos_token_id": 100257, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 4096,
    "model_type": "stablelm", "layer_norm_eps": 1e-05, "num_attention_heads": 32, "num_hidden_layers": 24,
    "num_key_value_heads": 32, "partial_rotary_factor": 0.25, "rope_theta": 10000, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_qkv_bias": True, "vocab_size": 100352}


def test_stablelm_2_as_published():
    """StableLM 2 1.6B's config.json, and the same as transformers 5 saves it (the factor in rope_parameters):
    LayerNorms with biases and their epsilon, RoPE over a quarter of each 64-wide head, q/k/v biases and none
    on o_proj; StableLM 2 12B's per-head q/k LayerNorms refused."""
    hf = transformers.StableLmConfig(**STABLELM_2_1_6B)
    for raw in (STABLELM_2_1_6B, json.loads(hf.to_json_string())):
        config = ModelConfig.from_dict(raw)
        assert (config.partial_rotary_factor, config.head_dim, config.rms_norm_eps) == (0.25, 64, 1e-5)
        assert config.layer_norm and config.norm_bias and config.attention_bias and not config.o_proj_bias
        assert not config.parallel_block and not config.tie_word_embeddings
    with pytest.raises(ModelLoadError, match="qk_layernorm is set"):
        ModelConfig.from_dict({**STABLELM_2_1_6B, "qk_layernorm": True, "use_parallel_residual": True})


PHI_2 = {  # its config.json as released
    "architectures": ["PhiForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 50256, "embd_pdrop": 0.0,
    "eos_token_id": 50256, "hidden_act": "gelu_new", "hidden_size": 2560, "initializer_range": 0.02,
    "intermediate_size": 10240, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "model_type": "phi",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
    "qk_layernorm": False, "resid_pdrop": 0.1, "rope_scaling": None, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 51200}


def test_phi_2_as_published():
    """Phi-2's config.json: gelu_new (the tanh approximation, written out as transformers computes it), RoPE over
    32 of each 80-wide head, biases on every projection and the head, one LayerNorm a layer; per-head q/k
    LayerNorms refused."""
    config = ModelConfig.from_dict(PHI_2)
    assert (config.hidden_act, config.head_dim, config.partial_rotary_factor) == ("gelu_new", 80, 0.4)
    assert config.attention_bias and config.o_proj_bias and config.mlp_bias and config.lm_head_bias
    assert config.parallel_block and config.norm_bias and not config.mlp_gated and config.eos_token_ids == (50256,)
    with pytest.raises(ModelLoadError, match="qk_layernorm is set"):
        ModelConfig.from_dict({**PHI_2, "qk_layernorm": True})


def test_granite_4_configs_read_as_transformers_saves_them():
    """Granite 4.0's config as transformers saves it: dense with attention only (granite-4.0-micro) reads as
    Granite at the shared MLP's width with RoPE; the -H hybrids' Mamba-2 layers with transformers' defaults for
    their shape; a layer type neither is refused."""
    hf = transformers.GraniteMoeHybridConfig(
        layer_types=["attention"] * 4, num_local_experts=0, shared_intermediate_size=8192, intermediate_size=1,
        position_embedding_type="rope", hidden_size=2560, num_attention_heads=40, num_key_value_heads=8,
        num_hidden_layers=4, embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=10.0,
        attention_multiplier=0.0078125, architectures=["GraniteMoeHybridForCausalLM"])
    raw = json.loads(hf.to_json_string())
    config = ModelConfig.from_dict(raw)
    assert (config.intermediate_size, config.num_experts, config.nope_layers) == (8192, 0, ())
    assert (config.embed_scale, config.residual_scale, config.logits_divisor, config.attn_scale) == (
        12.0, 0.22, 10.0, 0.0078125)
    assert ModelConfig.from_dict({**raw, "position_embedding_type": None}).nope_layers == (0, 1, 2, 3)
    hybrid = ModelConfig.from_dict({**raw, "layer_types": ["mamba", "mamba", "attention", "mamba"]})
    assert (hybrid.linear_layers, hybrid.kv_layers, hybrid.recurrent) == ((0, 1, 3), (2,), True)
    m = hybrid.linear_attention  # transformers' defaults: 128 heads over 2 x 2560 channels, a 256-wide state
    assert (m.num_heads, m.head_dim, m.state_size, m.n_groups, m.conv_kernel, m.chunk_size, m.conv_bias,
            m.proj_bias) == (128, 40, 256, 1, 4, 256, True, False)
    assert m.conv_dim == 5120 + 2 * 256 and m.time_step_limit == (0.0, float("inf"))
    with pytest.raises(ModelLoadError, match="layer_types must name each of the 4 layers attention or mamba; got "
                                             "moe"):
        ModelConfig.from_dict({**raw, "layer_types": ["mamba", "moe", "attention", "mamba"]})
    with pytest.raises(ModelLoadError, match="must fill mamba_expand"):
        ModelConfig.from_dict({**raw, "layer_types": ["mamba"] * 4, "mamba_d_head": 16})


PHI_3_5_MOE = {  # its config.json as released, less auto_map (the 64 factors of each list stand in for its own)
    "architectures": ["PhiMoEForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 32000, "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 4096,
    "initializer_range": 0.02, "input_jitter_noise": 0.01, "intermediate_size": 6400, "lm_head_bias": True,
    "max_position_embeddings": 131072, "model_type": "phimoe", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 16,
    "original_max_position_embeddings": 4096, "output_router_logits": False, "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_factor": [1.0 + i / 8 for i in range(64)], "long_mscale": 1.243,
                     "original_max_position_embeddings": 4096, "short_factor": [1.0 + i / 64 for i in range(64)],
                     "short_mscale": 1.243, "type": "longrope"},
    "rope_theta": 10000.0, "router_aux_loss_coef": 0.0, "router_jitter_noise": 0.01, "sliding_window": 131072,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32064}


def test_phi_3_5_moe_as_published():
    """Phi-3.5-MoE's config.json under the name it was released with: 16 experts, 2 by sparse-mixer with a 0.01
    margin, biases on attention and the head, LongRoPE's factors and the attention scale it names for them
    (the long ones for its whole context, the short ones within --max-model-len 4096)."""
    from services.engine.rope import attention_factor, uses_long_factors

    config = ModelConfig.from_dict(PHI_3_5_MOE)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_routing, config.sparsemixer_eps) == (
        16, 2, "sparsemixer", 0.01)
    assert config.attention_bias and config.o_proj_bias and config.lm_head_bias and config.norm_bias
    assert config.architecture == "PhimoeForCausalLM" and config.eos_token_ids == (32000,)
    assert uses_long_factors(config) and attention_factor(config) == 1.243
    short = config.with_max_model_len(4096)
    assert not uses_long_factors(short) and attention_factor(short) == 1.243
    with pytest.raises(ModelLoadError, match="sparse-mixer routing picks 2 experts"):
        ModelConfig.from_dict({**PHI_3_5_MOE, "num_experts_per_tok": 4})


@pytest.mark.parametrize("arch, hf_config", [
    ("IQuestCoderForCausalLM", "IQuestCoderConfig"), ("Jais2ForCausalLM", "Jais2Config"),
    ("VaultGemmaForCausalLM", "VaultGemmaConfig"), ("CwmForCausalLM", "CwmConfig"),
    ("HeliumForCausalLM", "HeliumConfig"), ("GemmaForCausalLM", "GemmaConfig"), ("GlmForCausalLM", "GlmConfig"),
    ("StableLmForCausalLM", "StableLmConfig"), ("PhiForCausalLM", "PhiConfig"),
    ("Starcoder2ForCausalLM", "Starcoder2Config"), ("PhimoeForCausalLM", "PhimoeConfig"),
    ("SolarOpenForCausalLM", "SolarOpenConfig"), ("MinistralForCausalLM", "MinistralConfig"),
    ("NemotronForCausalLM", "NemotronConfig"), ("OlmoForCausalLM", "OlmoConfig"),
    ("Mistral4ForCausalLM", "Mistral4Config"), ("FlexOlmoForCausalLM", "FlexOlmoConfig"),
    ("Qwen3NextForCausalLM", "Qwen3NextConfig"), ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig"),
    ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig"), ("Lfm2MoeForCausalLM", "Lfm2MoeConfig"),
    ("NemotronHForCausalLM", "NemotronHConfig"), ("JambaForCausalLM", "JambaConfig"),
    ("GPTNeoXForCausalLM", "GPTNeoXConfig"), ("FalconForCausalLM", "FalconConfig"), ("OPTForCausalLM", "OPTConfig"),
    ("GPT2LMHeadModel", "GPT2Config"), ("GPTBigCodeForCausalLM", "GPTBigCodeConfig"), ("GPTJForCausalLM", "GPTJConfig"),
    ("Zamba2ForCausalLM", "Zamba2Config"), ("GraniteSWAForCausalLM", "GraniteSWAConfig"),
    ("GraniteMoeSWAForCausalLM", "GraniteMoeSWAConfig"), ("HYV3ForCausalLM", "HYV3Config"),
    ("MellumForCausalLM", "MellumConfig"), ("NanoChatForCausalLM", "NanoChatConfig"),
    ("Cohere2MoeForCausalLM", "Cohere2MoeConfig"), ("AXK1ForCausalLM", "AXK1Config"),
    ("Kolibri1ForCausalLM", "Kolibri1Config"), ("MiniCPM3ForCausalLM", "MiniCPM3Config"),
    ("GPTNeoForCausalLM", "GPTNeoConfig"), ("DbrxForCausalLM", "DbrxConfig"),
    ("CodeGenForCausalLM", "CodeGenConfig"), ("BioGptForCausalLM", "BioGptConfig"),
    ("PersimmonForCausalLM", "PersimmonConfig"), ("XGLMForCausalLM", "XGLMConfig"),
    ("LagunaForCausalLM", "LagunaConfig"), ("FlintForCausalLM", "FlintConfig"),
    ("DeepseekV32ForCausalLM", "DeepseekV32Config"), ("GlmMoeDsaForCausalLM", "GlmMoeDsaConfig"),
    ("AXK2ForCausalLM", "AXK2Config"), ("MiniMaxForCausalLM", "MiniMaxConfig"),
    ("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig"), ("LaraMiniForCausalLM", "LaraMiniConfig"), ("BitNetForCausalLM", "BitNetConfig"),
    ("OlmoHybridForCausalLM", "OlmoHybridConfig"), ("Apertus1p5TextForCausalLM", "Apertus1p5TextConfig"),
    ("AriaTextForCausalLM", "AriaTextConfig"), ("Emu3ForCausalLM", "Emu3TextConfig"),
    ("BeamForCausalLM", "BeamConfig"), ("GPTNeoXJapaneseForCausalLM", "GPTNeoXJapaneseConfig")])
def test_an_aliased_architecture_named_alone_takes_transformers_defaults(arch, hf_config):
    """A config.json naming only the architecture reads with the shape transformers' config class defaults to
    (the aliases' defaults tables checked against transformers')."""
    config, hf = ModelConfig.from_dict({"architectures": [arch]}), getattr(transformers, hf_config)()
    heads = hf.num_attention_heads
    context = getattr(hf, "max_position_embeddings", 8192)  # RecurrentGemma names none: served at its training 8K
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.max_position_embeddings, config.tie_word_embeddings) == (
        hf.vocab_size, hf.hidden_size, hf.num_hidden_layers, heads, context, hf.tie_word_embeddings)
    if config.mla:  # the cache holds one latent: its widths are the shape
        assert (config.kv_lora_rank, config.q_lora_rank, config.qk_rope_head_dim, config.qk_nope_head_dim,
                config.v_head_dim) == (hf.kv_lora_rank, hf.q_lora_rank, hf.qk_rope_head_dim, hf.qk_nope_head_dim,
                                       hf.v_head_dim)
    else:
        assert (config.num_key_value_heads, config.head_dim) == (
            getattr(hf, "num_key_value_heads", None) or heads,  # GPT-NeoX has no grouped queries
            getattr(hf, "head_dim", None) or hf.hidden_size // heads)
    eps = next((getattr(hf, name) for name in ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "norm_eps")
                if getattr(hf, name, None)), 1e-5)  # OLMo's norms take none: 1e-5
    if arch == "BioGptForCausalLM":  # its LayerNorms take torch's default, whatever layer_norm_eps says
        eps = 1e-5
    assert config.rms_norm_eps == pytest.approx(eps)
    if not config.num_experts:
        # Falcon's ffn_hidden_size, OPT's ffn_dim, GPT-2's n_inner (None: four times the hidden size)
        width = next((getattr(hf, n) for n in ("intermediate_size", "ffn_hidden_size", "ffn_dim", "n_inner")
                      if hasattr(hf, n)), "multiple")
        if width == "multiple":  # GPT-NeoX Japanese's: a multiple of the hidden size
            width = hf.hidden_size * hf.intermediate_multiple_size
        if arch == "RecurrentGemmaForCausalLM":  # its MLP is half intermediate_size wide
            width //= 2
        assert config.intermediate_size == (width or 4 * hf.hidden_size)


QWEN3_NEXT = {  # Qwen3-Next-80B-A3B-Instruct's config.json as released
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next",
    "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512,
    "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2, "output_router_logits": False,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}


def test_qwen3_next_reads_as_released():
    """One full-attention layer in four (full_attention_interval), the rest Gated DeltaNet; the KV pool holds
    the twelve attention layers only."""
    config = ModelConfig.from_dict(QWEN3_NEXT)
    assert config.kv_layers == tuple(range(3, 48, 4)) and len(config.linear_layers) == 36 and config.recurrent
    shape = config.linear_attention
    assert (shape.num_key_heads, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim,
            shape.conv_kernel, shape.conv_dim) == (16, 32, 128, 128, 4, 8192)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
            config.shared_expert_intermediate_size, config.norm_topk_prob) == (512, 10, 512, 512, True)
    assert config.moe_layers == tuple(range(48)) and config.shared_expert_gated
    assert (config.rotary_dim, config.rope_theta, config.attn_output_gate, config.qk_norm) == (64, 1e7, "in_query", True)
    assert config.norm_unit_offset and config.norm_scale_in_fp32 and not config.attention_bias
    assert not config.o_proj_bias and config.sliding_window is None and not config.is_llama_like
    # A layer named neither way, and value heads that do not group evenly over key heads, are refused.
    with pytest.raises(ModelLoadError, match="layer_types holds mamba"):
        ModelConfig.from_dict({**QWEN3_NEXT, "layer_types": ["mamba"] * 48})
    with pytest.raises(ModelLoadError, match="must be a multiple of linear_num_key_heads"):
        ModelConfig.from_dict({**QWEN3_NEXT, "linear_num_value_heads": 24})
    with pytest.raises(ModelLoadError, match="at least one attention layer"):
        ModelConfig.from_dict({**QWEN3_NEXT, "full_attention_interval": 100})


def test_qwen3_5_text_models_read_with_transformers_defaults():
    """Qwen3.5 named alone: one full-attention layer in four, linear layers with their projections apart; the
    MoE routes in every layer and always renormalizes, whatever a stale norm_topk_prob says."""
    dense = ModelConfig.from_dict({"architectures": ["Qwen3_5ForCausalLM"]})
    assert dense.kv_layers == tuple(range(3, 32, 4)) and not dense.linear_attention.grouped_projections
    assert (dense.rotary_dim, dense.attn_output_gate, dense.norm_unit_offset, dense.num_experts) == (64, "in_query",
                                                                                                    True, 0)
    moe = ModelConfig.from_dict({"architectures": ["Qwen3_5MoeForCausalLM"], "norm_topk_prob": False,
                                 "mlp_only_layers": [0]})
    assert moe.moe_layers == tuple(range(40)) and moe.norm_topk_prob and moe.shared_expert_gated
    assert (moe.num_experts, moe.num_experts_per_tok, moe.kv_layers) == (256, 8, tuple(range(3, 40, 4)))


LFM2_1_2B = {  # LFM2-1.2B's config.json (its shape; fields transformers does not read, such as block_dim, left in)
    "architectures": ["Lfm2ForCausalLM"], "block_auto_adjust_ff_dim": True, "block_dim": 2048, "block_ff_dim": 12288,
    "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256, "block_norm_eps": 1e-05, "bos_token_id": 1,
    "conv_L_cache": 3, "conv_bias": False, "conv_dim": 2048, "eos_token_id": 7, "hidden_size": 2048,
    "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv",
                    "full_attention", "conv", "full_attention", "conv", "full_attention", "conv", "full_attention",
                    "conv"],
    "max_position_embeddings": 128000, "model_type": "lfm2", "norm_eps": 1e-05, "num_attention_heads": 32,
    "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pad_token_id": 0, "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16", "use_pos_enc": True, "vocab_size": 65536}


def test_lfm2_reads_as_transformers_reads_it():
    """Six attention layers of sixteen; the MLP 8192 wide (two thirds of block_ff_dim, on a multiple of 256); tied
    embeddings by default; the conv layers' state is their 2-wide window of 2048 channels."""
    config = ModelConfig.from_dict(LFM2_1_2B)
    hf = transformers.Lfm2Config(**{k: v for k, v in LFM2_1_2B.items() if k != "architectures"})
    assert config.kv_layers == (2, 5, 8, 10, 12, 14) and config.recurrent
    assert (config.intermediate_size, config.tie_word_embeddings, config.rms_norm_eps, config.head_dim) == (
        8192, hf.tie_word_embeddings, hf.norm_eps, 64)
    assert (config.linear_attention.conv_dim, config.linear_attention.conv_kernel) == (2048, 3)
    assert ModelConfig.from_dict({**LFM2_1_2B, "block_ffn_dim_multiplier": 1.5}).intermediate_size == 12288
    assert ModelConfig.from_dict({**LFM2_1_2B, "block_auto_adjust_ff_dim": False}).intermediate_size == 12288
    named_alone = ModelConfig.from_dict({"architectures": ["Lfm2ForCausalLM"]})
    assert not named_alone.recurrent and named_alone.num_hidden_layers == 32  # every layer attends by default
    with pytest.raises(ModelLoadError, match="layer_types must name each of the 16 layers conv or full_attention"):
        ModelConfig.from_dict({**LFM2_1_2B, "layer_types": ["mamba"] * 16})


def test_lfm2_moe_routes_from_its_first_sparse_layer_by_biased_sigmoid_scores():
    config = ModelConfig.from_dict({"architectures": ["Lfm2MoeForCausalLM"], "num_hidden_layers": 6,
                                    "num_dense_layers": 2, "layer_types": ["conv", "conv", "full_attention"] * 2})
    assert config.moe_layers == (2, 3, 4, 5) and config.linear_layers == (0, 1, 3, 4)
    assert (config.moe_routing, config.router_fp32, config.routing_norm_eps, config.shared_expert_intermediate_size,
            config.num_experts, config.num_experts_per_tok) == ("sigmoid", False, 1e-6, 0, 32, 4)
    with pytest.raises(ModelLoadError, match="use_expert_bias is false"):
        ModelConfig.from_dict({"architectures": ["Lfm2MoeForCausalLM"], "use_expert_bias": False})


NEMOTRON_NANO_2 = {  # Nemotron Nano 2 (9B)-shaped: its layer pattern and Mamba-2 widths, an rms_norm_eps beside
    # layer_norm_epsilon, and num_hidden_layers beside the pattern, as its config.json has them
    "architectures": ["NemotronHForCausalLM"], "attention_bias": False, "bos_token_id": 1, "chunk_size": 128,
    "conv_kernel": 4, "eos_token_id": 12, "head_dim": 128, "hidden_size": 4480,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", "intermediate_size": 15680,
    "layer_norm_epsilon": 1e-05, "mamba_head_dim": 80, "mamba_hidden_act": "silu", "mamba_num_heads": 128,
    "max_position_embeddings": 131072, "mlp_bias": False, "mlp_hidden_act": "relu2", "model_type": "nemotron_h",
    "n_groups": 8, "num_attention_heads": 40, "num_hidden_layers": 56, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "sliding_window": None, "ssm_state_size": 128, "tie_word_embeddings": False, "time_step_limit": [0.0, float("inf")],
    "torch_dtype": "bfloat16", "use_bias": False, "use_conv_bias": True, "vocab_size": 131072}


def test_nemotron_h_reads_its_layer_pattern_as_transformers_does():
    """Each letter of hybrid_override_pattern one layer (M Mamba-2, * attention, - MLP, E experts): the KV pool
    holds the attention layers only, the states the Mamba-2 ones; the norms' epsilon is layer_norm_epsilon."""
    config = ModelConfig.from_dict(NEMOTRON_NANO_2)
    hf = transformers.NemotronHConfig(**{k: v for k, v in NEMOTRON_NANO_2.items() if k != "architectures"})
    types = hf.layers_block_type
    assert config.num_hidden_layers == len(types) == 56
    assert config.kv_layers == tuple(i for i, t in enumerate(types) if t == "full_attention")
    assert config.linear_layers == tuple(i for i, t in enumerate(types) if t == "linear_attention")
    assert config.sublayers == tuple("mlp" if t == "mlp" else "mixer" for t in types)
    shape = config.linear_attention
    assert (shape.num_heads, shape.head_dim, shape.n_groups, shape.state_size, shape.chunk_size, shape.intermediate) \
        == (hf.mamba_num_heads, hf.mamba_head_dim, hf.n_groups, hf.ssm_state_size, hf.chunk_size, 10240)
    assert (config.rms_norm_eps, config.hidden_act, config.mlp_gated, config.num_experts) == (1e-5, "relu2", False, 0)
    assert config.nope_layers == tuple(range(56)) and config.recurrent and not config.is_llama_like
    # transformers 5's own names: the list under layer_types, legacy "mamba" / "attention" entries.
    listed = ModelConfig.from_dict({"architectures": ["NemotronHForCausalLM"],
                                    "layer_types": ["mamba", "moe", "attention", "mlp"], "moe_latent_size": 1024})
    assert (listed.sublayers, listed.kv_layers, listed.moe_layers, listed.moe_latent_size) == (
        ("mixer", "mlp", "mixer", "mlp"), (2,), (1,), 1024)
    with pytest.raises(ModelLoadError, match="hybrid_override_pattern holds X"):
        ModelConfig.from_dict({**NEMOTRON_NANO_2, "hybrid_override_pattern": "M*X"})
    with pytest.raises(ModelLoadError, match="without an attention layer"):
        ModelConfig.from_dict({**NEMOTRON_NANO_2, "hybrid_override_pattern": "M-M-"})
    with pytest.raises(ModelLoadError, match="groups that divide them"):
        ModelConfig.from_dict({**NEMOTRON_NANO_2, "n_groups": 7})


def test_jamba_and_bamba_read_their_layer_layouts_as_transformers_does():
    """Jamba named alone (Jamba v0.1's shape): attention in one layer of eight from the fifth, experts in every
    other layer from the second, Mamba layers of 8192 channels with a 256-rank step; Bamba: attention in
    attn_layer_indices, Mamba-2 elsewhere, RoPE over half of each head."""
    jamba, hf = ModelConfig.from_dict({"architectures": ["JambaForCausalLM"]}), transformers.JambaConfig()
    assert jamba.kv_layers == tuple(i for i, t in enumerate(hf.layers_block_type) if t == "attention") == (4, 12, 20, 28)
    assert jamba.moe_layers == tuple(i for i, n in enumerate(hf.layers_num_experts) if n > 1)
    shape = jamba.linear_attention
    assert (shape.intermediate, shape.state_size, shape.dt_rank, shape.conv_kernel) == (
        hf.mamba_expand * hf.hidden_size, hf.mamba_d_state, hf.mamba_dt_rank, hf.mamba_d_conv)
    assert (jamba.num_experts, jamba.moe_intermediate_size, jamba.norm_topk_prob) == (16, 14336, False)
    assert jamba.nope_layers == tuple(range(32)) and jamba.recurrent
    with pytest.raises(ModelLoadError, match="attn_layer_offset \\(8\\) must be below attn_layer_period \\(8\\)"):
        ModelConfig.from_dict({"architectures": ["JambaForCausalLM"], "attn_layer_offset": 8})
    bamba_raw = {"architectures": ["BambaForCausalLM"], "num_hidden_layers": 6, "attn_layer_indices": [2, 5]}
    bamba, hf = ModelConfig.from_dict(bamba_raw), transformers.BambaConfig(num_hidden_layers=6, attn_layer_indices=[2, 5])
    assert bamba.kv_layers == tuple(i for i, t in enumerate(hf.layers_block_type) if t == "full_attention") == (2, 5)
    assert bamba.rotary_dim == bamba.head_dim // 2 and bamba.linear_attention.num_heads == hf.mamba_n_heads
    with pytest.raises(ModelLoadError, match="attn_layer_indices must list layers of the 6"):
        ModelConfig.from_dict({**bamba_raw, "attn_layer_indices": [6]})
    # Named alone, transformers' Bamba has no attention layer: the KV pool needs one.
    with pytest.raises(ModelLoadError, match="at least one attention layer"):
        ModelConfig.from_dict({"architectures": ["BambaForCausalLM"]})


@pytest.mark.parametrize("arch, hf_config", [("BloomForCausalLM", "BloomConfig"), ("MptForCausalLM", "MptConfig")])
def test_bloom_and_mpt_named_alone_take_transformers_defaults(arch, hf_config):
    """As above, for the two without a maximum position in transformers' config (ALiBi; MPT's max_seq_len)."""
    config, hf = ModelConfig.from_dict({"architectures": [arch]}), getattr(transformers, hf_config)()
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.tie_word_embeddings, config.rms_norm_eps) == (
        hf.vocab_size, hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_attention_heads,
        hf.tie_word_embeddings, hf.layer_norm_epsilon)
    assert config.intermediate_size == 4 * hf.hidden_size
    assert config.max_position_embeddings == getattr(hf, "max_seq_len", 2048)


def test_granite_swa_reads_its_windows_sinks_and_bases_as_transformers_does():
    """Named alone: every fourth layer from layer 0 attends in full, the rest within 128 tokens, all with sinks;
    layer_rope_theta's zeros are layers without RoPE, the sliding layers' base their own; a mix the engine cannot
    compute is refused."""
    hf = transformers.GraniteSWAConfig()
    config = ModelConfig.from_dict({"architectures": ["GraniteSWAForCausalLM"]})
    assert config.sliding_window == hf.sliding_window == 128 and config.attention_sinks
    assert config.sliding_layers == tuple(i for i, t in enumerate(hf.layer_types) if t == "sliding_attention")
    assert config.nope_layers == () and config.local_rope_theta is None
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    raw = {"architectures": ["GraniteMoeSWAForCausalLM"], "num_hidden_layers": 4, "layer_types": types,
           "rope_theta": 10000.0, "layer_rope_theta": [0, 1e6, 1e6, 10000.0]}
    config = ModelConfig.from_dict(raw)
    assert (config.nope_layers, config.rope_theta, config.local_rope_theta) == ((0,), 10000.0, 1e6)
    assert config.num_experts == transformers.GraniteMoeSWAConfig().num_local_experts
    with pytest.raises(ModelLoadError, match="gives the full layers the bases \\[10000.0\\] and the sliding ones "
                                             "\\[1000.0, 1000000.0\\]"):
        ModelConfig.from_dict({**raw, "layer_rope_theta": [0, 1e6, 1e3, 10000.0]})
    with pytest.raises(ModelLoadError, match="layer_types must list full_attention or sliding_attention"):
        ModelConfig.from_dict({**raw, "layer_types": ["full_attention"] * 3})
    with pytest.raises(ModelLoadError, match="sinks_scale_output is a form of attention sinks"):
        dataclasses.replace(config, attention_sinks=False)


def test_persimmon_reads_its_released_config():
    """adept/persimmon-8b-base's config.json as published: RoPE's base and share at the top level."""
    config = ModelConfig.from_dict({
        "architectures": ["PersimmonForCausalLM"], "hidden_act": "relu2", "hidden_size": 4096,
        "intermediate_size": 16384, "layer_norm_eps": 1e-05, "max_position_embeddings": 16384,
        "num_attention_heads": 64, "num_hidden_layers": 36, "partial_rotary_factor": 0.5, "qk_layernorm": True,
        "rope_theta": 25000.0, "vocab_size": 262144, "tie_word_embeddings": False, "bos_token_id": 71013,
        "eos_token_id": 71013})
    assert (config.head_dim, config.num_key_value_heads, config.rotary_dim, config.rope_theta, config.qk_norm,
            config.norm_bias, config.qkv_layout, config.hidden_act, config.mlp_gated) == (
        64, 64, 32, 25000.0, True, True, "per_head", "relu2", False)
    assert not ModelConfig.from_dict({"architectures": ["PersimmonForCausalLM"], "qk_layernorm": False}).qk_norm


def test_laguna_reads_heads_gates_rope_and_router_per_its_config(tmp_path):
    config = ModelConfig.from_dict({"architectures": ["LagunaForCausalLM"], "num_hidden_layers": 4,
                                    "num_attention_heads_per_layer": [48, 64, 48, 64], "gating": "per-element",
                                    "layer_types": ["sliding_attention", "full_attention"] * 2,
                                    "moe_router_logit_softcapping": 30.0})
    assert [config.query_heads(i) for i in range(4)] == [48, 64, 48, 64]
    assert (config.attn_output_gate, config.attn_gate_softplus, config.router_softcap, config.moe_routing) == (
        "own", True, 30.0, "sigmoid")
    assert (config.rotary_dim, config.rope_theta, config.local_rotary_dim, config.local_rope_theta) == (
        64, 500000.0, 128, 10000.0)
    assert config.sliding_layers == (0, 2) and config.moe_layers == (1, 2, 3)
    assert (config.shared_expert_intermediate_size, config.moe_intermediate_size) == (512, 512)
    with pytest.raises(InvalidArgument, match="LagunaForCausalLM takes no LoRA adapters here yet: its layers have query"):
        read_lora(LoraRef("sql", str(tmp_path)), config.lora_shape, 64)
    named_alone = ModelConfig.from_dict({"architectures": ["LagunaForCausalLM"]})
    assert (named_alone.attn_output_gate, named_alone.router_softcap, named_alone.sliding_layers,
            named_alone.local_rope_theta) == ("per_head", None, None, None)
    with pytest.raises(ModelLoadError, match="num_attention_heads_per_layer must give each of the 2 layers"):
        ModelConfig.from_dict({"architectures": ["LagunaForCausalLM"], "num_hidden_layers": 2,
                               "num_attention_heads_per_layer": [8]})
    with pytest.raises(ModelLoadError, match=r"layer_query_heads \[8, 12\] must give each"):
        ModelConfig.from_dict({"architectures": ["LagunaForCausalLM"], "num_hidden_layers": 2,
                               "num_attention_heads_per_layer": [8, 12]})  # 8 KV heads
    with pytest.raises(ModelLoadError, match="moe_apply_router_weight_on_input"):
        ModelConfig.from_dict({"architectures": ["LagunaForCausalLM"], "moe_apply_router_weight_on_input": True})
    with pytest.raises(ModelLoadError, match="router_softcap caps a sigmoid router"):
        dataclasses.replace(named_alone, router_softcap=5.0, moe_routing="softmax")
    with pytest.raises(ModelLoadError, match="attn_gate_softplus is a gate's"):
        dataclasses.replace(named_alone, attn_output_gate=None)
    with pytest.raises(ModelLoadError, match="local_partial_rotary_factor 0.5 must leave the sliding layers"):
        dataclasses.replace(named_alone, local_partial_rotary_factor=0.5)


def test_recurrent_gemma_reads_its_blocks_and_scales_as_transformers():
    import torch

    config = ModelConfig.from_dict({"architectures": ["RecurrentGemmaForCausalLM"], "num_hidden_layers": 5,
                                    "hidden_size": 96, "num_attention_heads": 4, "intermediate_size": 300,
                                    "block_types": ["recurrent", "attention"], "lru_width": 128})
    hf = transformers.RecurrentGemmaConfig(num_hidden_layers=5, hidden_size=96, num_attention_heads=4,
                                           block_types=["recurrent", "attention"])
    assert config.linear_layers == tuple(i for i, t in enumerate(hf.layers_block_type) if t == "linear_attention")
    assert config.sliding_layers == (1, 3) and config.sliding_window == hf.attention_window_size
    # the embeddings' scale as transformers' normalizer buffer holds it: sqrt(hidden_size) in bf16
    assert config.embed_scale == torch.tensor(96 ** 0.5, dtype=torch.bfloat16).item() != 96 ** 0.5
    assert (config.intermediate_size, config.linear_attention.width, config.rotary_dim, config.final_softcap) == (
        150, 128, 12, 30.0)
    with pytest.raises(ModelLoadError, match="lru_width .* must be a multiple of num_attention_heads"):
        ModelConfig.from_dict({"architectures": ["RecurrentGemmaForCausalLM"], "lru_width": 2561})


def test_the_new_fields_of_xglm_minimax_and_axk2_are_checked():
    xglm = ModelConfig.from_dict({"architectures": ["XGLMForCausalLM"], "pad_token_id": 1})
    assert xglm.sinusoidal_padding_row == 1
    for row in (5000, -1):  # outside the 2048 + 2 rows of its table
        with pytest.raises(ModelLoadError, match="must name a row of the sinusoidal positions' table"):
            dataclasses.replace(xglm, sinusoidal_padding_row=row)
    minimax = ModelConfig.from_dict({"architectures": ["MiniMaxForCausalLM"]})
    with pytest.raises(ModelLoadError, match="normed_stream .* needs six factors"):
        dataclasses.replace(minimax, normed_stream=(1.0, 1.0))
    axk2 = ModelConfig.from_dict({"architectures": ["AXK2ForCausalLM"]})
    with pytest.raises(ModelLoadError, match="gated_norm_rank must be >= 1"):
        dataclasses.replace(axk2, self_gated_norm_rank=-1)
    with pytest.raises(ModelLoadError, match="mla_query_gate gates latent attention's heads"):
        dataclasses.replace(xglm, mla_query_gate=True)


def test_apertus_1_5_reads_its_pruned_head_and_refuses_one_it_cannot_hold():
    """output_vocab_size: the output head's rows (the text tokens); image and audio codes past them are inputs only."""
    raw = {"architectures": ["Apertus1p5TextForCausalLM"], "output_vocab_size": 131072}
    config = ModelConfig.from_dict(raw)
    assert (config.head_vocab_size, config.vocab_size, config.hidden_act) == (131072, 266752, "xielu")
    assert ModelConfig.from_dict({**raw, "output_vocab_size": None}).head_vocab_size is None
    for bad in ({"output_vocab_size": 300000}, {"output_vocab_size": 0}, {"tie_word_embeddings": True}):
        with pytest.raises(ModelLoadError, match="output_vocab_size"):
            ModelConfig.from_dict({**raw, **bad})


def test_cohere_compass_reads_rope_per_layer_type_and_refuses_a_type_without_its_own():
    """transformers builds no Compass model whose rope_parameters leave a layer type out (named alone, its
    defaults do): refused, saying so. A null entry is a type without positions."""
    with pytest.raises(ModelLoadError, match="rope_parameters must give each layer type in use"):
        ModelConfig.from_dict({"architectures": ["CohereCompassForCausalLM"]})
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": None}
    config = ModelConfig.from_dict({"architectures": ["CohereCompassForCausalLM"], "num_hidden_layers": 4,
                                    "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
                                    "rope_parameters": rope})
    assert (config.nope_layers, config.sliding_layers, config.rope_interleaved, config.logit_scale,
            config.vocab_size) == ((3,), (0, 1, 2), False, 1.0, 256000)
    with pytest.raises(ModelLoadError, match="default RoPE with a rope_theta"):
        ModelConfig.from_dict({"architectures": ["CohereCompassForCausalLM"], "rope_parameters": {
            "full_attention": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 2.0}}})
