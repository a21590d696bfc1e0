"""Architectures served as another one because transformers builds them from its parts (InternLM3 as its Llama,
Gemma 1 as Gemma 2 less what Gemma 2 added, Mistral 4 as DeepSeek-V3 with a query scale, ...): each entry's
comment says what sets it apart from its target.

Each alias names the fields its config calls otherwise, its transformers defaults where the target's differ (a
config.json may leave any field out), the fields transformers does not read for it (so a stale one is not taken
for the target's), how its dense and routed MLP layers are laid out, and the ``ModelConfig`` fields it sets
beyond the target's, and may rewrite its config as its transformers config class does after reading it (legacy
values, fields the target would refuse set aside). No torch: the scheduler reads configs too."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import ModelLoadError
from services.engine import (
    aria,
    axk2,
    beam,
    biogpt,
    bloom,
    codegen,
    cohere2_moe,
    cohere_compass,
    dbrx,
    falcon,
    falcon_h1,
    flint,
    gemma4,
    gpt2,
    gpt_bigcode,
    gpt_neo,
    gpt_neox,
    gpt_neox_japanese,
    gptj,
    granite_swa,
    jamba,
    kimi_linear,
    laguna,
    lara_mini,
    lfm3,
    mamba,
    mellum,
    mimo_v2,
    minimax,
    mpt,
    nanochat,
    nemotron_h,
    olmo_hybrid,
    opt,
    persimmon,
    recurrent_gemma,
    xglm,
    zamba2,
)
from services.engine.linear_attention_config import linear_attention_fields, mamba2_fields, short_conv_fields


@dataclass(frozen=True)
class Alias:
    target: str
    names: dict[str, str] = field(default_factory=dict)  # its field → the target's
    defaults: dict[str, Any] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    # "mlp_layer_types": its dense/sparse list per layer (GLM-4.7-Flash; default: layer 0 dense), read as
    # the target's first_k_dense_replace; "dense": no routed layer at all.
    mlp_layers: str | None = None
    # ModelConfig fields it sets beyond what the target reads from the config.
    fields: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Its config as its transformers config class leaves it after reading (legacy values it replaces).
    rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None


HY_V3, KOLIBRI1 = "HYV3ForCausalLM", "Kolibri1ForCausalLM"
# transformers' DeepSeek-V3 routing fields, which Youtu's config (dense MLPs only) does not have.
_ROUTING = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size", "n_group",
            "topk_group", "routed_scaling_factor", "norm_topk_prob", "first_k_dense_replace", "topk_method",
            "scoring_func", "moe_layer_freq")
# Qwen2/3's window fields, which the hybrids served as Qwen2-MoE or Qwen3 do not read (they attend in full).
_NO_WINDOW = ("use_sliding_window", "sliding_window", "max_window_layers")
def _sparse_attention_alias(defaults: dict[str, Any],
                            fields: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Alias:
    """DeepSeek-V3.2's sparse attention over DeepSeek-V3 (dsa.py) with a model's defaults: its rotated features
    always interleaved, its dense layers first by mlp_layer_types, ``fields`` beyond the indexer's."""
    return Alias("DeepseekV3ForCausalLM", {"num_local_experts": "n_routed_experts", "num_experts": "n_routed_experts"},
                 defaults, ("layer_types", "head_dim"), mlp_layers="mlp_layer_types",
                 rewrite=lambda raw: {**raw, "rope_interleave": True}, fields=fields or (lambda raw: _sparse_attention(raw)))


ALIASES = {
    # InternLM3: its qkv_bias and bias are Llama's attention_bias (o_proj's too) and mlp_bias, which transformers
    # requires equal.
    "InternLM3ForCausalLM": Alias("LlamaForCausalLM", {"qkv_bias": "attention_bias", "bias": "mlp_bias"},
                                  {"head_dim": 128}, rewrite=lambda raw: _internlm3(raw)),
    "ExaoneForCausalLM": Alias("LlamaForCausalLM", {"num_layers": "num_hidden_layers",
                                                    "layer_norm_epsilon": "rms_norm_eps",
                                                    "activation_function": "hidden_act"},
                               {"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096}),
    # Gemma (and CodeGemma): Gemma 2's decoder without its sandwich norms, soft-caps or sliding layers, queries
    # scaled by the head width, and the tanh GELU where a legacy config says "gelu" (as transformers reads it).
    # Its norms keep Llama's names, which Gemma 2's module reads without sandwich norms.
    "GemmaForCausalLM": Alias(
        "Gemma2ForCausalLM",
        defaults={"vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
                  "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
                  "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "bos_token_id": 2, "eos_token_id": 1,
                  "hidden_act": "gelu_pytorch_tanh"},
        ignored=("hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                 "sliding_window", "layer_types"),
        fields=lambda raw: {"sandwich_norms": False, "attn_softcap": None, "final_softcap": None,
                            "sliding_window": None, "sliding_layers": None,
                            "attn_scale": float(raw["head_dim"]) ** -0.5},
        rewrite=lambda raw: {**raw, "hidden_act": "gelu_pytorch_tanh"} if raw["hidden_act"] == "gelu" else raw),
    # GLM-4-9B (``GlmForCausalLM``, the checkpoints before 0414): GLM-4's decoder without its sandwich norms, so
    # its post_attention_layernorm is the MLP's input norm, as in Llama (the architecture's own name keeps
    # GLM-4's renames off its tensors).
    "GlmForCausalLM": Alias(
        "Glm4ForCausalLM",
        defaults={"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
                  "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
                  "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-07,
                  "eos_token_id": [151329, 151336, 151338]},
        fields=lambda raw: {"sandwich_norms": False, "architecture": "GlmForCausalLM"}),
    # Kyutai's Helium: Llama rotating interleaved pairs of features (as GLM-4 does), o_proj without a bias.
    "HeliumForCausalLM": Alias(
        "LlamaForCausalLM",
        defaults={"vocab_size": 48000, "hidden_size": 2560, "intermediate_size": 7040, "num_hidden_layers": 24,
                  "num_attention_heads": 20, "num_key_value_heads": 20, "head_dim": 128,
                  "max_position_embeddings": 4096, "rms_norm_eps": 1e-8, "bos_token_id": 1, "eos_token_id": 2},
        fields=lambda raw: {"rope_interleaved": True, "o_proj_bias": False}),
    # Emu3's language model (BAAI's Emu3-Chat and -Gen, whose images are tokens of its vocabulary): Llama.
    "Emu3ForCausalLM": Alias(
        "LlamaForCausalLM",
        defaults={"vocab_size": 184622, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 9216,
                  "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "bos_token_id": 151849, "eos_token_id": 151850,
                  "pad_token_id": 151643, "tie_word_embeddings": False},
        ignored=("attention_dropout",)),
    # Beam (beam.py): GLM-4.5's routing under Qwen3-MoE's attention, sandwich norms joined by depth-scaled adds,
    # RoPE in sliding layers only, gated attention.
    beam.ARCH: Alias("Glm4MoeForCausalLM", beam.NAMES, beam.DEFAULTS, beam.IGNORED, mlp_layers="mlp_layer_types",
                     rewrite=beam.rewrite, fields=beam.fields),
    # Cohere's Compass (cohere_compass.py): Cohere 2 with RoPE per layer type, halves rotated.
    cohere_compass.ARCH: Alias("Cohere2ForCausalLM", cohere_compass.NAMES, cohere_compass.DEFAULTS,
                               cohere_compass.IGNORED, rewrite=cohere_compass.rewrite, fields=cohere_compass.fields),
    # Aria's language model (aria.py): Mixtral with a shared MLP beside its experts, stacked as released.
    aria.ARCH: Alias("MixtralForCausalLM", aria.NAMES, aria.DEFAULTS, aria.IGNORED, fields=aria.fields),
    # Apertus 1.5's language model: Apertus over a vocabulary extended with image and audio codes, its output head
    # pruned to the text tokens before them where output_vocab_size says so (head_vocab_size).
    "Apertus1p5TextForCausalLM": Alias(
        "ApertusForCausalLM",
        defaults={"vocab_size": 266752, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 65536, "rms_norm_eps": 1e-5,
                  "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "tie_word_embeddings": False},
        fields=lambda raw: {"head_vocab_size": None if raw.get("output_vocab_size") in (None, raw["vocab_size"])
                            else int(raw["output_vocab_size"])}),
    # BitNet b1.58 (Microsoft's 2B4T, and its bf16 master weights): Llama with squared ReLUs, an RMSNorm of
    # attention's output before o_proj and of the MLP's product before down_proj (sub_norms); its released ternary
    # weights, packed four to a byte, with activations rounded to 8 bits per token, are bitnet.py's.
    "BitNetForCausalLM": Alias(
        "LlamaForCausalLM",
        defaults={"vocab_size": 128256, "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 30,
                  "num_attention_heads": 20, "num_key_value_heads": 5, "hidden_act": "relu2",
                  "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "bos_token_id": 128000,
                  "eos_token_id": 128001},
        ignored=("attention_dropout",),
        fields=lambda raw: {"sub_norms": True, "o_proj_bias": False, "mlp_bias": False,
                            "architecture": "BitNetForCausalLM"}),
    # StarCoder2: Mistral's attention (a window in every layer where set) with biases on every projection
    # (use_bias), torch's LayerNorms with biases, and an MLP without a gate (c_fc, c_proj: weight_names.py).
    "Starcoder2ForCausalLM": Alias(
        "MistralForCausalLM",
        names={"norm_epsilon": "rms_norm_eps", "use_bias": "starcoder2_use_bias"},
        defaults={"vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30,
                  "num_attention_heads": 24, "num_key_value_heads": 2, "hidden_act": "gelu_pytorch_tanh",
                  "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "bos_token_id": 50256,
                  "eos_token_id": 50256, "tie_word_embeddings": True, "starcoder2_use_bias": True},
        ignored=("residual_dropout", "embedding_dropout"),
        fields=lambda raw: {"layer_norm": True, "norm_bias": True, "mlp_gated": False,
                            **dict.fromkeys(("mlp_bias", "attention_bias", "o_proj_bias"),
                                            bool(raw["starcoder2_use_bias"])),
                            "architecture": "Starcoder2ForCausalLM"}),
    # StableLM (StableLM 2, StableLM-3B-4E1T, Zephyr 3B): Llama's SwiGLU with torch's LayerNorms (biased), RoPE
    # over a share of each head (a quarter by default), biases on q/k/v with use_qkv_bias, and attention and
    # MLP reading one norm side by side with use_parallel_residual.
    "StableLmForCausalLM": Alias(
        "LlamaForCausalLM",
        names={"use_qkv_bias": "attention_bias", "layer_norm_eps": "rms_norm_eps"},
        defaults={"vocab_size": 50304, "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
                  "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 0},
        ignored=("hidden_dropout", "attention_dropout"),
        rewrite=lambda raw: _partial_rotary_aside(_refuse_qk_layernorm(raw, "StableLM 2 12B"), 0.25),
        fields=lambda raw: {"layer_norm": True, "norm_bias": True, "o_proj_bias": False,
                            "parallel_block": bool(raw.get("use_parallel_residual")),
                            "partial_rotary_factor": raw["partial_rotary_aside"],
                            "architecture": "StableLmForCausalLM"}),
    # Phi-1, Phi-1.5, Phi-2: attention and an ungated MLP side by side on one LayerNorm, biases on every
    # projection and on the output head, RoPE over part of each head (half by default); GPT-style names
    # (dense, fc1, fc2, final_layernorm: weight_names.py).
    "PhiForCausalLM": Alias(
        "LlamaForCausalLM",
        names={"layer_norm_eps": "rms_norm_eps"},
        defaults={"vocab_size": 51200, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                  "num_attention_heads": 32, "hidden_act": "gelu_new", "max_position_embeddings": 2048,
                  "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2},
        ignored=("resid_pdrop", "embd_pdrop", "attention_dropout", "attention_bias", "mlp_bias"),
        rewrite=lambda raw: _phi(raw),
        fields=lambda raw: {"layer_norm": True, "norm_bias": True, "parallel_block": True, "mlp_gated": False,
                            **dict.fromkeys(("attention_bias", "o_proj_bias", "mlp_bias", "lm_head_bias"), True),
                            "partial_rotary_factor": raw["partial_rotary_aside"], "architecture": "PhiForCausalLM"}),
    # Granite 4.0 (GraniteMoeHybridForCausalLM): Granite's scalings and its MLP as `shared_mlp` (gate and up fused
    # in input_linear), beside experts where there are any (then served as GraniteMoeShared, else as Granite:
    # weight_names.py renames the MLP); RoPE only where position_embedding_type is "rope"; the -H models' Mamba-2
    # layers (mamba2.py) where layer_types names them.
    "GraniteMoeHybridForCausalLM": Alias(
        "GraniteMoeSharedForCausalLM",
        defaults={"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                  "bos_token_id": 1, "eos_token_id": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
                  "shared_intermediate_size": 1024},
        ignored=("output_router_logits", "router_aux_loss_coef"),
        rewrite=lambda raw: _granite4(raw),
        fields=lambda raw: {
            "nope_layers": () if raw.get("position_embedding_type") == "rope" else tuple(range(raw["num_hidden_layers"])),
            **(mamba2_fields(raw, _MAMBA) if any(t in _MAMBA for t in raw["layer_types"]) else {}),
            **({"architecture": "GraniteMoeHybridForCausalLM"} if raw["architectures"] == ["GraniteForCausalLM"] else {})}),
    # GPT-NeoX (gpt_neox.py): biased LayerNorms and projections, an ungated MLP, RoPE over part of each head, and
    # attention and the MLP side by side on norms of their own.
    gpt_neox.ARCH: Alias("LlamaForCausalLM", gpt_neox.NAMES, gpt_neox.DEFAULTS, gpt_neox.IGNORED,
                         rewrite=lambda raw: gpt_neox.rewrite(_partial_rotary_aside(raw, 0.25)), fields=gpt_neox.fields),
    # GPT-NeoX Japanese (gpt_neox_japanese.py): GPT-NeoX's pre-norm block without biases but the last layer's
    # attention output's.
    gpt_neox_japanese.ARCH: Alias("LlamaForCausalLM", gpt_neox_japanese.NAMES, gpt_neox_japanese.DEFAULTS,
                                  gpt_neox_japanese.IGNORED,
                                  rewrite=lambda raw: _partial_rotary_aside(gpt_neox_japanese.rewrite(raw), 1.0),
                                  fields=gpt_neox_japanese.fields),
    # Persimmon (persimmon.py): GPT-NeoX's pre-norm block of squared ReLUs, each head of q and k LayerNormed.
    persimmon.ARCH: Alias("LlamaForCausalLM", persimmon.NAMES, persimmon.DEFAULTS, persimmon.IGNORED,
                          rewrite=lambda raw: persimmon.rewrite(_partial_rotary_aside(raw, 0.5)),
                          fields=persimmon.fields),
    # OLMo Hybrid (olmo_hybrid.py): OLMo 2's post-norm attention layers beside pre-norm Gated DeltaNet layers.
    olmo_hybrid.ARCH: Alias("Olmo2ForCausalLM", defaults=olmo_hybrid.DEFAULTS, ignored=olmo_hybrid.IGNORED,
                            rewrite=olmo_hybrid.rewrite, fields=olmo_hybrid.fields),
    # RecurrentGemma (recurrent_gemma.py): Griffin's recurrent blocks beside local attention, Gemma's norms.
    recurrent_gemma.ARCH: Alias("LlamaForCausalLM", recurrent_gemma.NAMES, recurrent_gemma.DEFAULTS,
                                recurrent_gemma.IGNORED,
                                rewrite=lambda raw: recurrent_gemma.rewrite(_partial_rotary_aside(raw, 0.5)),
                                fields=recurrent_gemma.fields),
    # Falcon (falcon.py): biased LayerNorms, an ungated MLP, attention and MLP side by side on one norm or two, and
    # a fused query_key_value laid out by architecture.
    falcon.ARCH: Alias("LlamaForCausalLM", falcon.NAMES, falcon.DEFAULTS, falcon.IGNORED, rewrite=falcon.rewrite,
                       fields=falcon.fields),
    # OPT (opt.py) and GPT-2 (gpt2.py): learned absolute positions instead of RoPE, biased LayerNorms and
    # projections, an ungated MLP (ReLU; gelu_new).
    opt.ARCH: Alias("LlamaForCausalLM", opt.NAMES, opt.DEFAULTS, opt.IGNORED, rewrite=opt.rewrite, fields=opt.fields),
    # BioGPT (biogpt.py): OPT's block under its own names, GELU, its embeddings scaled by sqrt(hidden_size).
    biogpt.ARCH: Alias("LlamaForCausalLM", biogpt.NAMES, biogpt.DEFAULTS, biogpt.IGNORED, rewrite=biogpt.rewrite,
                       fields=biogpt.fields),
    # XGLM (xglm.py): OPT's block under its own names, GELU, scaled embeddings, sinusoidal positions.
    xglm.ARCH: Alias("LlamaForCausalLM", xglm.NAMES, xglm.DEFAULTS, xglm.IGNORED, rewrite=xglm.rewrite,
                     fields=xglm.fields),
    gpt2.ARCH: Alias("LlamaForCausalLM", gpt2.NAMES, gpt2.DEFAULTS, gpt2.IGNORED, rewrite=gpt2.rewrite,
                     fields=gpt2.fields),
    # DBRX (dbrx.py): Mixtral's experts under nested config fields and names of its own, LayerNorms, clamped q/k/v.
    dbrx.ARCH: Alias("MixtralForCausalLM", dbrx.NAMES, dbrx.DEFAULTS, dbrx.IGNORED, rewrite=dbrx.rewrite,
                     fields=dbrx.fields),
    # GPT-Neo (gpt_neo.py): GPT-2's block with unscaled scores, global and local (windowed) layers alternating.
    gpt_neo.ARCH: Alias("LlamaForCausalLM", gpt_neo.NAMES, gpt_neo.DEFAULTS, gpt_neo.IGNORED, rewrite=gpt_neo.rewrite,
                        fields=gpt_neo.fields),
    # GPTBigCode (gpt_bigcode.py: StarCoder, SantaCoder): GPT-2's block with multi-query attention.
    gpt_bigcode.ARCH: Alias("LlamaForCausalLM", gpt_bigcode.NAMES, gpt_bigcode.DEFAULTS, gpt_bigcode.IGNORED,
                            rewrite=gpt_bigcode.rewrite, fields=gpt_bigcode.fields),
    # GPT-J (gptj.py): interleaved RoPE over part of each head, attention and MLP in parallel on one norm.
    # CodeGen (codegen.py): GPT-J with q, k and v in one projection laid out by model-parallel shard.
    codegen.ARCH: Alias("LlamaForCausalLM", codegen.NAMES, codegen.DEFAULTS, codegen.IGNORED, rewrite=codegen.rewrite,
                        fields=codegen.fields),
    gptj.ARCH: Alias("LlamaForCausalLM", gptj.NAMES, gptj.DEFAULTS, gptj.IGNORED, rewrite=gptj.rewrite,
                     fields=gptj.fields),
    # BLOOM (bloom.py) and MPT (mpt.py): ALiBi instead of RoPE, LayerNorms and ungated GELU MLPs; BLOOM's
    # embeddings normed, everything biased, MPT's nothing.
    bloom.ARCH: Alias("LlamaForCausalLM", bloom.NAMES, bloom.DEFAULTS, bloom.IGNORED, rewrite=bloom.rewrite,
                      fields=bloom.fields),
    mpt.ARCH: Alias("LlamaForCausalLM", mpt.NAMES, mpt.DEFAULTS, mpt.IGNORED, rewrite=mpt.rewrite, fields=mpt.fields),
    # Jamba (jamba.py): attention without positions in one layer of attn_layer_period, Mamba (mamba1.py) in the
    # rest, Mixtral-style experts in one of expert_layer_period, not renormalized.
    jamba.ARCH: Alias("LlamaForCausalLM", defaults=jamba.DEFAULTS, ignored=jamba.IGNORED, fields=jamba.fields),
    # Bamba (IBM's Bamba-9B): Llama with Mamba-2 (mamba2.py) in every layer but attn_layer_indices, RoPE over half
    # of each head (transformers hard-codes it), biases on all four attention projections with attention_bias; its
    # MLP and norms under names of its own (weight_names.py).
    "BambaForCausalLM": Alias(
        "LlamaForCausalLM",
        defaults={"vocab_size": 128000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 262144,
                  "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2},
        ignored=("z_loss_coefficient", "partial_rotary_factor"),
        rewrite=lambda raw: _bamba(raw),
        fields=lambda raw: {**mamba2_fields(raw, _MAMBA), "partial_rotary_factor": 0.5, "architecture": "BambaForCausalLM"}),
    # Falcon-H1 (falcon_h1.py): Llama's attention (biases on all four projections with attention_bias) beside a
    # Mamba-2 mixer in every layer, µP multipliers folded into the weights as they load.
    falcon_h1.ARCH: Alias("LlamaForCausalLM", defaults=falcon_h1.DEFAULTS, ignored=falcon_h1.IGNORED,
                          rewrite=falcon_h1.rewrite, fields=falcon_h1.fields),
    # Phi-3.5-MoE: Mixtral's experts routed by sparse-mixer (moe.py), LayerNorms with biases, biases on
    # attention's projections with attention_bias and on the head with lm_head_bias, LongRoPE with the
    # attention scales it names (short_mscale, long_mscale: rope.py).
    "PhimoeForCausalLM": Alias(
        "MixtralForCausalLM",
        defaults={"vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 6400, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                  "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "num_local_experts": 16,
                  "num_experts_per_tok": 2},
        ignored=("input_jitter_noise", "output_router_logits", "router_aux_loss_coef"),
        fields=lambda raw: {"layer_norm": True, "norm_bias": True, "o_proj_bias": bool(raw.get("attention_bias")),
                            "lm_head_bias": bool(raw.get("lm_head_bias")), "moe_routing": "sparsemixer",
                            "sparsemixer_eps": float(raw.get("router_jitter_noise", 0.01)), "router_fp32": False,
                            "routing_weights_fp32": False, "architecture": "PhimoeForCausalLM"}),
    # IQuest-Coder: transformers' Llama under defaults of its own.
    "IQuestCoderForCausalLM": Alias(
        "LlamaForCausalLM",
        defaults={"vocab_size": 76800, "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 80,
                  "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                  "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}),
    # Jais 2: Llama with torch's LayerNorms (biased) and Nemotron's MLP (no gate, ReLU² by default), biases on
    # every projection by default.
    "Jais2ForCausalLM": Alias(
        "LlamaForCausalLM",
        names={"layer_norm_eps": "rms_norm_eps"},
        defaults={"vocab_size": 150272, "hidden_size": 3328, "intermediate_size": 26624, "num_hidden_layers": 32,
                  "num_attention_heads": 26, "hidden_act": "relu2", "max_position_embeddings": 8192,
                  "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 150024, "attention_bias": True,
                  "mlp_bias": True},
        fields=lambda raw: {"layer_norm": True, "norm_bias": True, "mlp_gated": False}),
    # VaultGemma: Gemma 2 without the norms on its sublayers' outputs (the MLP's input norm keeps Gemma 2's
    # name, pre_feedforward_layernorm: weight_names.py reads it as the pre-norm it is).
    "VaultGemmaForCausalLM": Alias(
        "Gemma2ForCausalLM",
        defaults={"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                  "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "bos_token_id": 2, "eos_token_id": 1},
        fields=lambda raw: {"sandwich_norms": False, "architecture": "VaultGemmaForCausalLM"}),
    # Meta's Code World Model: Llama (llama3 RoPE, no biases) with a window in all but every fourth layer, as
    # Qwen2 reads windows from layer_types.
    "CwmForCausalLM": Alias(
        "Qwen2ForCausalLM",
        defaults={"vocab_size": 128256, "hidden_size": 6144, "intermediate_size": 21504, "num_hidden_layers": 64,
                  "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
                  "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "bos_token_id": 128000,
                  "eos_token_id": [128001, 128008, 128009], "sliding_window": 8192},
        ignored=("use_sliding_window", "max_window_layers", "attention_bias"),
        rewrite=lambda raw: _cwm(_windows_by_layer_types(
            raw, lambda i: "full_attention" if i % 4 == 0 else "sliding_attention"))),
    # Nemotron (Nemotron-4, Minitron, Nemotron-Mini): LayerNorms with biases whose weights are stored less one
    # (LayerNorm1P, Gemma's offset), an ungated ReLU² MLP, RoPE over half of each head by default.
    "NemotronForCausalLM": Alias(
        "LlamaForCausalLM",
        names={"norm_eps": "rms_norm_eps"},
        defaults={"vocab_size": 256000, "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 32,
                  "num_attention_heads": 48, "hidden_act": "relu2", "max_position_embeddings": 4096,
                  "rms_norm_eps": 1e-5, "bos_token_id": 2, "eos_token_id": 3},
        rewrite=lambda raw: _partial_rotary_aside(raw, 0.5),
        fields=lambda raw: {"layer_norm": True, "norm_bias": True, "norm_unit_offset": True, "mlp_gated": False,
                            "partial_rotary_factor": raw["partial_rotary_aside"], "architecture": "NemotronForCausalLM"}),
    # OLMo (1, 1.7; the -hf checkpoints): Llama with LayerNorms without weights or biases (fp32, eps 1e-5) and
    # q, k and v clamped with clip_qkv.
    "OlmoForCausalLM": Alias(
        "LlamaForCausalLM",
        defaults={"vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                  "eos_token_id": 50279},
        names={"clip_qkv": "olmo_clip_qkv"},  # set aside: Llama, which it runs as, refuses clip_qkv
        ignored=("rms_norm_eps",),  # transformers' OlmoLayerNorm takes none: always 1e-5
        fields=lambda raw: {"layer_norm": True, "norm_affine": False, "clip_qkv": raw.get("olmo_clip_qkv"),
                            "architecture": "OlmoForCausalLM"}),
    # HyperCLOVA X (SEED Think): Granite with peri-layer norms (each sublayer's output normed before Granite's
    # residual scale: post_norm1/2, renamed in weight_names.py), logits multiplied by logits_scaling, and
    # attention scaled by head_dim ** -0.5 unless attention_multiplier says otherwise.
    "HyperCLOVAXForCausalLM": Alias(
        "GraniteForCausalLM",
        rewrite=lambda raw: _hyperclovax(raw),
        fields=lambda raw: {"logits_divisor": 1.0 / float(raw.get("logits_scaling", 1.0)),
                            **({"sandwich_norms": True, "architecture": "HyperCLOVAXForCausalLM"}
                               if raw.get("use_post_norm", True) else {})}),
    # Ministral (8B, 2410) as transformers' MinistralForCausalLM: Qwen2 without biases, its window in the layers
    # layer_types names (all of them by default when a window is set).
    "MinistralForCausalLM": Alias(
        "Qwen2ForCausalLM",
        defaults={"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                  "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": 4096},
        ignored=("use_sliding_window", "max_window_layers", "attention_bias"),
        rewrite=lambda raw: _windows_by_layer_types(raw, lambda i: "sliding_attention")),
    # Upstage's Solar Open: GLM-4.5's routing (sigmoid scores with a correction bias, shared experts) in every
    # layer under Llama's attention: all of each head rotated, no q/k norms.
    "SolarOpenForCausalLM": Alias(
        "Glm4MoeForCausalLM",
        defaults={"vocab_size": 196608, "hidden_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
                  "rms_norm_eps": 1e-5, "rope_theta": 1_000_000.0, "moe_intermediate_size": 1280,
                  "num_experts_per_tok": 8, "n_shared_experts": 1, "n_routed_experts": 128,
                  "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
                  "first_k_dense_replace": 0, "partial_rotary_factor": 1.0},
        ignored=("use_qk_norm", "intermediate_size"),
        # No dense layer: the width transformers leaves out is unused.
        rewrite=lambda raw: {**raw, "intermediate_size": raw["moe_intermediate_size"]}),
    # Tencent's Hy3: GLM-4.5's routing (an fp32 sigmoid router with a correction bias, its weights scaled) beside a
    # shared expert after a dense first layer (mlp_layer_types), under Qwen3's attention (q/k norms, RoPE over the
    # whole head); its multi-token-prediction layer after the model's own skipped.
    HY_V3: Alias(
        "Glm4MoeForCausalLM",
        {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts",
         "router_scaling_factor": "routed_scaling_factor"},
        defaults={"vocab_size": 120832, "hidden_size": 4096, "intermediate_size": 13312, "num_hidden_layers": 80,
                  "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                  "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 11_158_840.0,
                  "n_routed_experts": 192, "num_experts_per_tok": 8, "n_shared_experts": 1,
                  "moe_intermediate_size": 1536, "routed_scaling_factor": 2.826, "n_group": 1, "topk_group": 1,
                  "norm_topk_prob": True, "partial_rotary_factor": 1.0, "attention_bias": False,
                  "tie_word_embeddings": False},
        ignored=("use_qk_norm",), mlp_layers="mlp_layer_types",
        rewrite=lambda raw: {**raw, "use_qk_norm": True},
        fields=lambda raw: {"architecture": HY_V3, "mtp_layers": 1}),
    # Mistral 4 (Mistral Small 4): DeepSeek-V3's latent attention with Ministral 3's query scale by position
    # (llama_4_scaling_beta), routed by softmax scores within DeepSeek-V3's groups, no correction bias.
    "Mistral4ForCausalLM": Alias(
        "DeepseekV3ForCausalLM",
        defaults={"vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 2048,
                  "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 32,
                  "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0, "kv_lora_rank": 256,
                  "q_lora_rank": 1024, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64,
                  "n_group": 1, "topk_group": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 0,
                  "norm_topk_prob": True, "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6,
                  "bos_token_id": 1, "eos_token_id": 2, "rope_interleave": True},
        ignored=("topk_method", "scoring_func"),
        rewrite=lambda raw: _mistral4(raw),
        fields=lambda raw: {"moe_routing": "softmax_grouped", "router_fp32": False,
                            "architecture": "Mistral4ForCausalLM"}),
    # FlexOlmo: OLMoE's experts under OLMo 2's layer (norms on the sublayers' outputs only, q/k normed whole).
    "FlexOlmoForCausalLM": Alias(
        "OlmoeForCausalLM",
        defaults={"vocab_size": 100352, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                  "eos_token_id": 100257, "num_experts_per_tok": 5, "num_experts": 7, "norm_topk_prob": False},
        fields=lambda raw: {"pre_norms": False, "architecture": "FlexOlmoForCausalLM"}),
    # transformers' Glm4MoeLiteConfig defaults (GLM-4.7-Flash's shape).
    "Glm4MoeLiteForCausalLM": Alias(
        "DeepseekV3ForCausalLM",
        defaults={"vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240, "num_hidden_layers": 47,
                  "num_attention_heads": 20, "moe_intermediate_size": 1536, "n_shared_experts": 1,
                  "n_routed_experts": 64, "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768,
                  "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1,
                  "topk_group": 1, "num_experts_per_tok": 4, "norm_topk_prob": True,
                  "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 1,
                  "tie_word_embeddings": False, "rope_interleave": True},
        ignored=("first_k_dense_replace", "topk_method", "scoring_func", "moe_layer_freq"),
        mlp_layers="mlp_layer_types"),
    # Aleph Alpha's Kolibri-1: K-EXAONE's attention (q/k norms, RoPE in its sliding layers only) under GLM-4's four
    # norms, experts in every layer chosen by logit plus a correction bias and weighed by the chosen logits'
    # sigmoids (fp32), beside a shared expert of its own width.
    KOLIBRI1: Alias(
        "ExaoneMoeForCausalLM", {"num_local_experts": "num_experts"},
        defaults={"vocab_size": 128000, "hidden_size": 2560, "num_hidden_layers": 50, "num_attention_heads": 48,
                  "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
                  "sliding_window": 513, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                  "num_experts_per_tok": 6, "num_experts": 384, "norm_topk_prob": False, "tie_word_embeddings": False},
        ignored=("first_k_dense_replace", "num_shared_experts", "routed_scaling_factor", "n_group", "topk_group",
                 "sliding_window_pattern", "intermediate_size"),
        rewrite=lambda raw: _kolibri1(raw),
        fields=lambda raw: {"architecture": KOLIBRI1, "sandwich_norms": True, "moe_routing": "logit_biased_sigmoid",
                            "shared_expert_intermediate_size": int(raw["shared_expert_intermediate_size"]),
                            "routed_scaling_factor": 1.0}),
    # SKT's A.X K1: DeepSeek-V3 with its MoE blocks' output (experts plus shared expert) RMS-normed, the dense and
    # routed layers by mlp_layer_types (from first_k_dense_replace, default 1, as transformers derives it).
    "AXK1ForCausalLM": Alias(
        "DeepseekV3ForCausalLM",
        defaults={"vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
                  "num_attention_heads": 64, "num_key_value_heads": 64, "moe_intermediate_size": 2048,
                  "n_shared_experts": 1, "n_routed_experts": 192, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
                  "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
                  "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-6, "bos_token_id": 163691, "eos_token_id": 163691, "rope_interleave": True},
        names={"num_local_experts": "n_routed_experts"}, mlp_layers="mlp_layer_types",
        rewrite=lambda raw: _axk1(raw), fields=lambda raw: {"architecture": "AXK1ForCausalLM", "moe_output_norm": True}),
    # DeepSeek-V3.2: DeepSeek-V3 whose queries attend only the keys its indexer ranks highest (dsa.py), its
    # rotated features always interleaved; dense layers first by mlp_layer_types (3 by default).
    "DeepseekV32ForCausalLM": _sparse_attention_alias(
        {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
         "num_attention_heads": 128, "num_key_value_heads": 128, "moe_intermediate_size": 2048, "n_shared_experts": 1,
         "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
         "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
         "num_experts_per_tok": 8, "norm_topk_prob": True, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
         "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3, "index_topk": 2048, "index_head_dim": 128,
         "index_n_heads": 64}),
    # GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3.2 whose indexer rotates interleaved pairs and whose layers may
    # share the last indexing layer's choice of keys (indexer_types, or the pattern they are derived from).
    "GlmMoeDsaForCausalLM": _sparse_attention_alias(
        {"vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288, "num_hidden_layers": 78,
         "num_attention_heads": 64, "num_key_value_heads": 64, "moe_intermediate_size": 2048, "n_shared_experts": 1,
         "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 2048,
         "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1,
         "num_experts_per_tok": 8, "norm_topk_prob": True, "max_position_embeddings": 202752, "rms_norm_eps": 1e-5,
         "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3, "index_topk": 2048, "index_head_dim": 128,
         "index_n_heads": 32},
        lambda raw: {**_sparse_attention(raw), "architecture": "GlmMoeDsaForCausalLM", "index_rope_interleaved": True,
                     "index_shared_layers": _shared_indexers(raw)}),
    # A.X K2 (axk2.py): DeepSeek-V3.2 with each head's output gated by rows of q_b_proj and self-gated norms.
    axk2.ARCH: Alias("DeepseekV3ForCausalLM", {"num_local_experts": "n_routed_experts"}, axk2.DEFAULTS, axk2.IGNORED,
                     rewrite=axk2.rewrite, fields=lambda raw: {**_sparse_attention(raw), **axk2.fields(raw)}),
    # transformers' YoutuConfig defaults (Youtu-LLM-2B's shape); the rest are DeepSeek-V3's.
    "YoutuForCausalLM": Alias(
        "DeepseekV3ForCausalLM",
        defaults={"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32,
                  "num_attention_heads": 16, "max_position_embeddings": 131072, "bos_token_id": 128000,
                  "eos_token_id": 128001, "tie_word_embeddings": True},
        ignored=_ROUTING, mlp_layers="dense"),
    # MiniCPM3: DeepSeek-V2's latent attention (RoPE not interleaved) over dense MLPs, with MiniCPM's µP scales: the
    # embeddings times scale_emb (rounded to the weights' dtype), each sublayer's output times
    # scale_depth / sqrt(layers), the final hidden states divided by hidden_size / dim_model_base (as the logits).
    "MiniCPM3ForCausalLM": Alias(
        "DeepseekV3ForCausalLM",
        defaults={"vocab_size": 73448, "hidden_size": 2560, "intermediate_size": 6400, "num_hidden_layers": 62,
                  "num_attention_heads": 40, "num_key_value_heads": 40, "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "kv_lora_rank": 256, "q_lora_rank": 768,
                  "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "bos_token_id": 1, "eos_token_id": 2},
        ignored=_ROUTING, mlp_layers="dense", rewrite=lambda raw: _minicpm3(raw), fields=lambda raw: _minicpm3_fields(raw)),
    # transformers' MiniCPM5MoeConfig defaults; its rotary embedding ignores partial_rotary_factor (GLM-4.5's default
    # of a half included), and LlamaAttention's o_proj has a bias with attention_bias.
    "MiniCPM5MoeForCausalLM": Alias(
        "Glm4MoeForCausalLM",
        defaults={"vocab_size": 130560, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 28,
                  "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
                  "max_position_embeddings": 524288, "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": [1, 130073],
                  "n_routed_experts": 160, "routed_scaling_factor": 3.66, "num_experts_per_tok": 16,
                  "moe_intermediate_size": 512, "rope_theta": 5000000.0, "partial_rotary_factor": 1.0},
        ignored=("use_qk_norm", "partial_rotary_factor"), mlp_layers="mlp_layer_types",
        fields=lambda raw: {"attn_output_gate": "in_query", "o_proj_bias": bool(raw.get("attention_bias"))}),
    # Qwen3-Next: Qwen2-MoE's experts (a sigmoid-gated shared expert) under Qwen3's attention with an output gate
    # in q_proj (MiniCPM5's) and RoPE over a quarter of each head, in one layer of four; the other three are Gated
    # DeltaNet linear attention (gated_delta_net.py). Norms scale by 1 + w in fp32 (Gemma's), but the linear
    # layers' gated norm by w.
    "Qwen3NextForCausalLM": Alias(
        "Qwen2MoeForCausalLM",
        defaults={"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
                  "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                  "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                  "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                  "shared_expert_intermediate_size": 512, "norm_topk_prob": True, "decoder_sparse_step": 1,
                  "tie_word_embeddings": False},
        ignored=(*_NO_WINDOW, "qkv_bias"),
        rewrite=lambda raw: {**_partial_rotary_aside(raw, 0.25), "qkv_bias": bool(raw.get("attention_bias"))},
        fields=lambda raw: _qwen3_next_fields(raw, grouped_projections=True)),
    # LFM2 (Liquid AI): Qwen3's attention (q/k norms) in a few layers, a gated short convolution (short_conv.py) in
    # the rest, a SwiGLU MLP whose width transformers derives from block_ff_dim; its own tensor names
    # (weight_names.py).
    "Lfm2ForCausalLM": Alias(
        "Qwen3ForCausalLM", {"norm_eps": "rms_norm_eps", "block_ff_dim": "intermediate_size",
                             "tie_embedding": "tie_word_embeddings"},
        defaults={"vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128000,
                  "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "tie_word_embeddings": True, "bos_token_id": 1,
                  "eos_token_id": 2},
        ignored=_NO_WINDOW,
        rewrite=lambda raw: _lfm2(raw),
        fields=lambda raw: {**short_conv_fields(raw), "architecture": "Lfm2ForCausalLM"}),
    # Kimi Linear (kimi_linear.py): DeepSeek-V3's latent attention without positions in one layer of four, Kimi
    # Delta Attention (kda.py) in the rest, its routing under names of its own.
    kimi_linear.ARCH: Alias("DeepseekV3ForCausalLM", kimi_linear.NAMES, kimi_linear.DEFAULTS, kimi_linear.IGNORED,
                            mlp_layers="mlp_layer_types", rewrite=kimi_linear.rewrite, fields=kimi_linear.fields),
    # LFM3 (lfm3.py): LFM2's layers with sliding and full attention layers, each type with RoPE of its own, heads
    # gated by the input, sandwich norms.
    lfm3.ARCH: Alias("Qwen3ForCausalLM", lfm3.NAMES, lfm3.DEFAULTS, lfm3.IGNORED, rewrite=lfm3.rewrite,
                     fields=lfm3.fields),
    # LFM2-MoE (LFM2-8B-A1B): LFM2's layers with experts from layer num_dense_layers on, chosen by sigmoid score
    # plus a learned bias (DeepSeek-V3's routing in one group, the router in the model's dtype), no shared expert.
    "Lfm2MoeForCausalLM": Alias(
        "Qwen3MoeForCausalLM", {"norm_eps": "rms_norm_eps"},
        defaults={"vocab_size": 65536, "hidden_size": 2048, "intermediate_size": 7168, "moe_intermediate_size": 1792,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "max_position_embeddings": 128000, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
                  "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "num_experts": 32,
                  "num_experts_per_tok": 4, "norm_topk_prob": True},
        ignored=(*_NO_WINDOW, "decoder_sparse_step", "mlp_only_layers"),
        fields=lambda raw: _lfm2_moe_fields(raw)),
    # Nemotron-H (nemotron_h.py): one sublayer a layer (Mamba-2, attention without positions, an ungated ReLU² MLP
    # or experts), each behind its own norm; Llama's fields under its names, its own read by nemotron_h.py.
    nemotron_h.ARCH: Alias(
        "LlamaForCausalLM", nemotron_h.NAMES, defaults=nemotron_h.DEFAULTS, ignored=nemotron_h.IGNORED, rewrite=nemotron_h.rewrite, fields=nemotron_h.fields),
    # Granite with sliding windows and attention sinks (granite_swa.py), dense or over GraniteMoeShared's experts.
    granite_swa.SWA: Alias("GraniteForCausalLM", defaults=granite_swa.SWA_DEFAULTS, rewrite=granite_swa.rewrite,
                           fields=granite_swa.fields),
    granite_swa.MOE_SWA: Alias("GraniteMoeSharedForCausalLM", defaults=granite_swa.MOE_SWA_DEFAULTS,
                               rewrite=granite_swa.rewrite, fields=granite_swa.fields),
    # Gemma 4 (gemma4.py): Gemma 3's block with plain norm weights, wide full-attention heads, KV shared by its
    # last layers, per-layer inputs and experts beside the MLP; read as LFM3 is, for its per-type RoPE and q/k norms.
    gemma4.ARCH: Alias("Qwen3ForCausalLM", defaults=gemma4.DEFAULTS, ignored=gemma4.IGNORED, rewrite=gemma4.rewrite,
                       fields=gemma4.fields),
    # MiMo-V2-Flash (mimo_v2.py): GLM-4.5's routing under Llama's attention, its sliding layers with twice the KV
    # heads and sinks, values narrower than keys and scaled, RoPE over a third of each head.
    # Laguna (laguna.py): GLM-4.5's routing (soft-capped logits) beside a wider shared expert, under attention with
    # query heads per layer and a softplus output gate, sliding layers with RoPE of their own.
    laguna.ARCH: Alias("Glm4MoeForCausalLM", laguna.NAMES, laguna.DEFAULTS, laguna.IGNORED, mlp_layers="mlp_layer_types",
                       rewrite=laguna.rewrite, fields=laguna.fields),
    mimo_v2.ARCH: Alias("Glm4MoeForCausalLM", defaults=mimo_v2.DEFAULTS, mlp_layers="mlp_layer_types",
                        ignored=("use_qk_norm", "partial_rotary_factor"), rewrite=mimo_v2.rewrite, fields=mimo_v2.fields),
    # Flint (flint.py): Qwen3-MoE with sinks in every layer, sliding layers that rotate beside full ones that do
    # not, the top k of an fp32 router's sigmoids beside an ungated shared expert.
    flint.ARCH: Alias("Qwen3MoeForCausalLM", defaults=flint.DEFAULTS, ignored=flint.IGNORED, rewrite=flint.rewrite,
                      fields=flint.fields),
    # MiniMax-Text-01, MiniMax-M1 (minimax.py): Mixtral beside lightning-attention layers, a stream of norms.
    minimax.ARCH: Alias("MixtralForCausalLM", defaults=minimax.DEFAULTS, ignored=minimax.IGNORED,
                        rewrite=minimax.rewrite, fields=minimax.fields),
    # Mellum 2 (mellum.py): Qwen3-MoE with sliding layers and a RoPE base per layer type, dense layers by
    # mlp_layer_types, its multi-token-prediction layer skipped.
    mellum.ARCH: Alias("Qwen3MoeForCausalLM", defaults=mellum.DEFAULTS, ignored=mellum.IGNORED, rewrite=mellum.rewrite,
                       fields=mellum.fields),
    # nanochat (nanochat.py): Llama with weightless RMSNorms (the embeddings normed too), q/k normed after a RoPE
    # turning the other way, an ungated ReLU² MLP and soft-capped logits.
    nanochat.ARCH: Alias("LlamaForCausalLM", defaults=nanochat.DEFAULTS, fields=nanochat.fields),
    # Command A MoE (cohere2_moe.py): Cohere 2's block over experts after a dense prefix of its own width and window
    # pattern (rotating in every layer with a pattern of 1), top-k softmax or sigmoid routing, the shared MLP averaged in.
    cohere2_moe.ARCH: Alias("Cohere2ForCausalLM", defaults=cohere2_moe.DEFAULTS, rewrite=cohere2_moe.rewrite,
                            fields=cohere2_moe.fields),
    # Zamba2 (zamba2.py): Mamba-2 in every layer, a shared transformer block (attention over the stream and the
    # embeddings, a GELU-gated MLP, per-layer adapters) before it in the hybrid layers.
    zamba2.ARCH: Alias("LlamaForCausalLM", zamba2.NAMES, defaults=zamba2.DEFAULTS, ignored=zamba2.IGNORED,
                       rewrite=zamba2.rewrite, fields=zamba2.fields),
    # Qwen3.5 (the text model of Qwen3_5ForConditionalGeneration; vision_language.py): Qwen3-Next's layers over
    # a dense MLP, its linear layers' projections stored apart (in_proj_qkv, _z, _b, _a) rather than grouped.
    "Qwen3_5ForCausalLM": Alias(
        "Qwen3ForCausalLM",
        defaults={"vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
                  "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                  "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                  "tie_word_embeddings": False},
        ignored=_NO_WINDOW,
        rewrite=lambda raw: _partial_rotary_aside(raw, 0.25),
        fields=lambda raw: _qwen3_next_fields(raw, grouped_projections=False)),
    # Qwen3.5's mixtures of experts: Qwen3-Next's experts in every layer, always renormalized (the config names
    # neither a dense layer nor norm_topk_prob), under Qwen3.5's linear layers.
    "Qwen3_5MoeForCausalLM": Alias(
        "Qwen2MoeForCausalLM",
        defaults={"vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
                  "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                  "rope_theta": 10000.0, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                  "shared_expert_intermediate_size": 512, "tie_word_embeddings": False},
        ignored=(*_NO_WINDOW, "qkv_bias", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                 "intermediate_size"),
        rewrite=lambda raw: {**_partial_rotary_aside(raw, 0.25), "qkv_bias": bool(raw.get("attention_bias")),
                             "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                             "intermediate_size": raw["moe_intermediate_size"]},  # no dense layer to size
        fields=lambda raw: _qwen3_next_fields(raw, grouped_projections=False)),
    # Lara Mini (lara_mini.py): Qwen3.5-MoE's linear layers beside Qwen3's attention (sliding layers rotate, full ones
    # do not), plain norms, an ungated shared expert.
    lara_mini.ARCH: Alias(
        "Qwen2MoeForCausalLM", defaults=lara_mini.DEFAULTS,
        ignored=("use_sliding_window", "max_window_layers", "qkv_bias", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                 "intermediate_size"),
        rewrite=lambda raw: lara_mini.rewrite(_partial_rotary_aside(raw, 1.0)), fields=lara_mini.fields),
    # Mamba, Falcon Mamba and Mamba-2 (mamba.py): attention-free, a Mamba or Mamba-2 mixer behind a norm in every
    # layer and nothing else; Llama's reading only for what they share (embeddings, final norm, head).
    **{arch: Alias("LlamaForCausalLM", mamba.NAMES, defaults=mamba.DEFAULTS[arch], ignored=mamba.IGNORED,
                   rewrite=mamba.rewrite, fields=lambda raw, arch=arch: mamba.fields(raw, arch)) for arch in mamba.ARCHS},
}


def _partial_rotary_aside(raw: dict[str, Any], default: float) -> dict[str, Any]:
    """Its partial rotary factor (top level, or in rope_parameters as transformers 5 saves it) kept aside as
    ``partial_rotary_aside``: Llama, which it runs as, refuses one; its ``fields`` set it."""
    params = dict(raw.get("rope_parameters") or {})
    partial = raw.get("partial_rotary_factor") or params.pop("partial_rotary_factor", None) or default
    out = {k: v for k, v in raw.items() if k != "partial_rotary_factor"}
    if params:
        out["rope_parameters"] = params
    return {**out, "partial_rotary_aside": float(partial)}


def _lfm2(raw: dict[str, Any]) -> dict[str, Any]:
    """The MLP's width as transformers' LFM2 derives it: two thirds of block_ff_dim, times the multiplier, rounded up
    to block_multiple_of."""
    width = int(raw["intermediate_size"])
    if raw.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            step = int(raw.get("block_multiple_of", 256))
            width = step * ((int(multiplier * width) + step - 1) // step)
    return {**raw, "intermediate_size": width}


def _lfm2_moe_fields(raw: dict[str, Any]) -> dict[str, Any]:
    if not raw.get("use_expert_bias", True):
        raise ModelLoadError("config.json: use_expert_bias is false; LFM2-MoE is served with its routing bias only")
    dense = int(raw.get("num_dense_layers", 2))
    return {**short_conv_fields(raw), "architecture": "Lfm2MoeForCausalLM",
            "moe_layers": tuple(range(dense, int(raw["num_hidden_layers"]))), "moe_routing": "sigmoid",
            "router_fp32": False, "routed_scaling_factor": float(raw.get("routed_scaling_factor", 1.0)),
            "routing_norm_eps": 1e-6}


def _qwen3_next_fields(raw: dict[str, Any], grouped_projections: bool) -> dict[str, Any]:
    """Qwen3-Next's and Qwen3.5's: attention's output gated by rows of q_proj, q/k norms, norms scaling by 1 + w,
    RoPE over part of each head, and their Gated DeltaNet layers."""
    return {"attn_output_gate": "in_query", "qk_norm": True, "norm_unit_offset": True,
            "o_proj_bias": bool(raw.get("attention_bias")), "partial_rotary_factor": raw["partial_rotary_aside"],
            **linear_attention_fields(raw, grouped_projections)}


def _refuse_qk_layernorm(raw: dict[str, Any], who: str) -> dict[str, Any]:
    if raw.get("qk_layernorm"):
        raise ModelLoadError(f"config.json: qk_layernorm is set; per-head q/k LayerNorms ({who}) are not supported")
    return raw


def _phi(raw: dict[str, Any]) -> dict[str, Any]:
    return _partial_rotary_aside(_refuse_qk_layernorm(raw, "Phi"), 0.5)


def _windows_by_layer_types(raw: dict[str, Any], default: Callable[[int], str]) -> dict[str, Any]:
    """Windows as Qwen2 reads them (use_sliding_window, layer_types: ``default(i)`` for layer i where the config
    lists none and has a window), for a Llama-like architecture without biases."""
    window = raw.get("sliding_window") is not None
    types = raw.get("layer_types") or [default(i) if window else "full_attention"
                                       for i in range(int(raw["num_hidden_layers"]))]
    return {**raw, "use_sliding_window": window, "attention_bias": False, "layer_types": types}


def _cwm(raw: dict[str, Any]) -> dict[str, Any]:
    """transformers' llama3 RoPE where the config names none."""
    out = dict(raw)
    if not raw.get("rope_parameters") and not raw.get("rope_scaling") and raw.get("rope_theta") is None:
        out["rope_parameters"] = {"rope_theta": 1_000_000.0, "factor": 16.0, "high_freq_factor": 4.0,
                                  "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
                                  "rope_type": "llama3"}
    return out


_ATTENTION = ("attention", "full_attention")
_MAMBA = ("mamba", "linear_attention")  # as released, and as transformers 5 saves them


def _granite4(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types (Mamba-2 in every layer by default, as transformers reads it); without experts, Granite
    with the shared MLP's width."""
    types = raw.get("layer_types") or ["mamba"] * int(raw["num_hidden_layers"])
    others = sorted({t for t in types if t not in (*_ATTENTION, *_MAMBA)})
    if others or len(types) != int(raw["num_hidden_layers"]):
        raise ModelLoadError(f"config.json: layer_types must name each of the {raw['num_hidden_layers']} layers "
                             f"attention or mamba; got {', '.join(map(str, others)) or len(types)}")
    raw = {**raw, "layer_types": types}
    if raw.get("num_local_experts"):
        return raw
    return {**raw, "architectures": ["GraniteForCausalLM"], "intermediate_size": raw["shared_intermediate_size"]}


def _bamba(raw: dict[str, Any]) -> dict[str, Any]:
    """Its layer types from attn_layer_indices (Mamba-2 in the others), as transformers lists them; the partial
    rotary factor transformers fixes at 0.5 taken out of rope_parameters (Llama would refuse it)."""
    layers, attention = int(raw["num_hidden_layers"]), raw.get("attn_layer_indices") or []
    if not isinstance(attention, list) or not all(isinstance(i, int) and 0 <= i < layers for i in attention):
        raise ModelLoadError(f"config.json: attn_layer_indices must list layers of the {layers}, got {attention!r}")
    params = {k: v for k, v in (raw.get("rope_parameters") or {}).items() if k != "partial_rotary_factor"}
    return {**{k: v for k, v in raw.items() if k != "attn_layer_indices"}, "rope_parameters": params or None,
            "layer_types": [_ATTENTION[1] if i in attention else _MAMBA[1] for i in range(layers)]}


def _hyperclovax(raw: dict[str, Any]) -> dict[str, Any]:
    head_dim = raw.get("head_dim") or int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    if raw.get("attention_multiplier") is None:
        return {**raw, "attention_multiplier": head_dim**-0.5}
    return raw


def _mistral4(raw: dict[str, Any]) -> dict[str, Any]:
    """transformers' default RoPE where the config names none; the rotated share latent attention's own
    (qk_rope_head_dim), not a partial factor."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling")
    if not params:
        params = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0, "original_max_position_embeddings": 8192,
                  "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                  "llama_4_scaling_beta": 0.1}
    key = "rope_scaling" if raw.get("rope_scaling") and not raw.get("rope_parameters") else "rope_parameters"
    return {**raw, key: {k: v for k, v in params.items() if k not in ("partial_rotary_factor", "max_position_embeddings")}}


def _internlm3(raw: dict[str, Any]) -> dict[str, Any]:
    if bool(raw.get("attention_bias")) != bool(raw.get("mlp_bias")):
        raise ModelLoadError("config.json: InternLM3's qkv_bias and bias differ; transformers runs it as Llama, whose "
                             "attention_bias covers q, k, v and o alike, and refuses that too")
    return raw


_OLDER_NAMES = {"MiniCPM5MoEForCausalLM": "MiniCPM5MoeForCausalLM", "PhiMoEForCausalLM": "PhimoeForCausalLM",
                "MPTForCausalLM": "MptForCausalLM"}


def aliased(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``raw`` as transformers runs it: an aliased architecture's config read as its target's, and the
    ``ModelConfig`` fields the alias sets beyond it; others as given."""
    arch = (raw.get("architectures") or [None])[0]
    if arch in _OLDER_NAMES:  # names their checkpoints were released under (remote code), which transformers reads
        raw, arch = {**raw, "architectures": [_OLDER_NAMES[arch]]}, _OLDER_NAMES[arch]
    alias = ALIASES.get(arch)
    if alias is None:
        return raw, {}
    out = {alias.names.get(k, k): v for k, v in raw.items() if k not in alias.ignored}
    defaults = alias.defaults
    if out.get("rope_parameters"):  # transformers >= 5 names the base there
        defaults = {k: v for k, v in defaults.items() if k != "rope_theta"}
    out = {**defaults, **out, "architectures": [alias.target]}
    if alias.rewrite is not None:
        out = alias.rewrite(out)
    if alias.mlp_layers is not None:
        out["first_k_dense_replace"] = _dense_layers(out, alias.mlp_layers, arch)
    return out, alias.fields(out) if alias.fields else {}


def _sparse_attention(raw: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3.2's indexer (dsa.py): its keys widen the cached latent."""
    index_dim = int(raw["index_head_dim"])
    return {"architecture": "DeepseekV32ForCausalLM", "index_topk": int(raw["index_topk"]),
            "index_head_dim": index_dim, "index_n_heads": int(raw["index_n_heads"]),
            "head_dim": int(raw["kv_lora_rank"]) + int(raw["qk_rope_head_dim"]) + index_dim}


def _shared_indexers(raw: dict[str, Any]) -> tuple[int, ...]:
    """GLM-5's layers that reuse the last indexing layer's choice of keys, as transformers reads them:
    ``indexer_types`` ("full" or "shared" per layer), else ``index_topk_pattern`` ("F" / "S" per layer, or such a
    list), else every ``index_topk_freq``-th layer from ``index_skip_topk_offset`` - 1 indexes (all by default)."""
    layers = int(raw["num_hidden_layers"])
    types, pattern = raw.get("indexer_types"), raw.get("index_topk_pattern")
    if types is None and pattern is not None:
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern] if isinstance(pattern, str) else pattern
    if types is None:
        freq, offset = max(int(raw.get("index_topk_freq") or 1), 1), int(raw.get("index_skip_topk_offset", 2))
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or set(types) - {"full", "shared"}:
        raise ModelLoadError(f"config.json: indexer_types must name each of the {layers} layers full or shared, got "
                             f"{types!r}")
    return tuple(i for i, kind in enumerate(types) if kind == "shared")


def _minicpm3(raw: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM3's values as wide as hidden_size / heads where it leaves them out, its RoPE not interleaved."""
    width = raw.get("v_head_dim") or int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    return {**raw, "v_head_dim": width, "rope_interleave": False}


def _minicpm3_fields(raw: dict[str, Any]) -> dict[str, Any]:
    layers, hidden = int(raw["num_hidden_layers"]), int(raw["hidden_size"])
    depth = raw.get("scale_depth", 1.4)
    depth = math.sqrt(layers) if depth is None else float(depth)
    base = raw.get("dim_model_base", 256)
    return {"architecture": "MiniCPM3ForCausalLM", "embed_scale": float(raw.get("scale_emb", 12)),
            "embed_scale_rounded": True, "residual_scale": depth / math.sqrt(layers),
            "logits_divisor": hidden / (hidden if base is None else int(base))}


def _kolibri1(raw: dict[str, Any]) -> dict[str, Any]:
    """Kolibri-1's layers as its transformers config lays them out (full attention in every fifth, the rest
    sliding), all routed; its experts' width as the target's intermediate_size (no dense layer reads it)."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
                                       for i in range(layers)]
    return {**raw, "layer_types": types, "mlp_layer_types": ["sparse"] * layers,
            "intermediate_size": raw["moe_intermediate_size"]}


def _axk1(raw: dict[str, Any]) -> dict[str, Any]:
    """A.X K1's layer layout as its transformers config derives it from the legacy fields: routed from
    first_k_dense_replace on, every moe_layer_freq-th (only 1 is served: its dense layers first)."""
    if raw.get("mlp_layer_types") is None and int(raw.get("moe_layer_freq") or 1) != 1:
        raise ModelLoadError(f"config.json: moe_layer_freq {raw['moe_layer_freq']}; A.X K1 is served with its dense "
                             "layers first, every later layer routed (moe_layer_freq 1)")
    return {k: v for k, v in raw.items() if k != "moe_layer_freq"}


def _dense_layers(raw: dict[str, Any], layout: str, arch: str) -> int:
    """How many leading layers keep a dense MLP (the rest route), from ``mlp_layer_types`` as transformers
    defaults it (layer 0 dense), or all of them."""
    layers = int(raw["num_hidden_layers"])
    if layout == "dense":
        return layers
    dense = raw.pop("first_k_dense_replace", None)  # MiniCPM5's default layout (transformers reads it there)
    types = raw.pop("mlp_layer_types", None) or ["dense"] * (1 if dense is None else int(dense)) + ["sparse"] * (
        layers - (1 if dense is None else int(dense)))
    dense = next((i for i, t in enumerate(types) if t != "dense"), len(types)) if isinstance(types, list) else 0
    if not isinstance(types, list) or len(types) != layers or any(t != "sparse" for t in types[dense:]):
        raise ModelLoadError(f"config.json: {arch}'s mlp_layer_types must list 'dense' or 'sparse' for each of its "
                             f"{layers} layers, the dense ones first; got {types!r}")
    return dense
