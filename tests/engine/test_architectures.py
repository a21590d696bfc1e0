"""Every supported architecture against Hugging Face ``transformers`` on the same (random) weights: checkpoints
written by transformers itself, greedy tokens and logprobs through the engine with small prompt chunks, with
the fused CPU kernels and with plain torch ops."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import weakref

import pytest
import torch
from safetensors.torch import save_file

from seawall.offline.engine import OfflineEngine
from services.common.errors import InvalidArgument, ModelLoadError
from services.common.sampling_params import SamplingParams
from services.common.step import LoraRef
from services.engine.checkpoint_report import report
from services.engine.config import EngineConfig
from services.engine.loader import iter_weights
from services.engine.model_config import ModelConfig
from services.scheduler.core.scheduler import SchedulerConfig
from tests.lora_adapters import make_adapter, peft_greedy

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

transformers = pytest.importorskip("transformers")

COMMON = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
FALCON_H1_MULTIPLIERS = dict(
    embedding_multiplier=5.656854249492381, lm_head_multiplier=0.0390625, key_multiplier=0.39062499999999994,
    attention_in_multiplier=1.1, attention_out_multiplier=0.9375, ssm_in_multiplier=1.25,
    ssm_out_multiplier=0.23570226039551587, mlp_multipliers=[0.8838834764831844, 0.5859375],
    ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738])
_FALCON = {k: v for k, v in COMMON.items() if k not in ("num_key_value_heads", "intermediate_size")}
_ABSOLUTE = {k: v for k, v in COMMON.items() if k not in ("num_key_value_heads", "intermediate_size")}
_BLOOM = dict(n_embed=64, n_layer=3, n_head=4, vocab_size=4096, bos_token_id=1, eos_token_id=2)
_MPT = dict(d_model=64, n_layers=3, n_heads=4, max_seq_len=512, vocab_size=4096, bos_token_id=1, eos_token_id=2)
_ZAMBA2 = {k: v for k, v in COMMON.items() if k not in ("num_key_value_heads", "num_hidden_layers")}
_NO_LAYERS = {k: v for k, v in COMMON.items() if k != "num_hidden_layers"}
_GPT2_SHAPE = dict(n_embd=64, n_layer=3, n_head=4, n_positions=512, vocab_size=4096, bos_token_id=1, eos_token_id=2)
CASES = {
    "llama": lambda: transformers.LlamaConfig(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 128}, **COMMON),
    # Sliding-window attention in every layer, a window shorter than most prompts and not a block multiple.
    "mistral": lambda: transformers.MistralConfig(sliding_window=24, **COMMON),
    "qwen2": lambda: transformers.Qwen2Config(tie_word_embeddings=False, **COMMON),  # biases on q/k/v
    # YaRN scaling (Qwen2.5 / Qwen3 past 32K): frequencies by parts, cos and sin scaled.
    "qwen2-yarn": lambda: transformers.Qwen2Config(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}, **COMMON),
    # Norms on q and k heads; head_dim * heads (128) differs from hidden_size; tied embeddings; sliding and
    # full attention layers mixed.
    "qwen3": lambda: transformers.Qwen3Config(
        head_dim=32, tie_word_embeddings=True, use_sliding_window=True, sliding_window=37,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], **COMMON),
    # Gemma 2: soft-capped attention scores (a cap low enough to change them) and final logits, every other
    # layer sliding.
    "gemma2": lambda: transformers.Gemma2Config(
        head_dim=32, query_pre_attn_scalar=24, sliding_window=24, attn_logit_softcapping=4.0,
        final_logit_softcapping=3.0, **COMMON),
    # GLM-4-9B (GlmForCausalLM): GLM-4's partial interleaved RoPE, q/k/v biases and fused gate/up, no sandwich norms.
    "glm": lambda: transformers.GlmConfig(**{**COMMON, "pad_token_id": 0}),
    # Helium: Llama with interleaved RoPE, biases on q/k/v only.
    "helium": lambda: transformers.HeliumConfig(attention_bias=True, head_dim=16, **COMMON),
    # Llama with mlp_bias: biases on gate, up and down (gate/up fused here, their biases too).
    "llama-mlp-bias": lambda: transformers.LlamaConfig(mlp_bias=True, **COMMON),
    # StarCoder2: biases everywhere, LayerNorms with biases, an ungated GELU MLP, a window in every layer.
    "starcoder2": lambda: transformers.Starcoder2Config(sliding_window=24, **COMMON),
    # StableLM: LayerNorms with biases, RoPE over a quarter of each head, q/k/v biases; and with attention and
    # MLP side by side on one norm (use_parallel_residual).
    "stablelm": lambda: transformers.StableLmConfig(use_qkv_bias=True, **COMMON),
    "stablelm-parallel": lambda: transformers.StableLmConfig(use_parallel_residual=True, partial_rotary_factor=0.5,
                                                             **COMMON),
    # GPT-NeoX (Pythia): attention and an ungated exact-GELU MLP side by side, each on a biased LayerNorm of its
    # own, one query_key_value laid out per head, RoPE over a quarter of each head; and as a pre-norm block.
    "gpt-neox": lambda: transformers.GPTNeoXConfig(**{k: v for k, v in COMMON.items() if k != "num_key_value_heads"}),
    "gpt-neox-sequential": lambda: transformers.GPTNeoXConfig(
        use_parallel_residual=False, rotary_pct=0.5, **{k: v for k, v in COMMON.items() if k != "num_key_value_heads"}),
    # Persimmon: GPT-NeoX's pre-norm block of squared ReLUs, each head of q and k through a biased LayerNorm.
    # Beam: sandwich norms joined by depth-scaled adds, a sliding layer that rotates around a full one that does not
    # (its queries scaled by position), gated attention with a bias per head, GLM-4.5's grouped sigmoid routing
    # after a dense layer, soft-capped logits.
    "beam": lambda: transformers.BeamConfig(
        head_dim=16, sliding_window=24, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, mlp_layer_types=["dense", "sparse", "sparse"],
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], **COMMON),
    # Cohere's Compass: Cohere 2's parallel block, a full layer between sliding ones, each type rotating halves
    # (not Cohere's pairs) at a base of its own, scaled logits.
    "cohere-compass": lambda: transformers.CohereCompassTextConfig(
        sliding_window=24, logit_scale=0.5, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 50000.0}}, **{**COMMON, "pad_token_id": 0}),
    # Aria's language model: experts by the softmax of the top-2 logits beside an ungated shared MLP two experts
    # wide, its experts stacked [experts, in, out] (transposed as they load).
    "aria-text": lambda: transformers.AriaTextConfig(moe_num_experts=4, moe_topk=2, moe_num_shared_experts=2,
                                                     **{**COMMON, "intermediate_size": 32}),
    # Apertus 1.5's language model: Apertus with its output head pruned to the first 3000 tokens (the others,
    # image and audio codes, are inputs only).
    "apertus1.5": lambda: transformers.Apertus1p5TextConfig(output_vocab_size=3000, **COMMON),
    # OLMo Hybrid: OLMo 2's post-norm attention (the last layer) after pre-norm Gated DeltaNet layers of separate
    # q/k/v/g/a/b projections, beta doubled, 12-wide keys and 24-wide values.
    "olmo-hybrid": lambda: transformers.OlmoHybridConfig(pad_token_id=0, **COMMON),
    # GPT-NeoX Japanese: GPT-NeoX's pre-norm block without biases but the last layer's attention output's, RoPE over
    # half of each head here, tied embeddings.
    "gpt-neox-japanese": lambda: transformers.GPTNeoXJapaneseConfig(
        rotary_pct=0.5, intermediate_multiple_size=2, **{k: v for k, v in COMMON.items()
                                                        if k not in ("num_key_value_heads", "intermediate_size")}),
    # BitNet b1.58: squared ReLUs, RMSNorms before o_proj and down_proj (its unpacked bf16 weights' form).
    "bitnet": lambda: transformers.BitNetConfig(**COMMON),
    "persimmon": lambda: transformers.PersimmonConfig(**{k: v for k, v in COMMON.items() if k != "num_key_value_heads"}),
    # Falcon: attention and an ungated GELU MLP side by side, their fused query_key_value laid out by architecture:
    # the new one's (40B, 180B: grouped per key/value head, a norm each), Falcon-7B's (multi-query, one norm),
    # per head (neither); and a pre-norm block with biases.
    "falcon-new": lambda: transformers.FalconConfig(new_decoder_architecture=True, num_kv_heads=2, **_FALCON),
    "falcon2": lambda: transformers.FalconConfig(new_decoder_architecture=True, num_kv_heads=2,  # Falcon 2 11B
                                                 num_ln_in_parallel_attn=1, **_FALCON),
    "falcon-7b": lambda: transformers.FalconConfig(tie_word_embeddings=False, **_FALCON),
    "falcon-per-head": lambda: transformers.FalconConfig(multi_query=False, ffn_hidden_size=96, **_FALCON),
    "falcon-sequential": lambda: transformers.FalconConfig(parallel_attn=False, multi_query=False, bias=True,
                                                           **_FALCON),
    # Falcon-RW: ALiBi instead of RoPE, as transformers computes it (bf16-rounded, by absolute key position); 6
    # heads take Falcon's extra slopes.
    "falcon-rw": lambda: transformers.FalconConfig(alibi=True, parallel_attn=False, multi_query=False, bias=True,
                                                   **_FALCON),
    "falcon-rw-6-heads": lambda: transformers.FalconConfig(
        alibi=True, parallel_attn=False, multi_query=False, bias=True,
        **{**_FALCON, "hidden_size": 96, "num_attention_heads": 6}),
    # OPT and GPT-2: learned absolute positions (OPT's from index 2), biased LayerNorms and projections, ungated MLPs
    # (ReLU; gelu_new), GPT-2's Conv1D weights stored [in, out] and q/k/v in one c_attn; GPT-2 unscaled too.
    "opt": lambda: transformers.OPTConfig(ffn_dim=128, **_ABSOLUTE),
    "gpt2": lambda: transformers.GPT2Config(**_GPT2_SHAPE),
    "gpt2-unscaled": lambda: transformers.GPT2Config(n_inner=96, scale_attn_weights=False, **_GPT2_SHAPE),
    # BioGPT: OPT's block under its own names, GELU, embeddings scaled by sqrt(hidden_size), LayerNorm eps 1e-12.
    "biogpt": lambda: transformers.BioGptConfig(**{**COMMON, "pad_token_id": 0}),
    # XGLM: OPT's block under its own names, GELU, scaled embeddings, sinusoidal positions (the padding row zeroed
    # is position 1's here: pad_token_id 3).
    "xglm": lambda: transformers.XGLMConfig(d_model=64, ffn_dim=128, num_layers=3, attention_heads=4, vocab_size=4096,
                                            max_position_embeddings=512, pad_token_id=3, bos_token_id=1, eos_token_id=2),
    # GPT-Neo: GPT-2's block (plain Linear projections, q/k/v without biases) with unscaled scores, global and local
    # layers alternating (a window shorter than most prompts).
    "gpt-neo": lambda: transformers.GPTNeoConfig(
        hidden_size=64, num_layers=4, num_heads=4, attention_types=[[["global", "local"], 2]], window_size=24,
        vocab_size=4096, max_position_embeddings=512, bos_token_id=1, eos_token_id=2),
    # GPTBigCode (StarCoder): GPT-2's block with multi-query attention (one key/value head at the end of c_attn),
    # and without (per head); GPT-J: interleaved RoPE over part of each head (and all of it), attention and MLP in
    # parallel on one norm, an output head with a bias.
    "gpt-bigcode": lambda: transformers.GPTBigCodeConfig(**_GPT2_SHAPE),
    "gpt-bigcode-mha": lambda: transformers.GPTBigCodeConfig(multi_query=False, n_inner=96, **_GPT2_SHAPE),
    "gptj": lambda: transformers.GPTJConfig(rotary_dim=8, **_GPT2_SHAPE),
    # CodeGen: GPT-J with q, k and v in one projection by model-parallel shard ([q | v | k] each; 2 heads a shard).
    "codegen": lambda: transformers.CodeGenConfig(rotary_dim=4, **{**_GPT2_SHAPE, "n_head": 8}),
    # BLOOM and MPT: ALiBi instead of RoPE (four heads: slopes of the power-of-two series; six: with BLOOM's
    # extra ones in between), LayerNorms and ungated GELU MLPs; BLOOM's embeddings normed and everything biased,
    # its query_key_value per head; MPT without biases, its Wqkv [q | k | v], clamped and rescaled as configured.
    "bloom": lambda: transformers.BloomConfig(**_BLOOM),
    "bloom-6-heads": lambda: transformers.BloomConfig(**{**_BLOOM, "n_embed": 96, "n_head": 6}),
    "mpt": lambda: transformers.MptConfig(**_MPT),
    "mpt-6-heads-clipped": lambda: transformers.MptConfig(**{**_MPT, "d_model": 96, "n_heads": 6}, attn_config={
        "clip_qkv": 2.0, "softmax_scale": 0.2}),
    "gptj-full-rotary": lambda: transformers.GPTJConfig(rotary_dim=16, n_inner=96, **_GPT2_SHAPE),
    # Phi-2: attention and an ungated GELU MLP side by side on one biased LayerNorm, biases everywhere (the
    # output head's too), RoPE over 40% of each head.
    "phi": lambda: transformers.PhiConfig(partial_rotary_factor=0.4, head_dim=20, **{**COMMON, "hidden_size": 80}),
    # Granite 4.0 with attention only: dense (granite-4.0-micro: RoPE, its MLP as shared_mlp), and with experts
    # beside the shared MLP and no RoPE (position_embedding_type unset).
    "granite4": lambda: transformers.GraniteMoeHybridConfig(
        layer_types=["attention"] * 3, num_local_experts=0, shared_intermediate_size=96, position_embedding_type="rope",
        embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0, **COMMON),
    # Granite 4.0-H: Mamba-2 layers (8 heads of 16 in 2 groups, a 16-wide state, blocks of 32 tokens so prompts
    # span several) around one attention layer without positions; dense (-H-Micro) and with experts (-H-Tiny).
    "granite4-h": lambda: transformers.GraniteMoeHybridConfig(
        layer_types=["mamba", "attention", "mamba"], num_local_experts=0, shared_intermediate_size=96,
        mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=32, embedding_multiplier=4.0,
        residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0, **COMMON),
    "granite4-h-moe": lambda: transformers.GraniteMoeHybridConfig(
        layer_types=["mamba", "mamba", "attention"], num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=96, mamba_n_heads=4, mamba_d_state=8, mamba_chunk_size=16, mamba_proj_bias=True,
        embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0, **COMMON),
    "granite4-moe-nope": lambda: transformers.GraniteMoeHybridConfig(
        layer_types=["attention"] * 3, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=96,
        embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0, **COMMON),
    # Phi-3.5-MoE: sparse-mixer routing (a margin wide enough to matter on these logits), LayerNorms with biases,
    # biases on attention and the head, LongRoPE with its own attention scales (short ones: prompts within the
    # pretrained context).
    "phimoe": lambda: transformers.PhimoeConfig(
        num_local_experts=4, router_jitter_noise=0.3, attention_bias=True, lm_head_bias=True,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + i / 8 for i in range(8)],
                         "long_factor": [2.0 + i for i in range(8)], "short_mscale": 1.1, "long_mscale": 1.3,
                         "original_max_position_embeddings": 512},
        **{**COMMON, "pad_token_id": 0}),
    # IQuest-Coder (transformers' Llama), Jais 2 (LayerNorms, an ungated ReLU² MLP, biases everywhere), VaultGemma
    # (Gemma 2 without post-norms), CWM (windows in all but every fourth layer, llama3 RoPE).
    "iquestcoder": lambda: transformers.IQuestCoderConfig(head_dim=16, **COMMON),
    "jais2": lambda: transformers.Jais2Config(**COMMON),
    "vaultgemma": lambda: transformers.VaultGemmaConfig(head_dim=32, query_pre_attn_scalar=24, sliding_window=24,
                                                        **COMMON),
    "cwm": lambda: transformers.CwmConfig(sliding_window=24, head_dim=16, num_hidden_layers=5, **{
        k: v for k, v in COMMON.items() if k != "num_hidden_layers"}),
    # Nemotron: LayerNorm1P (weights stored less one) with biases, an ungated ReLU² MLP, RoPE over half of each head,
    # biases on attention and the MLP.
    "nemotron": lambda: transformers.NemotronConfig(head_dim=16, attention_bias=True, mlp_bias=True, **COMMON),
    # OLMo (1): LayerNorms without weights, q/k/v clamped (a bound these weights' projections cross).
    "olmo": lambda: transformers.OlmoConfig(clip_qkv=2.0, **COMMON),
    # HyperCLOVA X: Granite's multipliers (logits multiplied), with peri-layer norms and without.
    "hyperclovax": lambda: transformers.HyperCLOVAXConfig(
        embedding_multiplier=4.0, residual_multiplier=0.5, logits_scaling=2.0, **COMMON),
    "hyperclovax-no-post-norm": lambda: transformers.HyperCLOVAXConfig(
        use_post_norm=False, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=0.5, **COMMON),
    # Ministral (2410): Qwen2 without biases, windows where layer_types says.
    "ministral": lambda: transformers.MinistralConfig(  # (its attention needs head_dim set)
        sliding_window=24, layer_types=["sliding_attention", "full_attention", "sliding_attention"], head_dim=16,
        **COMMON),
    # Mistral 4: latent attention with the query scaled by position (a period these prompts cross), softmax
    # routing within groups, scaled.
    "mistral4": lambda: transformers.Mistral4Config(
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=32, routed_scaling_factor=1.5,
        first_k_dense_replace=1, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.5},
        **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # FlexOlmo: OLMoE's experts (top 5 of 7 here, not renormalized) under OLMo 2's post-norms.
    "flex-olmo": lambda: transformers.FlexOlmoConfig(num_experts=7, num_experts_per_tok=5, **{**COMMON, "pad_token_id": 0}),
    # Solar Open: GLM-4.5's sigmoid routing with a correction bias in every layer, Llama's attention.
    "solar-open": lambda: transformers.SolarOpenConfig(
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, head_dim=16,
        n_group=2, topk_group=1, routed_scaling_factor=1.5,
        **{k: v for k, v in COMMON.items() if k != "intermediate_size"}),
    # Gemma (1): Gemma 2's decoder less its sandwich norms, soft-caps and windows; a legacy "gelu" read as tanh's.
    "gemma": lambda: transformers.GemmaConfig(head_dim=24, hidden_act="gelu", **COMMON),
    # Gemma 3's text model: (1 + w) norms on sublayer inputs and outputs, GELU gating, scaled embeddings, a
    # query scale that is not head_dim's, sliding layers with a RoPE base of their own.
    # q/k/v and gate/up stored fused; a window in every layer.
    "phi3": lambda: transformers.Phi3Config(sliding_window=32, **{**COMMON, "pad_token_id": 0}),
    # Phi-4-mini's shape: RoPE over the first 3/4 of each head, LongRoPE factors (the long ones: the context
    # served, 512, exceeds the pretrained one, and every prompt here does too, as transformers then uses them).
    "phi4-mini": lambda: phi4_mini_config(),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        head_dim=32, query_pre_attn_scalar=24, sliding_window=24, sliding_window_pattern=2, **COMMON),
    # SmolLM3: a layer without RoPE (NoPE), which with use_sliding_window also attends within a window.
    "smollm3": lambda: transformers.SmolLM3Config(
        no_rope_layers=[1, 0, 1], use_sliding_window=True, sliding_window=24, **{**COMMON, "pad_token_id": 0}),
    # Granite: scaled embeddings, a score scale of its own, sublayer outputs scaled before the residual add,
    # logits divided.
    "granite": lambda: transformers.GraniteConfig(
        embedding_multiplier=12.0, attention_multiplier=0.1, residual_multiplier=0.22, logits_scaling=8.0,
        **{**COMMON, "pad_token_id": 0}),
    # Granite 3 MoE: Granite's multipliers, 2 of 4 experts by the softmax of the top-2 logits (stored stacked);
    # the Shared variant adds an ungated shared MLP.
    "granitemoe": lambda: transformers.GraniteMoeConfig(
        num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=12.0, attention_multiplier=0.1,
        residual_multiplier=0.22, logits_scaling=8.0, **{**COMMON, "intermediate_size": 32, "pad_token_id": 0}),
    "granitemoe-shared": lambda: transformers.GraniteMoeSharedConfig(
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48, embedding_multiplier=12.0,
        attention_multiplier=0.1, residual_multiplier=0.22, logits_scaling=8.0,
        **{**COMMON, "intermediate_size": 32, "pad_token_id": 0}),
    # Arcee (AFM): Llama with an MLP without a gate, its activation relu(x)².
    "arcee": lambda: transformers.ArceeConfig(**{**COMMON, "pad_token_id": 0}),
    # Seed-OSS: Llama with biases on q/k/v by default, and here on o (attention_out_bias).
    "seed-oss": lambda: transformers.SeedOssConfig(attention_out_bias=True, **{**COMMON, "pad_token_id": 0}),
    # Llama with attention_bias: biases on q, k, v and o.
    "llama-attention-bias": lambda: transformers.LlamaConfig(attention_bias=True, **COMMON),
    # OLMo 2: no norms on sublayer inputs, norms on their outputs, q and k normed over whole projections.
    "olmo2": lambda: transformers.Olmo2Config(**{**COMMON, "pad_token_id": 0}),
    # OLMo 3: OLMo 2 with three of every four layers sliding, YaRN on the full layers only.
    "olmo3": lambda: transformers.Olmo3Config(
        sliding_window=24, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
        **{**COMMON, "num_hidden_layers": 4, "pad_token_id": 0}),
    # OLMoE: OLMo's q/k norms, pre-norms, 2 of 8 experts as wide as intermediate_size, not renormalized.
    "olmoe": lambda: transformers.OlmoeConfig(num_experts=8, num_experts_per_tok=2, **{**COMMON, "pad_token_id": 0}),
    # EXAONE 4: norms on sublayer outputs only, per-head q/k norms, local layers with RoPE and a window, the
    # global one (every third here) without RoPE.
    "exaone4": lambda: transformers.Exaone4Config(sliding_window=24, sliding_window_pattern=3,
                                                  **{**COMMON, "pad_token_id": 0}),
    # Mixtral: every layer routes each token to 2 of 4 experts, their probabilities renormalized.
    "mixtral": lambda: transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **COMMON),
    # Qwen2-MoE: a sigmoid-gated shared expert beside 3 of 8 routed ones (not renormalized), q/k/v biases,
    # layer 1 dense.
    "qwen2-moe": lambda: transformers.Qwen2MoeConfig(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        mlp_only_layers=[1], **COMMON),
    # GPT-OSS: a sink logit per head in each softmax (large enough to matter, see save_checkpoint), biases on
    # every attention projection, sliding and full layers alternating, YaRN; 2 of 4 experts by the softmax of
    # the top-2 logits of a router with a bias, experts with biases and a SwiGLU clamped low enough to clip.
    "gpt-oss": lambda: transformers.GptOssConfig(
        head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=24,
        swiglu_limit=2.0, **{**COMMON, "intermediate_size": 32, "pad_token_id": 0}),
    # GLM-4 (0414, Z1): norms on each sublayer's input and output (named for where they sit), q/k/v biases,
    # RoPE over the first half of each head in interleaved pairs, gate/up stored fused.
    "glm4": lambda: transformers.Glm4Config(head_dim=16, **{**COMMON, "pad_token_id": 0}),
    # GLM-4.5: DeepSeek-V3's routing (sigmoid scores, a correction bias, the best 2 of 4 groups, renormalized and
    # scaled), an ungated shared expert, layer 0 dense, q/k norms and biases, RoPE over half of each head.
    "glm4-moe": lambda: transformers.Glm4MoeConfig(
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, n_shared_experts=2, n_group=4,
        topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True,
        **{**COMMON, "pad_token_id": 0}),
    # dots.llm1: the same routing (1 of 2 groups), Qwen3's per-head q/k norms, no biases, whole-head RoPE.
    "dots1": lambda: transformers.Dots1Config(
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, n_shared_experts=1, n_group=2,
        topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=1.5,
        **{**COMMON, "pad_token_id": 0}),
    # MiniMax-M2: sigmoid routing with a correction bias (its router in the model's dtype), q and k normed over
    # their whole projections, RoPE over half of each head (its legacy rotary_dim).
    "minimax-m2": lambda: transformers.MiniMaxM2Config(
        num_local_experts=8, num_experts_per_tok=2, rotary_dim=8, head_dim=16,
        **{**COMMON, "intermediate_size": 32, "pad_token_id": 0}),
    # DeepSeek-V3: latent attention (queries through a rank-24 bottleneck, a 32-feature latent and 8 rotated
    # features in interleaved pairs, values narrower than keys), YaRN with mscale_all_dim (which scales the
    # scores too), the routing above.
    "deepseek-v3": lambda: transformers.DeepseekV3Config(
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, moe_intermediate_size=32,
        n_shared_experts=1, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                             "original_max_position_embeddings": 128, "mscale": 1.0,
                                             "mscale_all_dim": 1.0},
        **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # MiniCPM3: DeepSeek-V2's latent attention (RoPE not interleaved) over dense MLPs, with MiniCPM's µP scales of
    # the embeddings, each sublayer's output and the final hidden states.
    "minicpm3": lambda: transformers.MiniCPM3Config(
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, scale_emb=3.0,
        scale_depth=1.2, dim_model_base=32, **{**COMMON, "num_key_value_heads": 4}),
    # A.X K1: DeepSeek-V3 whose MoE blocks' output is RMS-normed (stored on the layer), a dense first layer.
    "axk1": lambda: transformers.AXK1Config(
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=32, n_shared_experts=1,
        routed_scaling_factor=1.5, **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # DeepSeek-V3.2: each query attends only the 12 keys its indexer (8 heads) ranks highest, fewer than most
    # prompts' keys.
    "deepseek-v3.2": lambda: transformers.DeepseekV32Config(
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, moe_intermediate_size=32,
        index_topk=12, index_head_dim=16, index_n_heads=8, **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # GLM-5: DeepSeek-V3.2 with the indexer's RoPE over interleaved pairs, the middle layer reusing the first's
    # choice of keys.
    "glm-moe-dsa": lambda: transformers.GlmMoeDsaConfig(
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=2, first_k_dense_replace=1, moe_intermediate_size=32, index_topk=12, index_head_dim=16,
        index_n_heads=8, indexer_types=["full", "shared", "full"],
        **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # A.X K2: DeepSeek-V3.2 with each head's output gated by its own rows of q_b_proj, self-gated norms (the MLP's on
    # its routed layers), experts in 2 groups scored 0 outside the chosen one.
    "axk2": lambda: transformers.AXK2Config(
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=32, index_topk=12, index_head_dim=16,
        index_n_heads=8, gated_norm_rank=4, **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # DeepSeek-V2-Lite's attention shape: one query projection, no bottleneck; rotated features not interleaved.
    "deepseek-v3-no-q-lora": lambda: transformers.DeepseekV3Config(
        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
        moe_intermediate_size=32, rope_interleave=False, **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # GLM-4.7-Flash: DeepSeek-V3's latent attention and routing (served as it), its MLP layers listed by type.
    "glm4-moe-lite": lambda: transformers.Glm4MoeLiteConfig(
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=32, n_shared_experts=1,
        routed_scaling_factor=1.8, mlp_layer_types=["dense", "dense", "sparse"],
        **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # Youtu-LLM: the same latent attention over dense MLPs, tied embeddings.
    "youtu": lambda: transformers.YoutuConfig(
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
        **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # DeepSeek-V2: V2-Lite's attention (no query bottleneck) and YaRN; V2's routing (softmax scores of an fp32
    # router, the top 2 within the best group by its best score, scaled, not renormalized), two shared experts.
    "deepseek-v2": lambda: transformers.DeepseekV2Config(
        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, topk_method="group_limited_greedy",
        routed_scaling_factor=1.5, first_k_dense_replace=1, moe_intermediate_size=32, n_shared_experts=2,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "original_max_position_embeddings": 128},
        **{**COMMON, "num_key_value_heads": 4, "pad_token_id": 0}),
    # Cohere (Command R): LayerNorms, attention and MLP in parallel on one norm, RoPE in interleaved pairs,
    # scaled logits, tied embeddings; Command R+'s q/k LayerNorms, a weight per head (rows reordered with
    # RoPE's); Cohere 2 (Command R7B, A): three of every four layers sliding with RoPE, the fourth without.
    "cohere": lambda: transformers.CohereConfig(logit_scale=0.3, **{**COMMON, "pad_token_id": 0}),
    "cohere-qk-norm": lambda: transformers.CohereConfig(use_qk_norm=True, logit_scale=0.3, tie_word_embeddings=False,
                                                        **{**COMMON, "pad_token_id": 0}),
    "cohere2": lambda: transformers.Cohere2Config(sliding_window=24, logit_scale=0.3,
                                                  **{**COMMON, "num_hidden_layers": 4, "pad_token_id": 0}),
    # Command A MoE: Cohere 2's block; two dense layers of their own width, full attention rotating anyway; then
    # experts by the softmax of the top 2 logits, the shared MLP averaged in; three of four routed layers sliding.
    "cohere2-moe": lambda: transformers.Cohere2MoeConfig(
        sliding_window=24, logit_scale=0.3, head_dim=16, prefix_dense_intermediate_size=96,
        first_k_dense_replace=2, num_experts=4, num_shared_experts=1, num_hidden_layers=6,
        **{**_NO_LAYERS, "intermediate_size": 48, "pad_token_id": 0}),
    # Its sigmoid routing renormalized, two experts' worth of shared MLP added, RMSNorms, a dense layer sliding
    # (a window pattern of 2 for the prefix: without RoPE where full).
    "cohere2-moe-sigmoid": lambda: transformers.Cohere2MoeConfig(
        sliding_window=24, logit_scale=0.3, head_dim=16, expert_selection_fn="sigmoid", rms_norm_eps=1e-6,
        shared_expert_combination_strategy="sum", num_shared_experts=2, first_k_dense_replace=2,
        prefix_dense_sliding_window_pattern=2, sliding_window_pattern=2, num_experts=4, num_hidden_layers=4,
        **{**_NO_LAYERS, "intermediate_size": 48, "pad_token_id": 0}),
    # Apertus: an ungated MLP whose xIELU activation has learned slopes per layer, Qwen3's q/k norms, norms named
    # for what they feed, transformers' default RoPE (llama3 scaling, a 12M base).
    "apertus": lambda: transformers.ApertusConfig(**{**COMMON, "pad_token_id": 0}),
    # Ministral 3 (and Devstral Small 2): Mistral with YaRN (mscale, mscale_all_dim) and each query scaled by
    # 1 + beta * log(1 + floor(p / 32)) (its "llama 4 scaling"; a period shorter than most prompts here).
    "ministral3": lambda: transformers.Ministral3Config(
        head_dim=16, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
                                      "original_max_position_embeddings": 32, "max_position_embeddings": 512,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                      "llama_4_scaling_beta": 0.5}, **{**COMMON, "pad_token_id": 0}),
    # ERNIE 4.5: Llama with RoPE in interleaved pairs, tied embeddings; its MoE: experts chosen by softmax
    # probability plus a correction bias (enough to change the choice, see save_checkpoint), weighed by the
    # probability, renormalized, beside a shared expert; layer 0 dense.
    "ernie4_5": lambda: transformers.Ernie4_5Config(head_dim=16, **{**COMMON, "pad_token_id": 0}),
    # use_bias: a bias on every projection, attention's and the MLP's.
    "ernie4_5-bias": lambda: transformers.Ernie4_5Config(head_dim=16, use_bias=True, **{**COMMON, "pad_token_id": 0}),
    "ernie4_5-moe": lambda: transformers.Ernie4_5_MoeConfig(
        moe_num_experts=8, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=1, moe_layer_start_index=1,
        **{**COMMON, "pad_token_id": 0}),
    # Llama 4: RoPE (interleaved pairs, llama3 scaling) and chunked attention (chunks of 24 positions) in layers 0
    # and 2, each q and k L2-normed after it; no RoPE in layers 1 and 3, full attention, queries scaled up with
    # position (every 16 here); MoE in every other layer, the chosen logits' sigmoids scaling the experts'
    # inputs, beside a shared expert; dense layers wider.
    "llama4": lambda: transformers.Llama4TextConfig(
        head_dim=16, no_rope_layers=[1, 0, 1, 0], attention_chunk_size=24, floor_scale=16, attn_scale=0.5,
        interleave_moe_layer_step=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size_mlp=96,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 128},
        **{**COMMON, "num_hidden_layers": 4, "intermediate_size": 32, "pad_token_id": 0}),
    # AFMoE (Arcee Trinity): attention's output gated, per-head q/k norms, sandwich norms, three sliding layers with
    # RoPE to one global without, embeddings scaled (muP); from layer 1, sigmoid routing with a correction bias
    # (expert_bias), renormalized and scaled, beside a shared MLP of two experts' width.
    "afmoe": lambda: transformers.AfmoeConfig(
        head_dim=16, sliding_window=24, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        num_shared_experts=2, route_scale=2.5, mup_enabled=True,
        **{**COMMON, "num_hidden_layers": 4, "pad_token_id": 0}),
    # MiniCPM5-MoE: GLM-4.5's routing (served as it) and attention's output gated, the gate stored beside each query
    # head (in q_proj), biases on q/gate, k, v and o; two dense layers.
    "minicpm5-moe": lambda: transformers.MiniCPM5MoeConfig(
        head_dim=16, n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1, moe_intermediate_size=32,
        n_shared_experts=2, routed_scaling_factor=2.5, attention_bias=True, mlp_layer_types=["dense", "dense", "sparse"],
        **{**COMMON, "pad_token_id": 0}),
    # K-EXAONE: EXAONE 4's attention (per-head q/k norms, local layers with RoPE, every third global without) with
    # pre-norms; DeepSeek-V3's routing (2 groups), a shared expert, layer 0 dense.
    "exaone-moe": lambda: transformers.ExaoneMoeConfig(
        sliding_window=24, sliding_window_pattern=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        n_group=2, topk_group=1, num_shared_experts=1, **{**COMMON, "pad_token_id": 0}),
    # Hunyuan: per-head q/k norms after RoPE, NTK-alpha RoPE (a base stretched by alpha); its MoE: softmax routing
    # in every layer, renormalized, beside a shared MLP as wide as the experts.
    "hunyuan-dense": lambda: transformers.HunYuanDenseV1Config(
        head_dim=16, rope_parameters={"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0, "rope_theta": 10000.0},
        **{**COMMON, "pad_token_id": 0}),
    "hunyuan-moe": lambda: transformers.HunYuanMoEV1Config(
        head_dim=16, num_experts=8, moe_topk=2, rope_parameters={"rope_type": "dynamic", "alpha": 50.0,
                                                                 "factor": 1.0, "rope_theta": 10000.0},
        **{**COMMON, "intermediate_size": 32, "pad_token_id": 0}),
    # Qwen3-Next: Gated DeltaNet linear attention in two layers of three (grouped values: 4 value heads on 2 key
    # heads; prompts past its 64-token blocks), gated attention with RoPE over a quarter of each head in the
    # third; experts with a gated shared expert, one layer dense.
    "qwen3-next": lambda: transformers.Qwen3NextConfig(
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=24, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, mlp_only_layers=[2],
        layer_types=["linear_attention", "full_attention", "linear_attention"], **COMMON),
    # LFM2: gated short convolutions in two layers of three (a bias on each, a 4-wide window), Qwen3's attention in
    # the third; an MLP two thirds of block_ff_dim wide, rounded up to block_multiple_of.
    "lfm2": lambda: transformers.Lfm2Config(
        layer_types=["conv", "full_attention", "conv"], conv_bias=True, conv_L_cache=4, block_multiple_of=16,
        **COMMON),
    # LFM3: LFM2's conv layers (a 7-wide window) beside a sliding attention layer (default RoPE at its own base) and
    # a full one (proportional RoPE: half of each half-head rotated), heads gated by the input, sandwich norms.
    "lfm3": lambda: transformers.Lfm3Config(
        head_dim=16, sliding_window=24, layer_types=["conv", "sliding_attention", "conv", "full_attention", "conv"],
        **{**COMMON, "num_hidden_layers": 5, "pad_token_id": 0}),
    # LFM3 without sandwich norms or head gates, biases on attention and the convolutions, a 3-wide window; full
    # attention alone, a quarter of each half-head rotated.
    "lfm3-plain": lambda: transformers.Lfm3Config(
        head_dim=16, layer_types=["conv", "full_attention", "conv"], use_sandwich_norm=False, use_attention_gate=False,
        attention_bias=True, conv_bias=True, conv_L_cache=3,
        rope_parameters={"full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                            "partial_rotary_factor": 0.25}}, **{**COMMON, "pad_token_id": 0}),
    # LFM2-MoE: 2 of 8 experts by sigmoid score plus a routing bias from layer 1 on (layer 0 dense).
    "lfm2-moe": lambda: transformers.Lfm2MoeConfig(
        layer_types=["conv", "full_attention", "conv"], num_dense_layers=1, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, routed_scaling_factor=1.5, **COMMON),
    # Qwen3.5's text models (Qwen3_5ForCausalLM; the released checkpoints are tests/engine/test_vision_language.py's):
    # Qwen3-Next's layers with the linear layers' projections stored apart, over a dense MLP or experts.
    "qwen3.5": lambda: transformers.Qwen3_5TextConfig(
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
        layer_types=["linear_attention", "linear_attention", "full_attention"], **COMMON),
    "qwen3.5-moe": lambda: transformers.Qwen3_5MoeTextConfig(
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        **{k: v for k, v in COMMON.items() if k != "intermediate_size"}),
    # Bamba: Llama with Mamba-2 in all but attn_layer_indices, RoPE over half of each head, biases on attention.
    "bamba": lambda: transformers.BambaConfig(
        attn_layer_indices=[1], mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=32,
        attention_bias=True, **COMMON),
    # Falcon-H1: attention and Mamba-2 side by side in every layer (a mixer narrower than expand x hidden), gated
    # without a norm, Falcon-H1-0.5B's µP multipliers (attention's input scaled too); the fused CPU forward.
    "falcon-h1": lambda: transformers.FalconH1Config(
        head_dim=16, mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=32,
        **FALCON_H1_MULTIPLIERS, **COMMON),
    # Falcon-H1 normed before the gate in 2 groups, biases on every projection (out_proj's by projectors_bias),
    # the head tied to the embeddings (which their multiplier scales, not the head).
    "falcon-h1-normed": lambda: transformers.FalconH1Config(
        head_dim=16, mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
        mamba_chunk_size=32, mamba_rms_norm=True, mamba_norm_before_gate=True, attention_bias=True, mlp_bias=True,
        mamba_proj_bias=True, projectors_bias=True, **FALCON_H1_MULTIPLIERS, **{**COMMON, "tie_word_embeddings": True}),
    # Kimi Linear: Kimi Delta Attention (a decay per key channel) in three layers of four, latent attention without
    # positions in the second; DeepSeek-V3's routing in 2 groups beside a shared MLP from layer 1 on.
    "kimi-linear": lambda: transformers.KimiLinearConfig(
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"], linear_num_heads=2,
        linear_head_dim=16, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_experts=8,
        num_experts_per_token=2, moe_intermediate_size=32, num_shared_experts=1, num_expert_group=2, topk_group=1,
        routed_scaling_factor=2.5, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        **{**{k: v for k, v in COMMON.items() if k != "num_key_value_heads"}, "num_hidden_layers": 4,
           "pad_token_id": 0}),
    # Jamba: Mamba (dt, B, C RMS-normed; a low-rank dt) in all but every third layer, attention without positions
    # there, Mixtral-style experts (not renormalized) in every other layer; biases on the Mamba projections.
    "jamba": lambda: transformers.JambaConfig(
        attn_layer_period=3, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=4,
        num_experts_per_tok=2, mamba_d_state=8, mamba_dt_rank=8, mamba_proj_bias=True,
        **{**COMMON, "num_hidden_layers": 4}),
    # Nemotron-H: one sublayer a layer (Mamba-2 of mamba_num_heads x mamba_head_dim, narrower than expand x
    # hidden; attention without positions; an ungated ReLU² MLP), biases on the Mamba-2 and MLP projections.
    "nemotron-h": lambda: transformers.NemotronHConfig(
        layers_block_type=["linear_attention", "mlp", "full_attention", "mlp", "linear_attention", "linear_attention"],
        head_dim=16, mamba_num_heads=8, mamba_head_dim=12, n_groups=2, ssm_state_size=16, chunk_size=32,
        use_bias=True, mlp_bias=True, **{k: v for k, v in COMMON.items() if k != "num_hidden_layers"}),
    # Nemotron 3: ungated ReLU² experts over a latent of moe_latent_size, DeepSeek-V3's routing in groups beside an
    # ungated shared MLP.
    "nemotron-h-moe": lambda: transformers.NemotronHConfig(
        layers_block_type=["linear_attention", "moe", "full_attention", "moe"], head_dim=16, mamba_num_heads=4,
        mamba_head_dim=16, n_groups=1, ssm_state_size=8, chunk_size=16, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, moe_latent_size=32, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, **{k: v for k, v in COMMON.items() if k != "num_hidden_layers"}),
    # Granite with sliding windows (shorter than most prompts) in the layers layer_types names, a learned sink per
    # head, a layer without RoPE and the sliding layers' own base, Granite's multipliers; and over experts beside
    # a shared MLP.
    "granite-swa": lambda: transformers.GraniteSWAConfig(
        sliding_window=24, layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        layer_rope_theta=[10000.0, 0, 500000.0, 10000.0], embedding_multiplier=2.0, attention_multiplier=0.2,
        residual_multiplier=0.5, logits_scaling=4.0, num_hidden_layers=4, **_NO_LAYERS),
    "granitemoe-swa": lambda: transformers.GraniteMoeSWAConfig(
        sliding_window=24, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48,
        attention_multiplier=0.2, num_hidden_layers=5, **_NO_LAYERS),
    # Zamba2: Mamba-2 in every layer (in 2 groups, biases on its projections), two shared transformer blocks taking
    # turns over three hybrid layers (attention over the stream and the embeddings with RoPE, adapters on q, k, v
    # and the gated MLP, whose biases add_bias_linear sets too), the head tied to the embeddings.
    "zamba2": lambda: transformers.Zamba2Config(
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"], num_mem_blocks=2,
        use_shared_attention_adapter=True, adapter_rank=8, use_mem_rope=True, n_mamba_heads=8, mamba_ngroups=2,
        mamba_d_state=16, chunk_size=32, add_bias_linear=True, time_step_min=0.01, num_hidden_layers=6, **_ZAMBA2),
    # Zamba2-1.2B's layout: one block, no RoPE, adapters on the MLP only, grouped-query attention.
    "zamba2-1.2b": lambda: transformers.Zamba2Config(
        layers_block_type=["mamba", "mamba", "hybrid", "mamba", "hybrid"], n_mamba_heads=4, mamba_d_state=16,
        chunk_size=32, num_key_value_heads=2, num_hidden_layers=5, **_ZAMBA2),
    # Gemma 4 (26B-A4B's and 31B's layout): wider full-attention heads with fewer KV heads whose values are their
    # keys' projection, experts beside every dense MLP, the last two layers reading earlier layers' KV (their MLPs
    # twice as wide), per-layer inputs, soft-capped logits; and E2B's: values of their own, no experts.
    "gemma4": lambda: transformers.Gemma4TextConfig(
        head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "sliding_attention", "full_attention"], hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=4096, num_kv_shared_layers=2, use_double_wide_mlp=True, enable_moe_block=True,
        num_experts=4, top_k_experts=2, moe_intermediate_size=32, final_logit_softcapping=30.0, num_hidden_layers=6,
        **_NO_LAYERS),
    "gemma4-e2b": lambda: transformers.Gemma4TextConfig(
        head_dim=16, global_head_dim=32, sliding_window=24, hidden_size_per_layer_input=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                     "full_attention"], vocab_size_per_layer_input=4096, num_kv_shared_layers=2, num_hidden_layers=5,
        **_NO_LAYERS),
    # MiMo-V2-Flash: sliding layers (a window shorter than most prompts) with twice the KV heads and sinks, values
    # narrower than keys and scaled, a third of each head rotated at a base per layer type; DeepSeek-V3's routing in
    # two groups after a dense first layer, no shared experts.
    "mimo-v2-flash": lambda: transformers.MiMoV2FlashConfig(
        head_dim=24, v_head_dim=16, num_key_value_heads=1, sliding_window=24, moe_intermediate_size=32,
        num_experts_per_tok=2, n_routed_experts=8, n_group=2, topk_group=1, num_hidden_layers=4,
        **{k: v for k, v in _NO_LAYERS.items() if k != "num_key_value_heads"}),
    # Kolibri-1: K-EXAONE's attention (RoPE in the sliding layers only) under GLM-4's four norms; experts chosen by
    # logit plus a correction bias, weighed by sigmoids, renormalized, beside a shared expert of its own width.
    "kolibri1": lambda: transformers.Kolibri1Config(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        head_dim=16, sliding_window=24, norm_topk_prob=True, num_hidden_layers=5,
        **{k: v for k, v in _NO_LAYERS.items() if k != "intermediate_size"}),
    # Hy3: GLM-4.5's fp32 sigmoid routing with a correction bias, scaled, beside a shared expert, after a dense first
    # layer; Qwen3's q/k norms, RoPE over the whole head.
    "hy3": lambda: transformers.HYV3Config(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16,
                                           router_scaling_factor=2.5, **COMMON),
    # Laguna: query heads per layer (4, 8, 4 over 2 KV heads), a softplus gate per head (per feature below), sliding
    # layers rotating whole heads at a base of their own beside full ones rotating half, a soft-capped sigmoid
    # router (a cap low enough to bite) with a correction bias, a shared expert wider than the routed ones.
    "laguna": lambda: transformers.LagunaConfig(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        head_dim=16, num_attention_heads_per_layer=[4, 8, 4], sliding_window=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], moe_router_logit_softcapping=0.5,
        moe_routed_scaling_factor=2.5, **COMMON),
    "laguna-per-element": lambda: transformers.LagunaConfig(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16, gating="per-element",
        mlp_layer_types=["dense", "dense", "sparse"], **COMMON),
    # Flint: sinks in every layer, sliding layers rotating beside a full one that does not, the top k of an fp32
    # router's sigmoids beside an ungated shared expert, the first layer dense.
    "flint": lambda: transformers.FlintConfig(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        head_dim=16, sliding_window=24, mlp_only_layers=[0],
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], **COMMON),
    # MiniMax-Text-01: Mixtral's attention and experts beside lightning-attention layers (blocks of 24 tokens, fewer
    # than most prompts), a stream of norms with factors of their own.
    "minimax": lambda: transformers.MiniMaxConfig(
        num_local_experts=4, num_experts_per_tok=2, block_size=24, head_dim=16, full_attn_alpha_factor=0.7,
        full_attn_beta_factor=1.3, linear_attn_alpha_factor=1.2, linear_attn_beta_factor=0.8, mlp_alpha_factor=0.9,
        mlp_beta_factor=1.1, **COMMON),
    # RecurrentGemma (Griffin): recurrent blocks (a conv, then the RG-LRU) beside local attention (a window shorter
    # than most prompts, one KV head, RoPE over half of each head), Gemma's norms, capped logits, embeddings times
    # sqrt(96) rounded to bf16.
    "recurrent-gemma": lambda: transformers.RecurrentGemmaConfig(
        hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
        vocab_size=4096, attention_window_size=24, logits_soft_cap=3.0, bos_token_id=1, eos_token_id=2),
    # Lara Mini: Gated DeltaNet, sliding (rotating) and full (unrotated) attention layers, every layer routed beside an
    # ungated shared expert; its linear layers' in_proj saved fused.
    "lara-mini": lambda: transformers.LaraMiniConfig(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        head_dim=16, sliding_window=24, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, num_hidden_layers=4, **{k: v for k, v in COMMON.items() if k != "num_hidden_layers"}),
    # nanochat: weightless RMSNorms (embeddings too), q/k normed after a RoPE turning the other way, ReLU² without
    # a gate, soft-capped logits.
    "nanochat": lambda: transformers.NanoChatConfig(final_logit_softcapping=3.0, **COMMON),
    # DBRX: Mixtral-style experts stored stacked (w1, v1, w2), a softmax router renormalized, LayerNorms without
    # biases, q/k/v in one Wqkv clamped to clip_qkv (small enough to bite), nested config fields.
    "dbrx": lambda: transformers.DbrxConfig(
        d_model=64, n_heads=4, n_layers=3, max_seq_len=512, vocab_size=4096, bos_token_id=1, eos_token_id=2,
        attn_config={"kv_n_heads": 2, "clip_qkv": 0.5, "rope_theta": 5000.0},
        ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}),
    # Mellum 2: Qwen3-MoE's attention and experts, sliding layers and a RoPE base per layer type, a dense first
    # layer (mlp_layer_types).
    "mellum": lambda: transformers.MellumConfig(
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"], sliding_window=24, head_dim=16, num_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=32, num_hidden_layers=4,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}, **_NO_LAYERS),
    # Qwen3-MoE: q/k norms, top-2 of 8 renormalized, only every other layer routing (decoder_sparse_step).
    "qwen3-moe": lambda: transformers.Qwen3MoeConfig(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=2,
        **COMMON),
}
MAX_TOKENS = 16
PRETRAINED_CONTEXT = 32  # phi4-mini's original_max_position_embeddings


def phi4_mini_config():
    rotated = 6  # head_dim 16 * 0.75 / 2
    return transformers.Phi3Config(
        partial_rotary_factor=0.75, original_max_position_embeddings=PRETRAINED_CONTEXT, tie_word_embeddings=True,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.3 * i for i in range(rotated)],
                      "long_factor": [2.0**i for i in range(rotated)]},
        **{**COMMON, "pad_token_id": 0})


def save_checkpoint(config, out, tiny_model_dir, auto=None):
    """The transformers model of ``config`` (an ``auto`` class's, causal LM by default) on decisive random
    weights, saved into ``out`` with the built-in model's tokenizer."""
    torch.manual_seed(0)
    try:
        model = (auto or transformers.AutoModelForCausalLM).from_config(config).eval()
    except ValueError:  # a causal LM transformers maps for pretraining only (Mistral 4 in 5.25): its class
        name = type(config).__name__.removesuffix("Config") + "ForCausalLM"
        model = getattr(transformers, name)._from_config(config).eval()
    # Zamba2's Mamba-2 layers without MLPs, and its shared blocks' wide attention, amplify rounding several-fold
    # a layer at 0.3: transformers' own fp32 and fp64 logprobs then differ by 1e-2, at 0.1 by 1e-5 (as others' at 0.3).
    # MiniMax's lightning attention sums k ⊗ v over every token without a normalizer: at 0.3 a 150-token prompt's
    # last logprobs were 3e-4 from transformers' (the same sums in another order; its tokens the same).
    std = 0.1 if config.model_type in ("zamba2", "minimax") else 0.3
    with torch.no_grad():  # weights that give decisive logits, so greedy choices are not near-ties
        for name, p in model.named_parameters():
            # Sinks (GPT-OSS) near the scores' scale, so that they change the attention. A LayerNorm's bias as any
            # bias: near 1 in the final norm, it made the tied head's logits of every position alike (XGLM's).
            norm = "norm" in name and not name.endswith("norm.bias")
            p.normal_(1.0, 0.2) if norm else p.normal_(4.0, 2.0) if "sinks" in name else p.normal_(0.0, std)
        for name, b in model.named_buffers():  # GLM-4.5's routing bias: enough to change which experts are chosen
            if "e_score_correction_bias" in name or name.endswith(".expert_bias"):  # LFM2-MoE's
                b.normal_(0.0, 0.3)
            if name.endswith(".layer_scalar"):  # Gemma 4's scale of each layer's output (1 as initialized)
                b.uniform_(0.5, 1.5)
        for name, p in model.named_parameters():  # AFMoE's routing bias is a parameter
            if name.endswith("expert_bias"):
                p.normal_(0.0, 0.3)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    return model


# transformers' greedy continuation and per-step log-softmax of each (model, prompt), generated once: the
# kernel and torch-op variants of a test compare against the same reference.
_REFERENCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _reference(model, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    refs = _REFERENCES.setdefault(model, {})
    if tuple(prompt) not in refs:
        # No end of sequence, as ignore_eos runs: an EOS is generated like any token and the output goes on
        # (min_new_tokens would forbid EOS instead, and pick the next best token where EOS is the greedy one).
        eos, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
        try:
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                     pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        finally:
            model.generation_config.eos_token_id = eos
        assert out.sequences.shape[1] == len(prompt) + MAX_TOKENS
        refs[tuple(prompt)] = (out.sequences[0, len(prompt):].tolist(),
                               [torch.log_softmax(step[0].float(), -1) for step in out.logits])
    return refs[tuple(prompt)]


def engine_matches_transformers(path, model, cpu_kernels: bool, lengths=(3, 40)) -> None:
    """The checkpoint at ``path`` served greedily (chunks of 16) gives ``model``'s tokens and logprobs."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in lengths]
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32", cpu_kernels=cpu_kernels),
                           SchedulerConfig(chunk_size=16))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                                   logprobs=0)] * len(prompts))
    assert_matches_transformers(model, prompts, got)


def assert_matches_transformers(model, prompts, got, logprob_tol: float = 1e-4):
    for prompt, comp in zip(prompts, got, strict=True):
        tokens, logprobs = _reference(model, prompt)
        assert comp.token_ids == tokens
        want = [step[t].item() for step, t in zip(logprobs, comp.token_ids, strict=True)]
        assert [lp.logprob for lp in comp.logprobs] == pytest.approx(want, abs=logprob_tol)


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request, tmp_path_factory, tiny_model_dir):
    """A checkpoint of this architecture saved by transformers (the built-in model's tokenizer beside it), the
    model it was saved from, and prompts."""
    out = tmp_path_factory.mktemp(request.param)
    model = save_checkpoint(CASES[request.param](), out, tiny_model_dir)
    g = torch.Generator().manual_seed(3)
    lengths = (40, 150) if request.param == "phi4-mini" else (1, 17, 40, 150)  # all past PRETRAINED_CONTEXT
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in lengths]
    return out, model, prompts


def greedy_matches_transformers(path, model, prompts, cpu_kernels: bool, logprob_tol: float = 1e-4) -> OfflineEngine:
    """The checkpoint at ``path`` served greedily in fp32 (chunks of 16) gives ``model``'s tokens and logprobs (within
    ``logprob_tol``) for ``prompts``; returns the engine."""
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32", cpu_kernels=cpu_kernels),
                           SchedulerConfig(chunk_size=16))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                                   logprobs=0)] * len(prompts))
    assert_matches_transformers(model, prompts, got, logprob_tol)
    return engine


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_greedy_tokens_and_logprobs_match_transformers(checkpoint, cpu_kernels):
    greedy_matches_transformers(*checkpoint, cpu_kernels)


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_longrope_within_the_pretrained_context_uses_the_short_factors(tmp_path, tiny_model_dir, cpu_kernels):
    """``--max-model-len`` at the pretrained context: the short factors, as transformers uses them for
    sequences that never pass it."""
    model = save_checkpoint(phi4_mini_config(), tmp_path, tiny_model_dir)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (1, 9, PRETRAINED_CONTEXT - MAX_TOKENS)]
    engine = OfflineEngine(EngineConfig(model=str(tmp_path), dtype="float32", cpu_kernels=cpu_kernels,
                                        max_model_len=PRETRAINED_CONTEXT), SchedulerConfig(chunk_size=8))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                                   logprobs=0)] * len(prompts))
    assert_matches_transformers(model, prompts, got)
    with pytest.raises(InvalidArgument, match="context is 32"):
        engine.validate(list(range(3, 3 + PRETRAINED_CONTEXT)), SamplingParams(max_tokens=1))


def test_sliding_windows_are_read_as_transformers_reads_them(checkpoint):
    path, model, _ = checkpoint
    config = ModelConfig.from_dir(path)
    layers = model.config.num_hidden_layers
    types = getattr(model.config, "layer_types", None) or ["full_attention"] * layers
    if model.config.model_type in ("mistral", "phi3", "starcoder2") and model.config.sliding_window:
        types = ["sliding_attention"] * layers  # transformers' Mistral, Phi-3 and StarCoder2 slide in every layer
    window = getattr(model.config, "sliding_window", None)
    if model.config.model_type == "gpt_neo":  # its local layers, over window_size keys
        types = ["sliding_attention" if kind == "local" else "full_attention" for kind in model.config.attention_layers]
        window = model.config.window_size
    assert [config.slides(i) for i in range(layers)] == [t == "sliding_attention" for t in types]
    assert config.sliding_window == (window if "sliding_attention" in types else None)
    # BLOOM and RecurrentGemma name none: their training contexts
    assert config.max_model_len == {"bloom": 2048, "recurrent_gemma": 8192}.get(model.config.model_type, 512)


def test_qwen_windows_follow_use_sliding_window_and_max_window_layers():
    raw = dict(COMMON, architectures=["Qwen2ForCausalLM"], sliding_window=64, use_sliding_window=False)
    assert ModelConfig.from_dict(raw).sliding_window is None
    on = ModelConfig.from_dict({**raw, "use_sliding_window": True, "max_window_layers": 1})
    assert on.sliding_window == 64 and [on.slides(i) for i in range(3)] == [False, True, True]
    assert on.uniform_window is None  # full layers read every key: no block is ever freed
    assert ModelConfig.from_dict({**raw, "use_sliding_window": True, "max_window_layers": 0}).uniform_window == 64
    mistral = ModelConfig.from_dict(dict(COMMON, architectures=["MistralForCausalLM"], sliding_window=None))
    assert mistral.sliding_window is None and mistral.uniform_window is None
    llama = ModelConfig.from_dict(dict(COMMON, architectures=["LlamaForCausalLM"], sliding_window=64))
    assert llama.sliding_window is None  # transformers' Llama has no window
    with pytest.raises(ModelLoadError, match="one type per layer"):
        ModelConfig.from_dict({**raw, "use_sliding_window": True, "layer_types": ["sliding_attention"]})


def test_gemma3_hub_configs_are_read_as_transformers_reads_them():
    """gemma-3-1b-it's config.json as published (rope bases and the window pattern as plain fields)."""
    raw = dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=262144, hidden_size=1152,
               intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
               head_dim=256, max_position_embeddings=32768, query_pre_attn_scalar=256, rope_theta=1000000,
               rope_local_base_freq=10000, rope_scaling=None, sliding_window=512, sliding_window_pattern=6,
               hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None, attn_logit_softcapping=None)
    config = ModelConfig.from_dict(raw)
    assert [i for i in range(26) if not config.slides(i)] == [5, 11, 17, 23] and config.uniform_window is None
    assert (config.rope_theta, config.local_rope_theta, config.attn_scale) == (1e6, 1e4, 1 / 16)
    assert config.tie_word_embeddings and config.qk_norm and config.embed_scale == 1152**0.5
    assert not config.is_llama_like and ModelConfig.from_dict(dict(COMMON, hidden_act="silu")).is_llama_like
    with pytest.raises(ModelLoadError, match="query_pre_attn_scalar must be > 0"):
        ModelConfig.from_dict({**raw, "query_pre_attn_scalar": 0})
    with pytest.raises(ModelLoadError, match="attn_softcap must be > 0"):
        ModelConfig.from_dict({**raw, "architectures": ["Gemma2ForCausalLM"], "attn_logit_softcapping": -1.0})
    with pytest.raises(ModelLoadError, match="not soft-capped"):
        ModelConfig.from_dict({**raw, "final_logit_softcapping": 30.0})
    gemma2 = {k: v for k, v in raw.items() if not k.endswith("softcapping")}
    gemma2 = ModelConfig.from_dict({**gemma2, "architectures": ["Gemma2ForCausalLM"], "sliding_window_pattern": 2})
    assert (gemma2.attn_softcap, gemma2.final_softcap) == (50.0, 30.0)  # transformers' defaults when absent
    assert gemma2.local_rope_theta is None and not gemma2.qk_norm and not gemma2.slides(1) and gemma2.slides(2)
    with pytest.raises(ModelLoadError, match="activation 'quick_gelu' is not supported"):
        ModelConfig.from_dict(dict(COMMON, hidden_act="quick_gelu"))
    with pytest.raises(ModelLoadError, match="partial_rotary_factor is 0.75"):  # Phi-3 only
        ModelConfig.from_dict(dict(COMMON, architectures=["Qwen2ForCausalLM"], partial_rotary_factor=0.75))


def _decoder_layers(model) -> list:
    """A transformers causal LM's decoder layers, under whichever name its base model holds them (``h``: GPT-2-style
    models and BLOOM; ``blocks``: MPT; OPT's under its ``decoder``)."""
    base = next(m for m in (getattr(model, "model", None), model.base_model) if m is not None)
    base = getattr(base, "decoder", base)
    return list(next(getattr(base, name) for name in ("layers", "h", "blocks") if hasattr(base, name)))


def test_mixture_of_experts_layers_are_read_as_transformers_builds_them(checkpoint):
    path, model, _ = checkpoint
    config = ModelConfig.from_dir(path)
    routed = [any(hasattr(getattr(layer, n, None), "experts") for n in ("mlp", "block_sparse_moe", "feed_forward",
                                                                         "mixer", "ffn"))
              for layer in _decoder_layers(model)]  # OPT's MLP is fc1 and fc2 on the layer
    assert [config.is_moe(i) for i in range(len(routed))] == routed
    if model.config.model_type == "dbrx":  # its experts' fields nested in ffn_config
        ffn = model.config.ffn_config
        assert (config.num_experts, config.num_experts_per_tok) == (ffn.moe_num_experts, ffn.moe_top_k)
    elif any(routed):
        names = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")  # as each names it
        assert config.num_experts == next(getattr(model.config, n) for n in names if hasattr(model.config, n))
        top_k = getattr(model.config, "moe_topk", None) or model.config.num_experts_per_tok  # Aria's moe_topk
        assert config.num_experts_per_tok == top_k


def test_attention_adapters_on_a_mixture_of_experts_model_match_peft(tmp_path, tiny_model_dir):
    """LoRA on an MoE model adapts the attention projections (those of its experts are refused, see
    tests/common/test_lora.py); the experts run beside it unchanged."""
    save_checkpoint(CASES["qwen2-moe"](), tmp_path / "model", tiny_model_dir)
    adapter = make_adapter(tmp_path / "model", tmp_path / "adapter", seed=5, r=4, lora_alpha=8,
                           target_modules=["q_proj", "v_proj", "o_proj"])
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (5, 40)]
    engine = OfflineEngine(EngineConfig(model=str(tmp_path / "model"), dtype="float32"), SchedulerConfig(chunk_size=16))
    ref = LoraRef("attn", str(adapter))
    got = engine.generate(prompts * 2, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0)] * 4,
                          loras=[ref, ref, None, None])
    want = peft_greedy(tmp_path / "model", adapter, prompts, MAX_TOKENS)
    assert [c.token_ids for c in got[:2]] == want
    assert [c.token_ids for c in got[2:]] == peft_greedy(tmp_path / "model", None, prompts, MAX_TOKENS)
    assert want != [c.token_ids for c in got[2:]]  # the adapter changes the output


# Each family's adapters under its checkpoint's module names, as PEFT targets them: GPT-2's Conv1D layers
# (stored transposed), a fused query_key_value split per head (BigCode without multi-query, BLOOM), for one key/value
# head (Falcon-7B) and by group (Falcon's new architecture), MPT's Wqkv, ungated MLPs, GPT-J's and GLM-4's
# interleaved RoPE pairs (B's rows reordered as the weights'), Falcon-H1's multipliers (folded into B as into the
# weights), OPT's and Phi's names, Llama 4's feed_forward (its dense layer's: the next is a mixture of experts),
# Nemotron-H's and LFM3's (each layer's `mixer` named by its kind; LFM3's w1/w2/w3), beside layers nothing adapts.
_FAMILY_ADAPTERS = {
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "gpt-bigcode-mha": ["c_attn", "c_proj", "c_fc"],
    "bloom": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "persimmon": ["query_key_value", "dense", "dense_h_to_4h"],
    "falcon-7b": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "falcon-new": ["query_key_value", "dense_4h_to_h"],
    "mpt": ["Wqkv", "out_proj", "up_proj", "down_proj"],
    "gptj": ["q_proj", "k_proj", "v_proj", "out_proj", "fc_in", "fc_out"],
    "gpt-neo": ["q_proj", "v_proj", "out_proj", "c_fc", "c_proj"],
    "codegen": ["qkv_proj", "out_proj", "fc_in", "fc_out"],  # B's rows split by shard as the weight's
    "biogpt": ["q_proj", "v_proj", "out_proj", "fc1", "fc2"],
    "xglm": ["q_proj", "k_proj", "out_proj", "fc1", "fc2"],
    "glm4": ["q_proj", "k_proj", "gate_up_proj", "down_proj"],
    "falcon-h1": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "opt": ["q_proj", "v_proj", "out_proj", "fc1", "fc2"],
    "phi": ["q_proj", "k_proj", "dense", "fc1", "fc2"],
    "llama4": {"target_modules": ["q_proj", "k_proj", "gate_proj", "up_proj", "down_proj"], "layers_to_transform": [0]},
    "nemotron-h": ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
    "lfm3": ["q_proj", "k_proj", "v_proj", "g_proj", "w1", "w2", "w3"],  # g_proj: its output gate, per head
    "nanochat": ["q_proj", "k_proj", "fc1", "fc2"],  # q's and k's B rows negated as their weights' (RoPE's direction)
    # Latent attention's projections, kv_b_proj's absorbed into the query and output as its weight is; the
    # output gate's rows in MiniCPM5's q_gate_proj.
    "deepseek-v3": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
    "deepseek-v2": ["q_proj", "kv_b_proj"],
    "minicpm5-moe": ["q_gate_proj", "o_proj"],
    # Kimi Linear: KDA layers' projections (q, k and v loaded joined, their adapters added to its thirds) beside
    # latent attention's, whose q_proj and o_proj have the same names and other shapes.
    "kimi-linear": ["q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj", "o_proj",
                    "kv_b_proj"],
    # Linear-attention mixers' projections beside the attention's: Gated DeltaNet's (Qwen3.5's apart, Qwen3-Next's
    # grouped), LFM2's convolution's (whose out_proj shares its name with the attention's), Mamba-2's, and Mamba's
    # (Jamba's dt_proj adapter read but not applied, as transformers applies none).
    "qwen3.5": ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "q_proj", "k_proj"],
    "qwen3-next": ["in_proj_qkvz", "in_proj_ba", "out_proj", "q_proj"],
    "lfm2": ["in_proj", "out_proj", "q_proj"],
    "granite4-h": ["in_proj", "out_proj", "q_proj"],
    "jamba": ["in_proj", "x_proj", "dt_proj", "out_proj", "q_proj"],
    # Lightning attention's projections (its qkv_proj held as the checkpoint holds it) beside softmax attention's,
    # Griffin's recurrent block's beside local attention's.
    "minimax": ["qkv_proj", "output_gate", "out_proj", "q_proj", "o_proj"],
    "recurrent-gemma": ["linear_x", "linear_y", "linear_out", "k_proj", "gate_proj"],
    # OLMo Hybrid: q/k/v name attention's projections and Gated DeltaNet's alike (the latter loaded fused).
    "olmo-hybrid": ["q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "o_proj", "up_proj"],
    "aria-text": ["q_proj", "o_proj", "gate_proj", "down_proj"],  # the shared MLP's (shared_experts)
}


@pytest.mark.parametrize("case", sorted(_FAMILY_ADAPTERS))
def test_adapters_named_as_each_family_names_its_modules_match_peft(case, tmp_path, tiny_model_dir):
    save_checkpoint(CASES[case](), tmp_path / "model", tiny_model_dir)
    targets = _FAMILY_ADAPTERS[case]
    adapter = make_adapter(tmp_path / "model", tmp_path / "adapter", seed=5, r=4, lora_alpha=8,
                           **(targets if isinstance(targets, dict) else {"target_modules": targets}))
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (5, 40)]
    engine = OfflineEngine(EngineConfig(model=str(tmp_path / "model"), dtype="float32"), SchedulerConfig(chunk_size=16))
    ref = LoraRef(case, str(adapter))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0)] * 2, loras=[ref, ref])
    want = peft_greedy(tmp_path / "model", adapter, prompts, MAX_TOKENS)
    assert [c.token_ids for c in got] == want
    assert want != peft_greedy(tmp_path / "model", None, prompts, MAX_TOKENS)  # the adapter changes the output


# Adapters of the experts themselves (PEFT's target_parameters): gate and up concatenated (Qwen3-MoE); GPT-OSS's
# interleaved, stored [E, in, out], with biases; Llama 4's A and B swapped, its inputs scaled into the experts;
# Nemotron 3's ungated experts in a latent space, whose up_proj and down_proj have one shape (told apart by how
# deep PEFT wrapped each), and the projections into and out of that space. Beside them, adapters of the shared
# expert, under each family's name for it (Llama 4's shared_expert, Nemotron-H's shared_experts, Granite's fused
# shared_mlp.input_linear).
_EXPERT_ADAPTERS = {"qwen3-moe": ("mlp", []), "gpt-oss": ("mlp", []),
                    "llama4": ("feed_forward", ["shared_expert.gate_proj", "shared_expert.down_proj"]),
                    "nemotron-h-moe": ("mixer", ["shared_experts.up_proj", "fc1_latent_proj", "fc2_latent_proj"]),
                    "granitemoe-shared": ("block_sparse_moe", ["shared_mlp.input_linear", "shared_mlp.output_linear"])}


@pytest.mark.parametrize("case", sorted(_EXPERT_ADAPTERS))
def test_experts_adapters_match_peft_beside_the_base_model_and_another_adapter(case, tmp_path, tiny_model_dir):
    """Three prompts in one batch (chunks of 16 mix their tokens): one with an adapter of both expert
    projections (and the shared expert's), one without, one with an adapter of the down projection only."""
    save_checkpoint(CASES[case](), tmp_path / "model", tiny_model_dir)
    moe, shared = _EXPERT_ADAPTERS[case]
    experts = f"{moe}.experts"
    first = "up_proj" if case == "nemotron-h-moe" else "gate_up_proj"
    both = make_adapter(tmp_path / "model", tmp_path / "both", seed=5, r=2, lora_alpha=8, target_modules=shared,
                        target_parameters=[f"{experts}.{first}", f"{experts}.down_proj"])
    down = make_adapter(tmp_path / "model", tmp_path / "down", seed=7, r=4, lora_alpha=32, target_modules=[],
                        target_parameters=[f"{experts}.down_proj"])
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (40, 5, 23)]
    engine = OfflineEngine(EngineConfig(model=str(tmp_path / "model"), dtype="float32"), SchedulerConfig(chunk_size=16))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0)] * 3,
                          loras=[LoraRef("both", str(both)), None, LoraRef("down", str(down))])
    want = [peft_greedy(tmp_path / "model", adapter, [p], MAX_TOKENS)[0]
            for adapter, p in zip([both, None, down], prompts, strict=True)]
    assert [c.token_ids for c in got] == want
    assert want[0] != peft_greedy(tmp_path / "model", None, prompts[:1], MAX_TOKENS)[0]  # the adapter matters
    assert want[2] != peft_greedy(tmp_path / "model", None, prompts[2:], MAX_TOKENS)[0]


@pytest.mark.parametrize("case", ["deepseek-v3", "qwen3.5"])
def test_latent_and_linear_attention_adapters_match_peft_beside_the_base_model(case, tmp_path, tiny_model_dir):
    """Tokens of one adapter spread over a batch (chunks of 16 mix four prompts; without the fused CPU path,
    decodes are not grouped by adapter, so an adapter's rows are not one run): kv_b_proj's adapter absorbed
    into latent attention's query and output for its rows only; Gated DeltaNet's projections'."""
    save_checkpoint(CASES[case](), tmp_path / "model", tiny_model_dir)
    targets = _FAMILY_ADAPTERS[case]
    adapter = make_adapter(tmp_path / "model", tmp_path / "adapter", seed=5, r=4, lora_alpha=8,
                           target_modules=targets)
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (23, 9, 40, 5)]
    engine = OfflineEngine(EngineConfig(model=str(tmp_path / "model"), dtype="float32", cpu_kernels=False),
                           SchedulerConfig(chunk_size=16))
    ref = LoraRef(case, str(adapter))
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0)] * 4,
                          loras=[ref, None, ref, None])
    want = [peft_greedy(tmp_path / "model", a, [p], MAX_TOKENS)[0]
            for a, p in zip([adapter, None, adapter, None], prompts, strict=True)]
    assert [c.token_ids for c in got] == want


def test_mixture_of_experts_hub_configs_and_what_is_refused():
    """Qwen3-30B-A3B's fields as published (num_experts; transformers >= 5 writes num_local_experts), and
    configs the engine cannot serve refused saying why."""
    raw = dict(COMMON, architectures=["Qwen3MoeForCausalLM"], num_experts=128, num_experts_per_tok=8,
               moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
               use_sliding_window=False, sliding_window=None)
    config = ModelConfig.from_dict(raw)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (128, 8, 768)
    assert config.moe_layers == (0, 1, 2) and config.norm_topk_prob and config.qk_norm
    assert config.lora_shape.moe_layers == (0, 1, 2)
    renamed = {k: v for k, v in raw.items() if k != "num_experts"} | {"num_local_experts": 16}
    assert ModelConfig.from_dict(renamed).num_experts == 16
    mixtral = ModelConfig.from_dict(dict(COMMON, architectures=["MixtralForCausalLM"], sliding_window=4096))
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.moe_intermediate_size) == (8, 2, 128)
    assert mixtral.uniform_window == 4096  # every layer slides, as in Mistral
    with pytest.raises(ModelLoadError, match="num_experts_per_tok must be between 1 and the number of experts"):
        ModelConfig.from_dict({**raw, "num_experts": 4, "num_experts_per_tok": 8})
    with pytest.raises(ModelLoadError, match="use_sliding_window is set; Qwen3MoeForCausalLM is served with full"):
        ModelConfig.from_dict({**raw, "use_sliding_window": True, "sliding_window": 64})


GPT_OSS_20B = {  # its config.json as released, but for the 24 layer types (generated below)
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "eos_token_id": 200002, "experts_per_token": 4,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
    "pad_token_id": 199999, "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
        "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                           "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                           "truncate": False},
    "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "vocab_size": 201088, "layer_types": ["sliding_attention", "full_attention"] * 12}


def test_gpt_oss_configs_read_as_released_and_with_transformers_defaults():
    config = ModelConfig.from_dict(GPT_OSS_20B)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (32, 4, 2880)
    assert config.moe_layers == tuple(range(24)) and config.moe_routing == "topk_softmax" and config.moe_biases
    assert (config.swiglu_limit, config.swiglu_alpha) == (7.0, 1.702)
    assert config.attention_bias and config.o_proj_bias and config.attention_sinks and config.mxfp4
    assert config.sliding_window == 128 and config.sliding_layers == tuple(range(0, 24, 2))
    assert config.rope_type == "yarn" and config.rope_theta == 150000 and not config.is_llama_like
    # What config.json leaves out is what transformers assumes.
    minimal = {k: GPT_OSS_20B[k] for k in ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "num_key_value_heads", "vocab_size")}
    theirs = transformers.GptOssConfig(**{k: v for k, v in minimal.items() if k != "architectures"})
    ours = ModelConfig.from_dict(minimal)
    assert (ours.head_dim, ours.sliding_window, ours.rope_theta) == (theirs.head_dim, theirs.sliding_window,
                                                                    theirs.rope_parameters["rope_theta"])
    assert [ours.slides(i) for i in range(24)] == [t == "sliding_attention" for t in theirs.layer_types]
    assert ours.rope_scaling == {k: v for k, v in theirs.rope_parameters.items() if k != "rope_theta"}
    assert (ours.num_experts, ours.num_experts_per_tok) == (theirs.num_local_experts, theirs.num_experts_per_tok)
    assert (ours.swiglu_limit, ours.swiglu_alpha) == (theirs.swiglu_limit, theirs.swiglu_alpha)
    with pytest.raises(ModelLoadError, match="swiglu_limit must be > 0"):
        ModelConfig.from_dict({**GPT_OSS_20B, "swiglu_limit": 0})


GLM_45_AIR = {  # its config.json as released
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "first_k_dense_replace": 1, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46,
    "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000, "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1,
    "use_qk_norm": False, "vocab_size": 151552, "eos_token_id": [151329, 151336, 151338], "pad_token_id": 151329}


def test_glm_configs_read_as_released_and_what_cannot_route_is_refused():
    config = ModelConfig.from_dict(GLM_45_AIR)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (128, 8, 1408)
    assert config.moe_layers == tuple(range(1, 46)) and config.shared_expert_intermediate_size == 1408
    assert config.moe_routing == "sigmoid" and not config.shared_expert_gated and config.norm_topk_prob
    assert config.rotary_dim == 64 and config.attention_bias and not config.qk_norm and config.mtp_layers == 1
    assert ModelConfig.from_dict({k: v for k, v in GLM_45_AIR.items() if k != "partial_rotary_factor"}).rotary_dim == 64
    with pytest.raises(ModelLoadError, match="128 experts in n_group 3 groups"):
        ModelConfig.from_dict({**GLM_45_AIR, "n_group": 3})
    with pytest.raises(ModelLoadError, match="topk_group 1 of them, must hold num_experts_per_tok"):
        ModelConfig.from_dict({**GLM_45_AIR, "n_group": 64})  # one group of 2 cannot hold 8 experts


def test_multi_token_prediction_layers_are_skipped_and_routers_stay_fp32(tmp_path, tiny_model_dir):
    """GLM-4.5's checkpoints hold a multi-token-prediction layer after the model's own; a checkpoint without
    num_nextn_predict_layers that holds one is refused, naming the weight."""
    import json

    from safetensors.torch import load_file, save_file

    model = save_checkpoint(CASES["glm4-moe"](), tmp_path, tiny_model_dir)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights |= {"model.layers.3.eh_proj.weight": torch.ones(64, 128), "model.layers.3.enorm.weight": torch.ones(64)}
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    prompts = [[5, 6, 7, 8]]
    engine = OfflineEngine(EngineConfig(model=str(tmp_path), dtype="float32"), SchedulerConfig())
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                                   logprobs=0)])
    assert_matches_transformers(model, prompts, got)
    bf16 = OfflineEngine(EngineConfig(model=str(tmp_path), dtype="bfloat16"), SchedulerConfig())
    gate = bf16.runner.model.model.layers[1].mlp.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32  # as transformers keeps them
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    with pytest.raises(ModelLoadError, match="unexpected weight 'model.layers.3"):
        OfflineEngine(EngineConfig(model=str(tmp_path), dtype="float32"), SchedulerConfig())


MINIMAX_M2 = {  # its config.json as released, but for the fields that describe other variants' attention
    "architectures": ["MiniMaxM2ForCausalLM"], "head_dim": 128, "hidden_act": "silu", "hidden_size": 3072,
    "intermediate_size": 1536, "max_position_embeddings": 196608, "num_attention_heads": 48,
    "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8, "num_local_experts": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 5000000, "rotary_dim": 64, "scoring_func": "sigmoid",
    "use_qk_norm": True, "qk_norm_type": "per_layer", "use_routing_bias": True, "vocab_size": 200064,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                            "weight_block_size": [128, 128]}}


def test_minimax_m2_config_reads_as_released():
    config = ModelConfig.from_dict(MINIMAX_M2)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (256, 8, 1536)
    assert config.moe_routing == "sigmoid" and not config.router_fp32 and config.moe_layers == tuple(range(62))
    assert config.rotary_dim == 64 and config.qk_norm and config.qk_norm_whole
    assert config.fp8_scales == "weight_scale_inv" and config.fp8_block == (128, 128)


DEEPSEEK_V3 = {  # its config.json as released
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                           "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                           "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_group": 4,
    "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280}


def test_deepseek_v3_config_reads_as_released():
    """The cache holds one 576-wide latent per token; the rest as transformers reads it."""
    from services.engine.mla import softmax_scale

    config = ModelConfig.from_dict(DEEPSEEK_V3)
    assert config.mla and (config.num_key_value_heads, config.head_dim, config.rotary_dim) == (1, 576, 64)
    assert config.rope_interleaved and config.q_lora_rank == 1536 and config.mtp_layers == 1
    assert config.moe_layers == tuple(range(3, 61)) and (config.moe_groups, config.moe_topk_groups) == (8, 4)
    assert config.routed_scaling_factor == 2.5 and config.fp8_block == (128, 128) and not config.is_llama_like
    assert config.lora_shape.latent_attention
    assert softmax_scale(config) == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2)
    with pytest.raises(ModelLoadError, match="DeepSeek-V3's sigmoid / noaux_tc routing is supported"):
        ModelConfig.from_dict({**DEEPSEEK_V3, "scoring_func": "softmax", "topk_method": "group_limited_greedy"})
    with pytest.raises(ModelLoadError, match="an even qk_rope_head_dim"):
        ModelConfig.from_dict({**DEEPSEEK_V3, "qk_rope_head_dim": 63})


# Kimi K2 Thinking: DeepSeek-V3's architecture with 384 experts in one group, and INT4 experts.
KIMI_K2_THINKING = {**DEEPSEEK_V3, "bos_token_id": 163584, "eos_token_id": 163586, "max_position_embeddings": 262144,
                    "n_group": 1, "n_routed_experts": 384, "num_attention_heads": 64, "num_key_value_heads": 64,
                    "num_nextn_predict_layers": 0, "first_k_dense_replace": 1, "routed_scaling_factor": 2.827,
                    "rope_theta": 50000.0, "topk_group": 1, "vocab_size": 163840,
                    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                     "type": "yarn"},
                    "quantization_config": {
                        "quant_method": "compressed-tensors", "format": "pack-quantized", "kv_cache_scheme": None,
                        "quantization_status": "compressed", "ignore": ["lm_head"], "config_groups": {"group_0": {
                            "input_activations": None, "output_activations": None, "targets": ["Linear"],
                            "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                                        "group_size": 32, "num_bits": 4, "observer": "minmax", "observer_kwargs": {},
                                        "strategy": "group", "symmetric": True, "type": "int"}}}}}


def test_kimi_k2_thinking_config_reads_with_its_int4_experts():
    config = ModelConfig.from_dict(KIMI_K2_THINKING)
    assert config.mla and (config.num_experts, config.moe_groups, config.moe_topk_groups) == (384, 1, 1)
    assert (config.packed_int_bits, config.packed_int_zero_points, config.fp8_scales) == (4, False, None)
    assert config.moe_layers == tuple(range(1, 61)) and config.mtp_layers == 0


DEEPSEEK_V2_LITE = {  # its config.json as released
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "bos_token_id": 100000,
    "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                           "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                                           "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "topk_group": 1,
    "topk_method": "greedy", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400}
# DeepSeek-V2 (236B) differs in size and routing: six of 160 experts within the best 3 of 8 groups.
DEEPSEEK_V2 = {**DEEPSEEK_V2_LITE, "hidden_size": 5120, "intermediate_size": 12288, "q_lora_rank": 1536,
               "moe_intermediate_size": 1536, "n_group": 8, "topk_group": 3, "n_routed_experts": 160,
               "num_hidden_layers": 60, "num_attention_heads": 128, "num_key_value_heads": 128,
               "routed_scaling_factor": 16.0, "topk_method": "group_limited_greedy"}


def test_deepseek_v2_configs_read_as_released():
    """Latents cached as for V3 (interleaved rotation without a rope_interleave field); softmax routing, greedy
    over all experts in V2-Lite, within groups in V2; what transformers would not compute as configured is
    refused."""
    from services.engine.mla import softmax_scale

    lite, full = ModelConfig.from_dict(DEEPSEEK_V2_LITE), ModelConfig.from_dict(DEEPSEEK_V2)
    assert lite.mla and (lite.num_key_value_heads, lite.head_dim, lite.rotary_dim) == (1, 576, 64)
    assert lite.rope_interleaved and lite.q_lora_rank is None and full.q_lora_rank == 1536
    assert (lite.moe_routing, lite.moe_groups, lite.moe_topk_groups, lite.norm_topk_prob) == ("group_softmax", 1, 1,
                                                                                               False)
    assert (full.moe_groups, full.moe_topk_groups, full.routed_scaling_factor) == (8, 3, 16.0)
    assert lite.moe_layers == tuple(range(1, 27)) and lite.shared_expert_intermediate_size == 2 * 1408
    assert softmax_scale(lite) == pytest.approx(192**-0.5 * (0.1 * 0.707 * math.log(40) + 1) ** 2)
    for change, error in [({"scoring_func": "sigmoid"}, "DeepSeek-V2 routes by softmax"),
                          ({"topk_method": "noaux_tc"}, "routes by greedy or group_limited_greedy"),
                          ({"norm_topk_prob": True}, "served as released"),
                          ({"moe_layer_freq": 2}, "served as released"),
                          ({"num_experts_per_tok": None}, "needs num_experts_per_tok"),
                          ({"n_group": None}, "in n_group 0 groups")]:
        with pytest.raises(ModelLoadError, match=error):
            ModelConfig.from_dict({**DEEPSEEK_V2, **change})


def test_a_checkpoint_missing_an_expert_is_refused_naming_it(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file, save_file

    save_checkpoint(CASES["mixtral"](), tmp_path, tiny_model_dir)
    weights = load_file(str(tmp_path / "model.safetensors"))
    del weights["model.layers.2.block_sparse_moe.experts.3.w3.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"layers\.2\.mlp\.experts\.gate_up_proj: missing expert 3 up"):
        OfflineEngine(EngineConfig(model=str(tmp_path), dtype="float32"), SchedulerConfig())


def test_layers_without_rope_are_read_as_transformers_reads_them(checkpoint):
    path, model, _ = checkpoint
    if model.config.model_type in ("exaone4", "cohere2", "afmoe", "exaone_moe", "kolibri1"):  # global layers: no positions
        want = tuple(i for i, kind in enumerate(model.config.layer_types) if kind == "full_attention")
    elif model.config.model_type == "cohere2_moe":  # nor Command A MoE's, but a dense prefix's forced to rotate
        want = tuple(i for i, layer in enumerate(model.model.layers) if layer.self_attn.sliding_window is None
                     and not layer.self_attn.force_rope)
    elif model.config.model_type in ("flint", "lara_mini", "beam"):  # only their sliding layers rotate
        want = tuple(i for i, kind in enumerate(model.config.layer_types) if kind == "full_attention")
    elif model.config.model_type == "granitemoehybrid":  # RoPE only with position_embedding_type "rope"
        want = () if model.config.position_embedding_type == "rope" else tuple(range(3))
    elif model.config.model_type in ("nemotron_h", "jamba", "kimi_linear", "opt", "gpt2", "gpt_bigcode", "bloom",
                                     "mpt", "gpt_neo", "biogpt", "xglm"):  # no RoPE
        assert not any("rotary" in name for name, _ in model.named_modules())
        want = tuple(range(len(_decoder_layers(model))))
    elif model.config.model_type in ("granite_swa", "granitemoe_swa"):  # a base of 0: no RoPE there
        want = tuple(i for i, theta in enumerate(model.config.layer_rope_theta) if not theta)
    elif model.config.model_type == "zamba2":  # its shared blocks' attention rotates only with use_mem_rope
        assert hasattr(model.model, "rotary_emb") == model.config.use_mem_rope
        want = () if model.config.use_mem_rope else tuple(model.config.hybrid_layer_ids)
    elif model.config.model_type == "falcon" and model.config.alibi:  # its rotary module applied nowhere
        want = tuple(range(len(_decoder_layers(model))))
    else:
        want = tuple(i for i, rope in enumerate(getattr(model.config, "no_rope_layers", None) or [1] * 3) if not rope)
    assert ModelConfig.from_dir(path).nope_layers == want
    default = ModelConfig.from_dict(dict(COMMON, architectures=["SmolLM3ForCausalLM"], num_hidden_layers=8))
    assert default.nope_layers == (3, 7)  # every fourth layer, transformers' default interval
    hub = ModelConfig.from_dict(dict(COMMON, architectures=["Exaone4ForCausalLM"], num_hidden_layers=8,
                                     sliding_window=4096, sliding_window_pattern="LLLG"))
    assert hub.nope_layers == (3, 7) and hub.sliding_layers == (0, 1, 2, 4, 5, 6)
    with pytest.raises(ModelLoadError, match=r"layers without RoPE \(3, 8\) outside the 8 layers"):
        dataclasses.replace(hub, nope_layers=(3, 8))


@pytest.mark.parametrize("name", ["qwen3-next", "gemma3", "mixtral", "glm4-moe", "olmo2", "lfm3", "ernie4_5-moe",
                                  "llama4", "gpt-oss", "lfm2-moe", "hunyuan-moe", "phi", "gpt-neox", "falcon-new",
                                  "opt", "gpt2", "gpt-bigcode", "gptj", "zamba2", "granite-swa", "gemma4",
                                  "mimo-v2-flash", "mellum", "nanochat", "hy3", "kolibri1", "biogpt", "persimmon",
                                  "bitnet", "qwen3.5", "aria-text", "cohere-compass", "apertus1.5"])
def test_bf16_first_tokens_round_as_transformers(name, tmp_path, tiny_model_dir):
    """Gemma's and Qwen3-Next's RMSNorms scale by 1 + w, which transformers computes in fp32 from w in the model's
    dtype each time: their weights stay fp32 here (rounded to bf16, Qwen3-Next's logprobs were 0.26 apart on the
    150-token prompt). Gemma's scores scale by query_pre_attn_scalar ** -0.5 inside attention, as there (folded into
    bf16 queries they were 0.19 apart). Experts' outputs are weighed and summed per token, then cast, as
    transformers' grouped experts do (Mixtral's fp32 weights, GLM-4.5's routed and shared experts: rounded row by
    row into a bf16 sum they were up to 0.1 apart). OLMo's, LFM3's and ERNIE 4.5's RoPE rotates in fp32 and casts
    back once, as theirs does, Llama 4's too (its complex product; rounding cos and sin to bf16 first: up to 1.0
    apart). GPT-OSS's sink softmax is shifted by the row's max and taken in bf16, as there; LFM2-MoE's sigmoid
    routing weights stay in its bf16 router's dtype, and Hunyuan's router and weights in fp32, as there; Phi-2's
    gelu_new runs op by op and its parallel block adds (attention + MLP) to the stream, as there. Then bf16
    first-token
    logprobs equal transformers'. Whole
    prompts, as transformers runs them: a chunk boundary rounds otherwise in bf16 (Gated DeltaNet's blocks of 64,
    a window's mask; fp32 hides it)."""
    save_checkpoint(CASES[name](), tmp_path, tiny_model_dir)
    # Loaded in bf16 (a model cast with .to() would round its RoPE frequencies too).
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    engine = OfflineEngine(EngineConfig(model=str(tmp_path), dtype="bfloat16"), SchedulerConfig(chunk_size=512))
    layers = engine.runner.model.model.layers  # an attention layer: the second, or the first there is
    layer = layers[1] if hasattr(layers[1], "self_attn") or hasattr(layers[1], "shared_transformer") else next(
        x for x in layers if hasattr(x, "self_attn"))
    if name in ("qwen3-next", "gemma3"):
        assert layer.input_layernorm.weight.dtype == layer.self_attn.q_norm.weight.dtype == torch.float32
    attn = getattr(layer, "shared_transformer", layer).self_attn  # Zamba2's attends in its shared block
    assert getattr(attn, "qkv_proj", getattr(attn, "q_proj", None)).weight.dtype == torch.bfloat16  # Gemma 4's apart
    g = torch.Generator().manual_seed(50)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (40, 150)]
    got = engine.generate(prompts, [SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=5)] * 2)
    for prompt, comp in zip(prompts, got, strict=True):
        with torch.no_grad():
            want = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1)
        top = comp.logprobs[0].top_logprobs
        assert [lp for _, lp in top] == pytest.approx([want[t].item() for t, _ in top], abs=1e-6)
        assert want[comp.token_ids[0]] == want.max()  # the greedy token (bf16 logits tie often: any of the best)


def test_attention_biases_are_read_as_transformers_builds_them():
    """o_proj's bias follows attention_bias where transformers' attention does (Llama and most), never on the
    architectures whose o_proj has none, Seed-OSS's attention_out_bias; MLP biases where transformers' MLP reads
    mlp_bias (ERNIE's use_bias: every projection), refused where it does not."""
    with pytest.raises(ModelLoadError, match="mlp_bias is set; Qwen3ForCausalLM's MLP has no biases"):
        ModelConfig.from_dict(dict(COMMON, architectures=["Qwen3ForCausalLM"], mlp_bias=True))
    with pytest.raises(ModelLoadError, match="use_bias is set; SeedOssForCausalLM has no projections with biases"):
        ModelConfig.from_dict(dict(COMMON, architectures=["SeedOssForCausalLM"], use_bias=True))
    assert ModelConfig.from_dict(dict(COMMON, architectures=["SeedOssForCausalLM"], mlp_bias=True)).mlp_bias
    ernie = ModelConfig.from_dict(dict(COMMON, architectures=["Ernie4_5ForCausalLM"], use_bias=True))
    assert ernie.attention_bias and ernie.o_proj_bias and ernie.mlp_bias
    seed = ModelConfig.from_dict(dict(COMMON, architectures=["SeedOssForCausalLM"]))
    assert seed.attention_bias and not seed.o_proj_bias
    with pytest.raises(ModelLoadError, match="clip_qkv is 8.0; LlamaForCausalLM does not clip q, k and v"):
        ModelConfig.from_dict(dict(COMMON, architectures=["LlamaForCausalLM"], clip_qkv=8.0))
    assert ModelConfig.from_dict(dict(COMMON, architectures=["OlmoForCausalLM"], clip_qkv=8.0)).clip_qkv == 8.0
    for arch, want in (("LlamaForCausalLM", True), ("Qwen3ForCausalLM", True), ("MistralForCausalLM", False),
                       ("Qwen2ForCausalLM", False), ("Glm4ForCausalLM", False)):
        config = ModelConfig.from_dict(dict(COMMON, architectures=[arch], attention_bias=True, qkv_bias=True))
        assert (config.attention_bias, config.o_proj_bias) == (True, want), arch


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_llama4s_chunked_attention_under_other_chunk_sizes_and_a_cached_prefix(tmp_path, tiny_model_dir, cpu_kernels):
    """Prompt chunks of 5 and 64 tokens against attention chunks of 24 (a step's chunk starting inside one,
    spanning several), and a request whose prefix is read from the cache: the same tokens as transformers."""
    model = save_checkpoint(CASES["llama4"](), tmp_path, tiny_model_dir)
    g = torch.Generator().manual_seed(9)
    shared = torch.randint(3, 4096, (50,), generator=g).tolist()
    prompts = [shared + torch.randint(3, 4096, (n,), generator=g).tolist() for n in (3, 61)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=0)
    for chunk in (5, 64):
        engine = OfflineEngine(EngineConfig(model=str(tmp_path), dtype="float32", cpu_kernels=cpu_kernels),
                               SchedulerConfig(chunk_size=chunk))
        first = engine.generate(prompts[:1], [params])
        second = engine.generate(prompts[1:], [params])  # its first 48 tokens' blocks are cached by the first
        assert second[0].num_cached_prompt_tokens >= 48
        assert_matches_transformers(model, prompts, first + second)


def test_ernie_moe_config_reads_as_released():
    """ERNIE-4.5-21B-A3B-PT's config.json as published: every layer from 1 on routes to 6 of 64 experts, beside
    two shared experts' worth of a shared MLP."""
    raw = {"architectures": ["Ernie4_5_MoeForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
           "hidden_size": 2560, "intermediate_size": 12288, "max_position_embeddings": 131072,
           "model_type": "ernie4_5_moe", "num_attention_heads": 20, "num_key_value_heads": 4, "num_hidden_layers": 28,
           "pad_token_id": 0, "rms_norm_eps": 1e-05, "vocab_size": 103424, "rope_theta": 500000, "use_bias": False,
           "tie_word_embeddings": True, "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
           "moe_intermediate_size": 1536, "moe_k": 6, "moe_layer_interval": 1, "torch_dtype": "bfloat16"}
    config, hf = ModelConfig.from_dict(raw), transformers.Ernie4_5_MoeConfig(**raw)
    # transformers' Ernie4_5_MoeDecoderLayer's rule for a routing layer, on its reading of the config
    routed = [(i + 1) % hf.moe_layer_interval == 0 and hf.moe_layer_start_index <= i <= hf.moe_layer_end_index
              for i in range(hf.num_hidden_layers)]
    assert [config.is_moe(i) for i in range(28)] == routed and not config.is_moe(0)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (64, 6, 1536)
    assert config.shared_expert_intermediate_size == 2 * 1536 and config.head_dim == 128
    assert config.rope_interleaved and config.tie_word_embeddings and config.rope_theta == 500000
    with pytest.raises(ModelLoadError, match="biases on the MLP are set; experts with biases are not supported"):
        ModelConfig.from_dict({**raw, "use_bias": True})


def test_internlm3_checkpoints_run_as_transformers_runs_them(tmp_path, tiny_model_dir):
    """InternLM3 as published (``InternLM3ForCausalLM``, ``qkv_bias`` and ``bias``): transformers runs it as its
    Llama; so does the engine, its biases (when both are set) on every projection."""
    config = transformers.InternLM3Config(head_dim=16, **{**COMMON, "pad_token_id": 0})
    model = save_checkpoint(config, tmp_path, tiny_model_dir)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw = {("qkv_bias" if k == "attention_bias" else "bias" if k == "mlp_bias" else k): v for k, v in raw.items()}
    (tmp_path / "config.json").write_text(json.dumps({**raw, "architectures": ["InternLM3ForCausalLM"]}))
    engine_matches_transformers(tmp_path, model, cpu_kernels=True)
    with pytest.raises(ModelLoadError, match="InternLM3's qkv_bias and bias differ"):
        ModelConfig.from_dict({**raw, "architectures": ["InternLM3ForCausalLM"], "bias": True})
    both = ModelConfig.from_dict({**raw, "architectures": ["InternLM3ForCausalLM"], "qkv_bias": True, "bias": True})
    assert both.attention_bias and both.o_proj_bias and both.mlp_bias


def test_exaone3_checkpoints_run_as_transformers_runs_them(tmp_path, tiny_model_dir):
    """EXAONE 3 / 3.5: transformers runs it as its Llama and saves it so, under GPT-2-style tensor names
    (``transformer.h.N.attn.attention.q_proj``...); as published, its config names fields its own way
    (``num_layers``, ``layer_norm_epsilon``, ``activation_function``). Both serve transformers' tokens."""
    model = save_checkpoint(transformers.ExaoneConfig(rope_theta=1e6, **{**COMMON, "pad_token_id": 0}), tmp_path,
                            tiny_model_dir)
    assert any(name.startswith("transformer.h.0.attn.attention.") for name, _ in iter_weights(tmp_path))
    engine_matches_transformers(tmp_path, model, cpu_kernels=True)
    raw = json.loads((tmp_path / "config.json").read_text())
    names = {"num_hidden_layers": "num_layers", "rms_norm_eps": "layer_norm_epsilon", "hidden_act": "activation_function"}
    published = {names.get(k, k): v for k, v in raw.items()} | {"architectures": ["ExaoneForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(published))
    engine_matches_transformers(tmp_path, model, cpu_kernels=False)
    hub = {"architectures": ["ExaoneForCausalLM"], "activation_function": "silu", "hidden_size": 4096,
           "intermediate_size": 14336, "layer_norm_epsilon": 1e-05, "max_position_embeddings": 32768,
           "num_attention_heads": 32, "num_key_value_heads": 8, "num_layers": 32, "rope_theta": 1000000.0,
           "vocab_size": 102400, "tie_word_embeddings": False, "rope_scaling": {
               "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    config, hf = ModelConfig.from_dict(hub), transformers.ExaoneConfig(**hub)
    assert (config.num_hidden_layers, config.rms_norm_eps, config.rope_theta, config.rope_type) == (
        hf.num_hidden_layers, hf.rms_norm_eps, hf.rope_parameters["rope_theta"], hf.rope_parameters["rope_type"])


def test_position_fields_the_engine_cannot_compute_are_refused():
    base = ModelConfig.from_dict(dict(COMMON))
    with pytest.raises(ModelLoadError, match="floor_scale .* must be > 0"):
        dataclasses.replace(base, nope_temperature=(0.0, 0.1))
    with pytest.raises(ModelLoadError, match="original_max_position_embeddings .* must be > 0"):
        dataclasses.replace(base, q_position_scale=(0.1, 0.0))
    with pytest.raises(ModelLoadError, match="chunked attention in layers"):
        dataclasses.replace(base, chunked_layers=(0,), attention_chunk=24, sliding_window=16)
    with pytest.raises(ModelLoadError, match="chunked attention in layers"):
        dataclasses.replace(base, chunked_layers=(5,), attention_chunk=24)


def test_afmoe_configs_read_as_transformers_reads_them():
    """AFMoE's defaults (Trinity's shape: 1 dense layer, 3 sliding layers with RoPE to 1 global without), and a
    config with its own pattern, dense layers and shared experts, read as transformers' AfmoeConfig reads them."""
    for fields in ({}, {"global_attn_every_n_layers": 2, "num_dense_layers": 3, "num_shared_experts": 1,
                        "route_scale": 2.826, "mup_enabled": True, "num_key_value_heads": 4, "sliding_window": 2048}):
        raw = {"architectures": ["AfmoeForCausalLM"], "vocab_size": 200192, "hidden_size": 2048,
               "intermediate_size": 6144, "num_hidden_layers": 32, "num_attention_heads": 16, **fields}
        config, hf = ModelConfig.from_dict(raw), transformers.AfmoeConfig(**raw)
        local = [t == "sliding_attention" for t in hf.layer_types]
        assert [config.slides(i) for i in range(32)] == local and config.sliding_window == hf.sliding_window
        assert [i not in config.nope_layers for i in range(32)] == local  # RoPE where the layer slides only
        assert [config.is_moe(i) for i in range(32)] == [i >= hf.num_dense_layers for i in range(32)]
        assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                config.shared_expert_intermediate_size, config.routed_scaling_factor) == (
            hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size,
            hf.num_shared_experts * hf.moe_intermediate_size, hf.route_scale)
        assert (config.head_dim, config.num_key_value_heads, config.tie_word_embeddings) == (
            hf.head_dim, hf.num_key_value_heads, hf.tie_word_embeddings)
        assert config.embed_scale == (2048**0.5 if hf.mup_enabled else 1.0)
        assert config.attn_output_gate == "own" and config.sandwich_norms and config.qk_norm and not config.is_llama_like


def test_k_exaone_configs_and_checkpoints_read_as_transformers_reads_them(tmp_path, tiny_model_dir):
    """K-EXAONE (ExaoneMoe): its defaults and mlp_layer_types as transformers reads them; its
    multi-token-prediction block (``mtp.*``) skipped as transformers skips it."""
    for fields in ({}, {"mlp_layer_types": ["dense", "sparse", "dense"] + ["sparse"] * 29, "sliding_window_pattern": 2,
                        "num_shared_experts": 2, "routed_scaling_factor": 1.5}):
        raw = {"architectures": ["ExaoneMoeForCausalLM"], "vocab_size": 102400, "hidden_size": 4096,
               "intermediate_size": 16384, "num_hidden_layers": 32, "num_attention_heads": 32, **fields}
        config, hf = ModelConfig.from_dict(raw), transformers.ExaoneMoeConfig(**raw)
        layers = hf.num_hidden_layers
        assert [config.is_moe(i) for i in range(layers)] == [t == "sparse" for t in hf.mlp_layer_types]
        assert [config.slides(i) for i in range(layers)] == [t == "sliding_attention" for t in hf.layer_types]
        assert [i not in config.nope_layers for i in range(layers)] == [t == "sliding_attention" for t in hf.layer_types]
        assert (config.num_experts, config.num_experts_per_tok, config.shared_expert_intermediate_size,
                config.routed_scaling_factor, config.sliding_window, config.pre_norms, config.qk_norm) == (
            hf.num_experts, hf.num_experts_per_tok, hf.num_shared_experts * hf.moe_intermediate_size,
            hf.routed_scaling_factor, hf.sliding_window, True, True)
    model = save_checkpoint(CASES["exaone-moe"](), tmp_path, tiny_model_dir)
    weights = dict(iter_weights(tmp_path))
    save_file({**weights, "mtp.layers.0.eh_proj.weight": torch.zeros(64, 128)}, str(tmp_path / "model.safetensors"))
    engine_matches_transformers(tmp_path, model, cpu_kernels=True, lengths=(30,))


HUNYUAN_A13B = {  # its config.json as released
    "architectures": ["HunYuanMoEV1ForCausalLM"], "attention_bias": False, "attention_head_dim": 128, "bos_token_id": 1,
    "cla_share_factor": 2, "eos_token_id": 127960, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 3072, "max_position_embeddings": 32768, "model_type": "hunyuan_v1_moe",
    "moe_intermediate_size": [3072] * 32, "moe_topk": [8] * 32, "num_attention_heads": 32, "num_experts": 64,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_shared_expert": [1] * 32, "rms_norm_eps": 1e-05,
    "rope_scaling": {"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "type": "dynamic"}, "rope_theta": 10000.0, "tie_word_embeddings": True,
    "use_cla": False, "use_mixed_mlp_moe": True, "use_qk_norm": True, "vocab_size": 128167}


def test_hunyuan_a13b_as_published():
    """Hunyuan-A13B's config.json: NTK-alpha RoPE (its frequencies equal transformers' rotary embedding's), per-layer
    lists of equal top k; lists that differ and cross-layer attention refused."""
    from transformers.models.hunyuan_v1_moe.modeling_hunyuan_v1_moe import HunYuanMoEV1RotaryEmbedding

    from services.engine.rope import inverse_frequencies

    config, hf = ModelConfig.from_dict(HUNYUAN_A13B), transformers.HunYuanMoEV1Config(**HUNYUAN_A13B)
    assert torch.equal(inverse_frequencies(config), HunYuanMoEV1RotaryEmbedding(hf).inv_freq)
    assert config.rope_scaling is None and config.qk_norm and config.qk_norm_after_rope
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
            config.shared_expert_intermediate_size) == (64, 8, 3072, 3072)
    assert config.moe_layers == tuple(range(32)) and config.tie_word_embeddings
    with pytest.raises(ModelLoadError, match="moe_topk differs between layers"):
        ModelConfig.from_dict({**HUNYUAN_A13B, "moe_topk": [8] * 31 + [4]})
    with pytest.raises(ModelLoadError, match="use_cla is set"):
        ModelConfig.from_dict({**HUNYUAN_A13B, "use_cla": True})
    with pytest.raises(ModelLoadError, match="rope_scaling type 'dynamic' is not supported"):  # dynamic NTK by length
        ModelConfig.from_dict({**HUNYUAN_A13B, "rope_scaling": {"type": "dynamic", "factor": 2.0}})


def _save_as_released(path, weights: dict, buffers: str | None, rotary: bool = False, layers: int = 3) -> None:
    """``weights`` as the checkpoint at ``path`` (replacing its files), with the buffers older code saved beside the
    weights in each layer's attention (``buffers``: its name pattern; None: none): the causal mask, the masked
    bias, with ``rotary`` RoPE's frequencies."""
    for i in range(layers if buffers else 0):
        at = buffers.format(i)
        weights |= {f"{at}bias": torch.ones(1, 1, 8, 8, dtype=torch.bool), f"{at}masked_bias": torch.tensor(-1e9)}
        if rotary:
            weights[f"{at}rotary_emb.inv_freq"] = torch.ones(8)
    for f in path.glob("*.safetensors"):
        f.unlink()
    save_file(weights, path / "model.safetensors")


def test_pythia_as_published_runs_as_transformers_runs_it(tmp_path, tiny_model_dir):
    """GPT-NeoX as Pythia was released (transformers 4.24): ``rotary_pct`` and ``rotary_emb_base`` at the top level,
    and tensors beside the weights that transformers ignores (the causal mask and RoPE buffers older code saved),
    which the engine ignores too; the config reads as transformers reads it."""
    config = transformers.GPTNeoXConfig(rotary_pct=0.5, **{k: v for k, v in COMMON.items() if k != "num_key_value_heads"})
    model = save_checkpoint(config, tmp_path, tiny_model_dir)
    raw = json.loads((tmp_path / "config.json").read_text())
    params = raw.pop("rope_parameters")
    raw |= {"rotary_pct": params["partial_rotary_factor"], "rotary_emb_base": params["rope_theta"],
            "num_key_value_heads": 2}  # a stray field: transformers' GPT-NeoX has no grouped queries
    (tmp_path / "config.json").write_text(json.dumps(raw))
    _save_as_released(tmp_path, dict(iter_weights(tmp_path)), "gpt_neox.layers.{}.attention.", rotary=True)
    engine_matches_transformers(tmp_path, model, cpu_kernels=False)
    hub = {"architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
           "hidden_size": 512, "intermediate_size": 2048, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
           "model_type": "gpt_neox", "num_attention_heads": 8, "num_hidden_layers": 6, "rotary_emb_base": 10000,
           "rotary_pct": 0.25, "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 50304}
    ours, hf = ModelConfig.from_dict(hub), transformers.GPTNeoXConfig(**hub)
    assert (ours.partial_rotary_factor, ours.rope_theta) == (hf.rope_parameters["partial_rotary_factor"],
                                                             hf.rope_parameters["rope_theta"]) == (0.25, 10000)
    assert ours.num_key_value_heads == ours.num_attention_heads == 8 and ours.rms_norm_eps == hf.layer_norm_eps
    assert ours.parallel_block and ours.parallel_mlp_norm and ours.hidden_act == "gelu"
    assert ours.attention_bias and ours.o_proj_bias and ours.mlp_bias and not ours.tie_word_embeddings


def test_falcon_configs_read_as_released():
    """Falcon-7B (multi-query, one norm), Falcon-40B (the new architecture: grouped key/value heads, a norm each) and
    Falcon 2 11B (the new architecture on one norm) and Falcon-RW-1B (ALiBi, per-head query_key_value, pre-norm
    with biases) as published, read as transformers reads them."""
    common = {"architectures": ["FalconForCausalLM"], "alibi": False, "bias": False, "bos_token_id": 11,
              "eos_token_id": 11, "layer_norm_epsilon": 1e-05, "model_type": "falcon", "parallel_attn": True,
              "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0, "attention_dropout": 0.0}
    seven = {**common, "hidden_size": 4544, "multi_query": True, "new_decoder_architecture": False,
             "num_attention_heads": 71, "num_hidden_layers": 32, "vocab_size": 65024}
    forty = {**common, "hidden_size": 8192, "new_decoder_architecture": True, "num_kv_heads": 8,
             "num_attention_heads": 128, "num_hidden_layers": 60, "vocab_size": 65024}
    eleven = {**common, "hidden_size": 4096, "new_decoder_architecture": True, "num_kv_heads": 8,
              "num_attention_heads": 32, "num_hidden_layers": 60, "num_ln_in_parallel_attn": 1,
              "ffn_hidden_size": 16384, "max_position_embeddings": 8192, "rope_theta": 500042.0, "vocab_size": 65024}
    for raw, layout, two_norms in ((seven, "multi_query", False), (forty, "grouped", True),
                                   (eleven, "grouped", False)):
        ours, hf = ModelConfig.from_dict(raw), transformers.FalconConfig(**raw)
        assert (ours.num_key_value_heads, ours.head_dim, ours.intermediate_size) == (
            hf.num_key_value_heads, hf.head_dim, hf.ffn_hidden_size)
        assert ours.rope_theta == hf.rope_parameters["rope_theta"] and ours.tie_word_embeddings
        assert ours.parallel_block and ours.parallel_mlp_norm == two_norms and ours.qkv_layout == layout
        assert not (ours.attention_bias or ours.o_proj_bias or ours.mlp_bias) and ours.hidden_act == "gelu"
    rw = {**common, "alibi": True, "bias": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 2048,
          "multi_query": False, "new_decoder_architecture": False, "num_attention_heads": 32, "num_hidden_layers": 24,
          "parallel_attn": False, "vocab_size": 50304}
    ours = ModelConfig.from_dict(rw)
    assert (ours.alibi_bias_max, ours.alibi_bf16, ours.qkv_layout, ours.parallel_block) == (8.0, True, "per_head",
                                                                                            False)
    assert len(ours.nope_layers) == 24 and ours.attention_bias and ours.mlp_bias and ours.num_key_value_heads == 32
    config = ModelConfig.from_dict(forty)
    for fields, fragment in (({"qkv_layout": "multi_query"}, "laid out 'multi_query' for 128 query and 8"),
                             ({"qkv_layout": "interleaved"}, "laid out 'interleaved'"),
                             ({"parallel_block": False}, "without parallel_block"),
                             ({"learned_positions": -2}, "at offset -2")):
        with pytest.raises(ModelLoadError, match=fragment):
            dataclasses.replace(config, **fields)


def test_falcon_rw_past_256_positions_matches_transformers(tmp_path, tiny_model_dir):
    """Past 256 positions bf16 no longer holds every key's bias exactly: transformers' Falcon-RW biases by the
    rounded product at the key's absolute position, which the engine reproduces (a relative bias rounded alike
    differs); chunks of 16 over a prefix, and decodes."""
    model = save_checkpoint(CASES["falcon-rw-6-heads"](), tmp_path, tiny_model_dir)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (300, 480)]
    greedy_matches_transformers(tmp_path, model, prompts, cpu_kernels=True)


@pytest.mark.parametrize("case", ["opt", "gpt2"])
def test_opt_and_gpt2_as_released_run_as_transformers_runs_them(case, tmp_path, tiny_model_dir):
    """OPT's and GPT-2's checkpoints as released were saved from the base model (``decoder.layers...``,
    ``h.0.attn...``), GPT-2's with the causal-mask buffers older code saved beside the weights; both serve
    transformers' tokens."""
    model = save_checkpoint(CASES[case](), tmp_path, tiny_model_dir)
    prefix = "model." if case == "opt" else "transformer."
    weights = {name.removeprefix(prefix): t for name, t in iter_weights(tmp_path) if name != "lm_head.weight"}
    _save_as_released(tmp_path, weights, "h.{}.attn." if case == "gpt2" else None)
    engine_matches_transformers(tmp_path, model, cpu_kernels=False)
    assert report(tmp_path)["positions"] == "learned, absolute: a table of 512 added to the embeddings"


def test_opt_and_gpt2_configs_read_as_released():
    """OPT-125M's and GPT-2's config.json as published, read as transformers reads them; OPT-350M's norms after the
    sublayers and projected embeddings, and GPT-2 scaled by layer, refused."""
    opt = {"activation_dropout": 0.0, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
           "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": True, "dropout": 0.1,
           "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768, "init_std": 0.02, "layerdrop": 0.0,
           "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 12, "num_hidden_layers": 12,
           "pad_token_id": 1, "prefix": "</s>", "vocab_size": 50272, "word_embed_proj_dim": 768}
    gpt2 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
            "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "layer_norm_epsilon": 1e-05,
            "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
            "resid_pdrop": 0.1, "vocab_size": 50257}
    for raw, hf, offset in ((opt, transformers.OPTConfig(**opt), 2), (gpt2, transformers.GPT2Config(**gpt2), 0)):
        ours = ModelConfig.from_dict(raw)
        assert (ours.hidden_size, ours.num_hidden_layers, ours.num_attention_heads, ours.num_key_value_heads,
                ours.max_position_embeddings, ours.vocab_size) == (
            hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_attention_heads,
            hf.max_position_embeddings, hf.vocab_size)
        assert ours.intermediate_size == 3072 and ours.hidden_act == hf.activation_function
        assert ours.learned_positions == offset and ours.nope_layers == tuple(range(12)) and ours.tie_word_embeddings
        assert ours.attention_bias and ours.o_proj_bias and ours.mlp_bias and not ours.mlp_gated
    with pytest.raises(ModelLoadError, match="do_layer_norm_before is false"):
        ModelConfig.from_dict({**opt, "do_layer_norm_before": False, "word_embed_proj_dim": 512})
    with pytest.raises(ModelLoadError, match="word_embed_proj_dim 512 differs"):
        ModelConfig.from_dict({**opt, "word_embed_proj_dim": 512})
    with pytest.raises(ModelLoadError, match="scale_attn_by_inverse_layer_idx"):
        ModelConfig.from_dict({**gpt2, "scale_attn_by_inverse_layer_idx": True})


def test_gptj_and_starcoder_configs_read_as_released(tmp_path, tiny_model_dir):
    """GPT-J-6B's and StarCoder's config.json as published, read as transformers reads them; a GPT-J checkpoint as
    released (saved from the base model, with the mask buffers older code saved) serves transformers' tokens."""
    gptj = {"activation_function": "gelu_new", "architectures": ["GPTJForCausalLM"], "attn_pdrop": 0.0,
            "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256, "gradient_checkpointing": False,
            "layer_norm_epsilon": 1e-05, "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_inner": None,
            "n_layer": 28, "n_positions": 2048, "resid_pdrop": 0.0, "rotary": True, "rotary_dim": 64,
            "scale_attn_weights": True, "tie_word_embeddings": False, "vocab_size": 50400}
    starcoder = {"activation_function": "gelu", "architectures": ["GPTBigCodeForCausalLM"],
                 "attention_softmax_in_fp32": True, "multi_query": True, "attn_pdrop": 0.1, "bos_token_id": 0,
                 "embd_pdrop": 0.1, "eos_token_id": 0, "inference_runner": 0, "layer_norm_epsilon": 1e-05,
                 "max_batch_size": None, "max_sequence_length": None, "model_type": "gpt_bigcode", "n_embd": 6144,
                 "n_head": 48, "n_inner": 24576, "n_layer": 40, "n_positions": 8192, "pad_key_length": True,
                 "pre_allocate_kv_cache": False, "resid_pdrop": 0.1, "scale_attention_softmax_in_fp32": True,
                 "scale_attn_weights": True, "vocab_size": 49152}
    ours = ModelConfig.from_dict(gptj)
    assert (ours.head_dim, ours.rotary_dim, ours.intermediate_size, ours.num_key_value_heads) == (256, 64, 16384, 16)
    assert ours.rope_interleaved and ours.parallel_block and ours.lm_head_bias and not ours.tie_word_embeddings
    assert not (ours.attention_bias or ours.o_proj_bias) and ours.mlp_bias and ours.rope_theta == 10000
    ours = ModelConfig.from_dict(starcoder)
    assert (ours.num_key_value_heads, ours.head_dim, ours.intermediate_size, ours.max_position_embeddings) == (
        1, 128, 24576, 8192)
    assert ours.learned_positions == 0 and ours.qkv_layout is None and ours.hidden_act == "gelu"
    model = save_checkpoint(CASES["gptj"](), tmp_path, tiny_model_dir)
    _save_as_released(tmp_path, {name.removeprefix("transformer."): t for name, t in iter_weights(tmp_path)},
                      "h.{}.attn.")
    engine_matches_transformers(tmp_path, model, cpu_kernels=False)


def test_bloom_as_released_runs_as_transformers_runs_it(tmp_path, tiny_model_dir):
    """BLOOM's checkpoints as released were saved from the base model (``word_embeddings...``, ``h.0...``, no
    ``lm_head``: tied); they serve transformers' tokens, with the kernels and without."""
    model = save_checkpoint(CASES["bloom"](), tmp_path, tiny_model_dir)
    weights = {name.removeprefix("transformer."): t for name, t in iter_weights(tmp_path) if name != "lm_head.weight"}
    _save_as_released(tmp_path, weights, None)
    for cpu_kernels in (True, False):
        engine_matches_transformers(tmp_path, model, cpu_kernels=cpu_kernels, lengths=(3, 40, 130))
    assert report(tmp_path)["positions"] == "ALiBi: each head's scores biased by distance (slopes 2^-(8i/n))"


def test_bloom_and_mpt_configs_read_as_released():
    """BLOOM-560M's and MPT-7B's config.json as published (MPT's under its remote code's architecture name), read as
    transformers reads them; what transformers' MPT would not run as trained, and BLOOM's post-norm residual,
    refused."""
    bloom = {"apply_residual_connection_post_layernorm": False, "architectures": ["BloomForCausalLM"],
             "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True,
             "bos_token_id": 1, "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 1024, "initializer_range": 0.02,
             "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True, "model_type": "bloom", "n_head": 16,
             "n_inner": None, "n_layer": 24, "offset_alibi": 100, "pad_token_id": 3, "pretraining_tp": 1,
             "skip_bias_add": True, "skip_bias_add_qkv": False, "slow_but_exact": False, "unk_token_id": 0,
             "use_cache": True, "vocab_size": 250880}
    ours, hf = ModelConfig.from_dict(bloom), transformers.BloomConfig(**bloom)
    assert (ours.hidden_size, ours.num_attention_heads, ours.num_key_value_heads, ours.num_hidden_layers,
            ours.intermediate_size, ours.rms_norm_eps) == (hf.hidden_size, hf.n_head, hf.n_head, hf.n_layer,
                                                           4 * hf.hidden_size, hf.layer_norm_epsilon)
    assert (ours.alibi_bias_max, ours.embed_norm, ours.qkv_layout, ours.hidden_act) == (8, True, "per_head",
                                                                                        "bloom_gelu")
    assert ours.nope_layers == tuple(range(24)) and ours.tie_word_embeddings and ours.max_position_embeddings == 2048
    assert ours.attention_bias and ours.o_proj_bias and ours.mlp_bias and ours.norm_bias
    assert ModelConfig.from_dict({**bloom, "n_embed": 512}).hidden_size == 512  # transformers reads it first
    with pytest.raises(ModelLoadError, match="apply_residual_connection_post_layernorm is set"):
        ModelConfig.from_dict({**bloom, "apply_residual_connection_post_layernorm": True})

    attn = {"alibi": True, "alibi_bias_max": 8, "attn_impl": "torch", "attn_pdrop": 0,
            "attn_type": "multihead_attention", "attn_uses_sequence_id": False, "clip_qkv": None, "prefix_lm": False,
            "qk_ln": False, "softmax_scale": None}
    mpt = {"architectures": ["MPTForCausalLM"], "attn_config": attn, "d_model": 4096, "emb_pdrop": 0,
           "embedding_fraction": 1.0, "expansion_ratio": 4, "init_device": "cpu", "learned_pos_emb": True,
           "logit_scale": None, "max_seq_len": 2048, "model_type": "mpt", "n_heads": 32, "n_layers": 32,
           "no_bias": True, "norm_type": "low_precision_layernorm", "resid_pdrop": 0,
           "tokenizer_name": "EleutherAI/gpt-neox-20b", "torch_dtype": "bfloat16", "use_cache": False, "verbose": 0,
           "vocab_size": 50432}
    ours, hf = ModelConfig.from_dict(mpt), transformers.MptConfig(**mpt)
    assert (ours.hidden_size, ours.num_attention_heads, ours.num_key_value_heads, ours.num_hidden_layers,
            ours.intermediate_size, ours.max_position_embeddings) == (hf.d_model, hf.n_heads, hf.n_heads, hf.n_layers,
                                                                      4 * hf.d_model, hf.max_seq_len)
    assert (ours.alibi_bias_max, ours.clip_qkv, ours.attn_scale, ours.hidden_act) == (8, None, None, "gelu")
    assert ours.layer_norm and not (ours.norm_bias or ours.attention_bias or ours.o_proj_bias or ours.mlp_bias)
    assert ours.architecture == "MptForCausalLM" and ours.tie_word_embeddings and not ours.embed_norm
    for change, fragment in (({"attn_config": {**attn, "alibi": False}}, r"\{'alibi': False\}"),
                             ({"attn_config": {**attn, "qk_ln": True}}, r"\{'qk_ln': True\}"),
                             ({"attn_config": {**attn, "alibi_bias_max": 16}}, r"\{'alibi_bias_max': 16\}"),
                             ({"attn_config": {**attn, "attn_type": "grouped_query_attention"}}, "grouped_query"),
                             ({"no_bias": False}, "no_bias False"), ({"logit_scale": 0.5}, "logit_scale 0.5"),
                             ({"expansion_ratio": 8}, "expansion_ratio 8")):
        with pytest.raises(ModelLoadError, match=fragment):
            ModelConfig.from_dict({**mpt, **change})
    config = ModelConfig.from_dict(mpt)
    for fields in ({"alibi_bias_max": 0.0}, {"nope_layers": (0,)}, {"sliding_window": 64}, {"learned_positions": 0}):
        with pytest.raises(ModelLoadError, match="ALiBi"):
            dataclasses.replace(config, **fields)
