"""The architecture of a Llama-family checkpoint, parsed from its Hugging Face ``config.json``.

Llama, Mistral, Qwen2 (biases on q/k/v), Qwen3 (an RMSNorm over each head of q and k before RoPE), Phi-3
(q/k/v and gate/up stored fused, as the engine computes them) and Gemma 2 / 3 (below) share one decoder
here, their differences as fields. Sliding-window attention is read as transformers reads it (see
``_sliding_layers``): Mistral's and Phi-3's ``sliding_window`` applies to every layer; Qwen2/3's only with
``use_sliding_window``, to the layers ``layer_types`` names ``sliding_attention``; Gemma's to its local layers.

Gemma 2 and 3 (``Gemma2ForCausalLM``; ``Gemma3ForCausalLM``, the text model): RMSNorm weights stored as an
offset from 1, norms on each sublayer's output as well as its input ("sandwich"), GELU (tanh) gating,
embeddings scaled by sqrt(hidden_size), attention scaled by ``query_pre_attn_scalar``; Gemma 2 soft-caps
attention scores and final logits (``cap * tanh(x / cap)``) and slides every other layer; Gemma 3 has q/k
norms and a RoPE base of its own for the sliding layers.

Also: SmolLM3 (layers without RoPE), Granite (scalar multipliers), Seed-OSS (q/k/v biases), GLM-4 (Gemma's
sandwich norms, RoPE over half of each head in interleaved pairs), OLMo 2 and 3 (norms on
sublayer outputs only, q/k normed over whole projections), EXAONE 4 (OLMo 2's norm placement, Qwen3's q/k
norms, local layers with RoPE and global ones without; K-EXAONE, its MoE, the same attention with pre-norms), Cohere's Command R / R+ and Command R7B / A (LayerNorms,
attention and MLP in parallel on one norm, RoPE in interleaved pairs, scaled logits; Command R7B / A slide
three of every four layers, with RoPE, the fourth global without), ERNIE 4.5 (Llama with RoPE in interleaved
pairs), Ministral 3 (Mistral with queries scaled with position), InternLM3, EXAONE 3, GLM-4.7-Flash, Youtu-LLM and MiniCPM5-MoE
(``aliases.py``: served as Llama, DeepSeek-V3 or GLM-4.5), Qwen3-Next, Qwen3.5, Granite 4.0-H and LFM2
(``aliases.py``; their Gated DeltaNet, Mamba-2 and short-convolution layers: ``linear_attention_config.py``), Arcee's AFMoE (``afmoe.py``), Hunyuan dense and MoE (``hunyuan.py``), Nemotron-H (``nemotron_h.py``), Mamba, Falcon Mamba and Mamba-2 (``mamba.py``), Apertus (Arcee's ungated MLP with a learned xIELU activation, Qwen3's q/k norms), Llama 4
(``llama4.py``), and mixtures of
experts (Mixtral, Qwen2/3-MoE,
OLMoE, GPT-OSS; their fields in ``moe_config.py``). GPT-OSS also has biases on every attention projection and
a learned sink logit per head in each softmax. FP8 and MXFP4 checkpoints' scaling is read by
``quant_config.py``."""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from services.common.errors import InvalidArgument, ModelLoadError
from services.common.lora_shape import ModelShape
from services.engine.afmoe import ARCH as AFMOE
from services.engine.afmoe import afmoe_fields
from services.engine.aliases import ALIASES, aliased
from services.engine.falcon import ARCH as FALCON
from services.engine.falcon_h1 import Multipliers
from services.engine.gemma4 import ARCH as GEMMA4
from services.engine.gemma4 import Gemma4Shape
from services.engine.gpt_neox import ARCH as GPT_NEOX
from services.engine.gptj import ARCH as GPTJ
from services.engine.hunyuan import ARCHS as HUNYUANS
from services.engine.hunyuan import hunyuan_fields, ntk_alpha_rope
from services.engine.linear_attention_config import LinearShape, Mamba2Shape
from services.engine.llama4 import ARCH as LLAMA4
from services.engine.llama4 import llama4_fields, llama4_nope_layers
from services.engine.mamba import ARCHS as ATTENTION_FREE
from services.engine.mla_config import check_mla, mla_fields
from services.engine.moe_config import MOE_DEFAULTS, check_moe, moe_fields
from services.engine.nemotron_h import ARCH as NEMOTRON_H
from services.engine.quant_config import quant_fields
from services.engine.vision_language import VISION_LANGUAGE, text_model_config
from services.engine.weight_names import model_name
from services.engine.zamba2 import SharedBlocks

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM",
                           "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "SmolLM3ForCausalLM",
                           "GraniteForCausalLM", "SeedOssForCausalLM", "Olmo2ForCausalLM", "OlmoeForCausalLM",
                           "Exaone4ForCausalLM", "GptOssForCausalLM", "Glm4MoeForCausalLM", "MiniMaxM2ForCausalLM",
                           "Dots1ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Glm4ForCausalLM",
                           "Olmo3ForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM",
                           "ArceeForCausalLM", "Llama4ForCausalLM", "CohereForCausalLM", "Cohere2ForCausalLM",
                           "Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM", "ApertusForCausalLM",
                           "Ministral3ForCausalLM", AFMOE, "ExaoneMoeForCausalLM", *HUNYUANS)
_OLMOS = ("Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM")
# RoPE in fp32, cast back after (transformers' cos and sin stay fp32 for these; Llama 4 rotates by complex fp32).
_ROPE_IN_FP32 = ("OlmoForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoHybridForCausalLM", "FlexOlmoForCausalLM", "Lfm3ForCausalLM",
                 "Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM", "Llama4ForCausalLM")
_POST_NORMS = ("Olmo2ForCausalLM", "Olmo3ForCausalLM", "Exaone4ForCausalLM")  # norms on sublayer outputs only
# EXAONE 4 and K-EXAONE (its MoE, with pre-norms): local layers with RoPE and a window, global ones without.
_EXAONES = ("Exaone4ForCausalLM", "ExaoneMoeForCausalLM")
_WHOLE_QK_NORM = (*_OLMOS, "MiniMaxM2ForCausalLM")  # q and k normed over their whole projections
_GPT_OSS = ("GptOssForCausalLM",)
_GRANITES = ("GraniteForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM")  # the multipliers
# transformers' RoPE bases where config.json leaves them out, when not 10000.
_DEFAULT_THETA = {"Gemma3ForCausalLM": 1e6, "Olmo3ForCausalLM": 500000.0, "Llama4ForCausalLM": 500000.0,
                  "Ernie4_5ForCausalLM": 500000.0, "Ernie4_5_MoeForCausalLM": 500000.0}
_PARTIAL_ROTARY = ("Phi3ForCausalLM", "Glm4ForCausalLM", "Glm4MoeForCausalLM", "MiniMaxM2ForCausalLM")
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096}
_GEMMAS = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
_COHERES = ("CohereForCausalLM", "Cohere2ForCausalLM")
_ERNIES = ("Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM")
# Architectures whose attention output projection has no bias whatever attention_bias says (transformers';
# the others' has one with attention_bias, Seed-OSS's with attention_out_bias).
_O_PROJ_UNBIASED = ("MistralForCausalLM", "Qwen2ForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM",
                    "Qwen2MoeForCausalLM", "Exaone4ForCausalLM", "ExaoneMoeForCausalLM", "Glm4ForCausalLM",
                    "Glm4MoeForCausalLM", "MiniMaxM2ForCausalLM", "Ministral3ForCausalLM")
_APERTUS_ROPE = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0}
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu_new", "relu2", "xielu", "gelu", "relu", "bloom_gelu")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")


@dataclass(frozen=True)
class ModelConfig:
    """What the engine needs to build the model; names follow ``transformers.LlamaConfig``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # rope_scaling as in the checkpoint ({"rope_type": "llama3", "factor": ..., ...}) or None.
    rope_scaling: dict[str, Any] | None = None
    # The share of each head RoPE rotates (its first rotary_dim features; Phi-4-mini: 0.75); the rest pass.
    partial_rotary_factor: float = 1.0
    # The context served when capped below max_position_embeddings (--max-model-len), else None. LongRoPE
    # picks its frequencies by it.
    served_context: int | None = None
    tie_word_embeddings: bool = False
    # Qwen2 puts biases on q/k/v; Llama checkpoints may set attention_bias. GPT-OSS has one on the output
    # projection too (o_proj_bias), and a learned logit per head that joins each softmax and weighs no value
    # (attention_sinks: a head may attend to nothing).
    attention_bias: bool = False
    o_proj_bias: bool = False
    attention_sinks: bool = False
    # GraniteSWA's sinks: the softmax's output scaled by sigmoid(logsumexp(scores) - sink), as transformers computes
    # them (GPT-OSS's softmax with one more logit in exact arithmetic; rounded otherwise in bf16).
    sinks_scale_output: bool = False
    # Attention's output times the sigmoid of a projection of the layer's input, per feature, before o_proj:
    # "own" (AFMoE: its self_attn.gate_proj, no bias), "in_query" (MiniCPM5-MoE: q_proj stores each head's
    # query rows then its gate's, with q's bias; split as they load), "per_head" (LFM3: one sigmoid gate per head,
    # its g_proj); None: not gated.
    attn_output_gate: str | None = None
    # Laguna: that gate is the softplus of the projection (in fp32, cast back), not its sigmoid.
    attn_gate_softplus: bool = False
    # Qwen3 normalizes each head of q and k (RMSNorm over head_dim) before RoPE; OLMo 2 and OLMoE normalize
    # the whole q and k projections instead (qk_norm_whole).
    qk_norm: bool = False
    qk_norm_whole: bool = False
    # False: no norms on sublayer inputs, only on their outputs before the residual add (OLMo 2's
    # post_attention_layernorm and post_feedforward_layernorm).
    pre_norms: bool = True
    # OLMo Hybrid: layers that take pre-norms where pre_norms is off (its linear layers; its attention layers
    # post-norm as OLMo 2's).
    pre_norm_layers: tuple[int, ...] = ()
    # Cohere (Command R, R+, R7B, A): LayerNorms (mean subtracted, no bias, in fp32) where the others have
    # RMSNorms (its q/k norms, with use_qk_norm, have a weight per head); one norm per layer, whose output both
    # attention and the MLP read, both adding to the stream (parallel_block); logits times logit_scale.
    layer_norm: bool = False
    parallel_block: bool = False
    # With parallel_block: the MLP reads a norm of its own (post_attention_layernorm) of the same stream
    # (GPT-NeoX, Falcon's new architecture); else the one norm attention reads.
    parallel_mlp_norm: bool = False
    # A fused query_key_value projection's layout, split into q, k and v as it loads
    # (weight_names.split_query_key_value): "per_head" (GPT-NeoX, Falcon and GPTBigCode without multi_query), "grouped" (Falcon's
    # new architecture), "multi_query" (Falcon-7B); None: q, k and v come apart (or as Phi-3's contiguous qkv_proj).
    qkv_layout: str | None = None
    # Learned absolute positions (OPT, GPT-2): a table of max_position_embeddings + this offset rows whose row
    # position + offset is added to each token's embedding (OPT's 2, GPT-2's 0); None: none (RoPE or no positions).
    learned_positions: int | None = None
    # XGLM: the row of its sinusoidal positions' table (computed as it loads: xglm.py) that transformers zeroes,
    # pad_token_id's (a live position's where that is 2 or more); None: none.
    sinusoidal_padding_row: int | None = None
    # ALiBi (BLOOM, MPT): no position encoding in q or k; each head adds slope * (key - query position) to its
    # scores instead, its slope from a geometric series set by this (attention.alibi_slopes: BLOOM's and MPT's
    # formulas agree; both run with 8). None: no ALiBi.
    alibi_bias_max: float | None = None
    # Falcon-RW's ALiBi as transformers runs it: each bias bf16(bf16(slope) * key position) / sqrt(head_dim), by the
    # key's absolute position (attention._alibi_mask, and the C kernels' alibi_bias).
    alibi_bf16: bool = False
    # BLOOM, nanochat: a norm (BLOOM's with a bias) of the token embeddings before the first layer.
    embed_norm: bool = False
    logit_scale: float = 1.0
    # StarCoder2: torch's LayerNorm, with a bias, in the model's dtype (layer_norm set too).
    norm_bias: bool = False
    # Norms without weights, in fp32: OLMo (1)'s LayerNorms without biases (layer_norm set too), nanochat's RMSNorms.
    norm_affine: bool = True
    # OLMo (1): q, k and v clamped to [-clip_qkv, clip_qkv] as they are projected.
    clip_qkv: float | None = None
    # Keys a query in a sliding layer sees (itself and window - 1 before it) when the checkpoint turns
    # sliding-window attention on, else None; which layers slide (None with a window: all of them).
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] | None = None
    # The MLP's gate activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (Gemma's GeGLU); "relu2" (relu(x)²);
    # "gelu_new" (Phi-2's ungated MLP: the tanh approximation op by op, as transformers writes it).
    hidden_act: str = "silu"
    # False: the MLP has no gate, its up projection's activation goes straight down (Arcee's ReLU²).
    mlp_gated: bool = True
    # Biases on the MLP's projections (Llama's mlp_bias; StarCoder2's and ERNIE's use_bias).
    mlp_bias: bool = False
    # A bias on the output head (Phi-1.5, Phi-2).
    lm_head_bias: bool = False
    # Token embeddings are multiplied by this (Gemma: sqrt(hidden_size), rounded to the weights' dtype first,
    # embed_scale_rounded; Granite: embedding_multiplier).
    embed_scale: float = 1.0
    embed_scale_rounded: bool = False
    # Granite: each sublayer's output is multiplied by this before it joins the residual stream
    # (residual_multiplier), and the logits are divided by logits_divisor (logits_scaling).
    residual_scale: float = 1.0
    logits_divisor: float = 1.0
    # Gemma: RMSNorm weights are stored as w for a scale of (1 + w), applied in fp32.
    norm_unit_offset: bool = False
    # Gemma 2/3: each sublayer's output is normed too before it joins the residual stream, and the MLP has a
    # norm of its own before it (post_attention_layernorm, pre/post_feedforward_layernorm).
    sandwich_norms: bool = False
    # Attention scores scaled by this instead of head_dim ** -0.5 (Gemma's query_pre_attn_scalar ** -0.5).
    attn_scale: float | None = None
    # RoPE base of the sliding layers when it differs from rope_theta (Gemma 3's rope_local_base_freq); they
    # rotate without rope_scaling.
    local_rope_theta: float | None = None
    # Laguna: the share of each head the sliding layers rotate where it is not partial_rotary_factor (with
    # local_rope_theta); None: the same.
    local_partial_rotary_factor: float | None = None
    # Gemma 2: attention scores and final logits become cap * tanh(x / cap) (None: not capped).
    attn_softcap: float | None = None
    final_softcap: float | None = None
    # Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE; moe.py): experts in each MoE layer (0: dense MLPs
    # only), how many each token is routed to, each one's width, whether the chosen experts' probabilities
    # are renormalized to sum to 1, which layers route (the rest keep a dense MLP of intermediate_size), and
    # Qwen2-MoE's shared expert's width (0: none).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0
    # transformers' Mixtral weighs expert outputs by the fp32 probabilities; Qwen's cast them to the model's
    # dtype first (the two differ in bf16 only).
    routing_weights_fp32: bool = False
    # How the router picks and weighs experts (moe.py): "softmax" (the top k of the softmax over its logits:
    # Mixtral, Qwen, OLMoE), "topk_softmax" (the softmax of the top k logits: GPT-OSS), "sigmoid" (GLM-4.5,
    # DeepSeek-V3: sigmoid scores in fp32; the top k by score plus a learned correction bias, within the
    # moe_topk_groups best of moe_groups groups of experts; weighed by their scores, renormalized with
    # norm_topk_prob, times routed_scaling_factor), "group_softmax" (DeepSeek-V2: a softmax over fp32 logits
    # of an fp32 router; the top k within the moe_topk_groups groups whose best score is highest; weighed by
    # their scores times routed_scaling_factor, not renormalized), "sigmoid_input" (Llama 4: the top k logits'
    # sigmoids scale each token going into its experts, whose outputs then add unweighted).
    # "sparsemixer" (Phi-3.5-MoE, top 2): the best expert weighed by its softmax over the experts whose logits
    # are within sparsemixer_eps (relatively, doubled) of it; then the best of the rest, by the same rule.
    # "softmax_fp32" (Hunyuan): "softmax" over an fp32 router on fp32 inputs, its weights kept fp32.
    # "topk_sigmoid" (Cohere2-MoE's sigmoid, Flint's): the top k logits' sigmoids, renormalized with norm_topk_prob,
    # in fp32 with router_fp32 (Flint), else in the router's dtype. "logit_biased_sigmoid" (Kolibri-1): the top k by fp32 logit plus a correction bias, weighed by
    # their logits' sigmoids, renormalized with norm_topk_prob, kept fp32.
    moe_routing: str = "softmax"
    sparsemixer_eps: float = 0.01
    moe_groups: int = 1
    moe_topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    # What a sigmoid router adds to the sum of the chosen weights it renormalizes by (transformers' DeepSeek-V3:
    # 1e-20; LFM2-MoE: 1e-6).
    routing_norm_eps: float = 1e-20
    # A.X K2: experts outside the chosen groups are scored 0 for the top k (transformers' A.X K2 fills them so),
    # not -inf as DeepSeek-V3's: they are chosen over experts whose score plus bias is negative.
    moe_groups_masked_to_zero: bool = False
    # Laguna: a sigmoid router's fp32 logits soft-capped, tanh(logit / cap) * cap, before their sigmoids; None: not.
    router_softcap: float | None = None
    # Whether a sigmoid router computes its logits in fp32 with fp32 weights (GLM-4.5, dots.llm1; transformers
    # keeps them fp32), or in the model's dtype (MiniMax-M2; the scores are fp32 either way); a top-k-softmax
    # router's softmax in fp32, cast back (Granite MoE), or in the model's dtype (GPT-OSS).
    router_fp32: bool = True
    # Qwen2-MoE scales its shared expert by a sigmoid gate of its own; GLM-4.5 adds it as it is.
    shared_expert_gated: bool = True
    # Cohere2-MoE's "average": the routed and shared experts' outputs averaged, not summed.
    shared_expert_averaged: bool = False
    # A.X K1: each MoE block's output (routed plus shared experts) RMS-normed (its post_mlp_layernorm).
    moe_output_norm: bool = False
    # GPT-OSS's experts: the router and each expert have biases; experts have a clamped SwiGLU,
    # (up + 1) * gate * sigmoid(swiglu_alpha * gate) with gate <= swiglu_limit and |up| <= swiglu_limit
    # (None: plain SwiGLU).
    moe_biases: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.0
    # Layers whose attention uses no positions (no RoPE; SmolLM3's and Llama 4's every fourth layer).
    nope_layers: tuple[int, ...] = ()
    # Llama 4 (llama4.py): layers that attend within chunks of attention_chunk positions (a query sees the keys
    # from its chunk's start), q and k L2-normed per head after RoPE in RoPE layers, and the NoPE layers'
    # queries scaled by 1 + attn_scale * log(1 + floor((p + 1) / floor_scale)) (nope_temperature: (floor_scale,
    # attn_scale); None: not scaled).
    attention_chunk: int | None = None
    chunked_layers: tuple[int, ...] = ()
    # Ministral 3 ("llama 4 scaling", rope_parameters' llama_4_scaling_beta): every RoPE layer's q times
    # 1 + beta * log(1 + floor(p / period)), period the pretrained context (beta, period; None: not scaled).
    q_position_scale: tuple[float, float] | None = None
    # A sequence-classification checkpoint (``...ForSequenceClassification``: a reward model, a classifier, a
    # cross-encoder reranker): its head's classes, scored from the last token's final hidden state, in place of
    # the output head (pooling.py); 0 for a causal LM.
    num_labels: int = 0
    qk_l2_norm: bool = False
    # Hunyuan: the per-head q/k norms come after RoPE rather than before it.
    qk_norm_after_rope: bool = False
    nope_temperature: tuple[float, float] | None = None
    # Beam: its NoPE layers' queries times exp(power * log1p((p + 1) / scale)), in fp32 ((power, scale); None: not
    # scaled).
    nope_query_power: tuple[float, float] | None = None
    # Beam: each sublayer's (sandwich-normed) output joins the stream as out / sqrt(n) + stream * sqrt((n - 1) / n),
    # n = 2(l + 1) for layer l's attention, one more for its MLP.
    depth_scaled_residuals: bool = False
    # Beam: a bias per head added to the output gate's projection (self_attn.gate_bias) before its sigmoid.
    attn_gate_head_bias: bool = False
    # Multi-head latent attention (DeepSeek-V3, Kimi K2; mla.py), when kv_lora_rank > 0: the KV cache holds one
    # latent per token (kv_lora_rank features, then qk_rope_head_dim rotated ones: head_dim, one KV head);
    # queries go through a q_lora_rank bottleneck (None: one projection); each head's key has
    # qk_nope_head_dim features from the latent beside the shared rotated ones, its value v_head_dim.
    kv_lora_rank: int = 0
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek's checkpoints store the rotated features in interleaved pairs (transformers' rope_interleave):
    # mla.py reorders those rows as they load.
    rope_interleaved: bool = False
    # DeepSeek-V3.2's sparse attention (dsa.py; with latent attention): each query attends only the index_topk
    # keys its indexer (index_n_heads heads of index_head_dim) scores highest, the indexer's key cached after the
    # latent (head_dim kv_lora_rank + qk_rope_head_dim + index_head_dim); 0: every key (plain latent attention).
    index_topk: int = 0
    index_head_dim: int = 0
    index_n_heads: int = 0
    # GLM-5: its indexer rotates interleaved pairs (reordered as they load, as the latent's are), and these layers
    # attend the keys the last layer with an indexer chose (they have none of their own).
    index_rope_interleaved: bool = False
    index_shared_layers: tuple[int, ...] = ()
    # A.X K2: q_b_proj reads the query bottleneck normed and not (q_lora_rank each) and gives each head its query
    # and a gate of v_head_dim, whose sigmoid scales the head's output before o_proj.
    mla_query_gate: bool = False
    # A.X K2: each layer's input norm, and its MLP's where it routes, scaled by the sigmoid of a SiLU MLP of this
    # rank of the normed stream (model.SelfGatedRMSNorm); 0: plain norms.
    self_gated_norm_rank: int = 0
    # BitNet b1.58: an RMSNorm of attention's output before o_proj (attn_sub_norm) and one of the MLP's gated product
    # before down_proj (ffn_sub_norm), as its ternary layers were trained to read.
    sub_norms: bool = False
    # MiniMax-Text-01: each sublayer reads the norm of the stream and the stream becomes alpha * that norm + beta *
    # the sublayer's output (the un-normed stream is not kept): (softmax attention's alpha, beta, lightning
    # attention's alpha, beta, the MLP's alpha, beta); None: a pre-norm residual stream.
    normed_stream: tuple[float, float, float, float, float, float] | None = None
    # Multi-token-prediction layers the checkpoint holds after the model's own (GLM-4.5, DeepSeek-V3:
    # num_nextn_predict_layers): not served, their weights skipped.
    mtp_layers: int = 0
    # FP8 weights (fp8.py dequantizes them while they load): the name of their scale tensors
    # ("weight_scale_inv" for quant_method fp8, "weight_scale" for compressed-tensors; None: weights as
    # stored) and the (rows, cols) tile each scale covers (None: per output channel or per tensor).
    fp8_scales: str | None = None
    fp8_block: tuple[int, int] | None = None
    # MXFP4 experts (GPT-OSS; mxfp4.py dequantizes them while they load): 4-bit floats in blocks of 32 that
    # share a power-of-two scale.
    mxfp4: bool = False
    # compressed-tensors' pack-quantized integer weights (int_packed.py dequantizes them while they load): their
    # bits, 4 or 8 (0: none), and whether they have zero points (asymmetric schemes).
    packed_int_bits: int = 0
    packed_int_zero_points: bool = False
    # BitNet b1.58's ternary projections (bitnet.py; quant_method bitnet): how their weights are stored ("packed",
    # "scaled" or "online"; None: not ternary). Each projection's input is rounded per token to 8-bit levels.
    ternary_weights: str | None = None
    # compressed-tensors' kv_cache_scheme: each attention layer's calibrated key and value scales
    # (``self_attn.k_scale`` / ``v_scale``), used by a float8 KV pool (kv_quant.py) and set aside otherwise.
    kv_scales: bool = False
    # Apertus 1.5 (output_vocab_size): its output head's rows, the vocabulary's first tokens (its image and audio
    # codes past them are inputs only, never sampled: their logits -inf); None: every token.
    head_vocab_size: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"
    architecture: str = "LlamaForCausalLM"
    # The vision-language architecture whose language model this is (vision_language.py), else None.
    vision_language: str | None = None
    # Linear-attention layers (linear_attention_config.py): Gated DeltaNet (Qwen3-Next, Qwen3.5), Mamba-2 (Granite
    # 4.0-H) or a gated short convolution (LFM2); these layers mix tokens over a recurrent state per sequence and
    # keep no KV. Their shape.
    linear_layers: tuple[int, ...] = ()
    linear_attention: LinearShape | None = None
    # Nemotron-H (nemotron_h.py): each layer one sublayer behind its own norm, "mixer" (attention, or the linear
    # mixer in linear_layers) or "mlp" (experts in moe_layers); empty: every layer a mixer, then an MLP.
    sublayers: tuple[str, ...] = ()
    # Mamba's residual_in_fp32 (mamba.py): the stream between layers in float32, each layer's norm reading it cast
    # to the model's dtype, the final norm reading it as it is (only for one-sublayer layers, as Mamba's are).
    residual_in_fp32: bool = False
    # Nemotron 3's routed experts work on the tokens projected down to this many features, and their sum is
    # projected back up (0: no latent, the experts read the hidden state).
    moe_latent_size: int = 0
    # Falcon-H1 (falcon_h1.py): every layer runs attention and its linear mixer side by side on one norm, both
    # outputs added to the stream (each layer keeps KV and a recurrent state); the µP multipliers its loader
    # folds into the weights (None: none but 1).
    parallel_mixers: bool = False
    multipliers: Multipliers | None = None
    # Zamba2 (zamba2.py): the shared transformer blocks its hybrid layers run before their Mamba-2 mixer (each
    # of those layers keeps KV and a recurrent state; every other layer, only a state); None: none.
    shared_blocks: SharedBlocks | None = None
    # (KV heads, head_dim) of the full-attention and of the sliding layers where they are not the model's: Gemma
    # 4's wider full layers, MiMo-V2-Flash's sliding layers with twice the KV heads (layer_heads).
    full_layer_heads: tuple[int, int] | None = None
    sliding_layer_heads: tuple[int, int] | None = None
    # Laguna: each layer's query heads (num_attention_heads_per_layer); None: num_attention_heads in every layer.
    layer_query_heads: tuple[int, ...] | None = None
    # MiMo-V2-Flash: values narrower than keys (the KV pool holds them padded to head_dim) and scaled by this.
    value_head_dim: int | None = None
    value_scale: float = 1.0
    # With attention_sinks, the layers that have them (MiMo-V2-Flash's sliding ones); None: every layer.
    sink_layers: tuple[int, ...] | None = None
    # Gemma 4 (gemma4.py): KV shared by its last layers, per-layer inputs and experts beside the MLP; None: not
    # Gemma 4.
    gemma4: Gemma4Shape | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelLoadError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"config.json: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("embed_scale", "attn_scale", "local_rope_theta", "attn_softcap", "final_softcap",
                     "residual_scale", "logits_divisor", "swiglu_limit", "routed_scaling_factor", "logit_scale",
                     "routing_norm_eps", "router_softcap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ModelLoadError(f"config.json: {name} must be > 0, got {value}")
        self._check_norm_and_bias_fields()
        self._check_output_gate()
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ModelLoadError(f"config.json: hidden activation {self.hidden_act!r} is not supported; supported: "
                                 f"{', '.join(SUPPORTED_ACTIVATIONS)}")
        if self.mla or self.index_topk:  # before the RoPE checks, which read its rotated block
            check_mla(self)
        self._check_rope()
        check_moe(self)
        self._check_position_fields()
        self._check_layer_lists()
        if self.fp8_scales not in (None, "weight_scale", "weight_scale_inv") or (
                self.fp8_block is not None and (self.fp8_scales is None or min(self.fp8_block) < 1)):
            raise ModelLoadError(f"FP8 scales {self.fp8_scales!r} in blocks {self.fp8_block}: scales are "
                                 "weight_scale or weight_scale_inv, blocks two positive sizes")
        self._check_classic_layouts()
        if self.kv_scales and self.mla:
            raise ModelLoadError("calibrated KV scales (kv_cache_scheme) for latent attention are not supported; a "
                                 "float8 latent cache is, with scale 1 (--kv-cache-dtype fp8 on a checkpoint without "
                                 "them)")
        if self.packed_int_bits not in (0, 4, 8) or (self.packed_int_bits and self.fp8_scales):
            raise ModelLoadError(f"packed integer weights of {self.packed_int_bits} bits: 4 or 8, and not beside "
                                 "FP8 scales")
        if self.served_context is not None and not 1 <= self.served_context <= self.max_position_embeddings:
            raise InvalidArgument(f"max_model_len {self.served_context} must be between 1 and the model's "
                                  f"max_position_embeddings ({self.max_position_embeddings})")

    def _check_layer_lists(self) -> None:
        if self.linear_layers and (self.linear_attention is None
                                   or not all(0 <= i < self.num_hidden_layers for i in self.linear_layers)):
            raise ModelLoadError(f"linear attention in layers {self.linear_layers} needs its shape and layers of the "
                                 "model")
        if not self.kv_layers and self.architecture not in ATTENTION_FREE:
            raise ModelLoadError(f"{self.architecture} without an attention layer: transformers runs such a hybrid "
                                 "only with at least one attention layer (its cache takes attention masks from one); "
                                 f"the attention-free models served are {', '.join(ATTENTION_FREE)}")
        if self.sublayers and (len(self.sublayers) != self.num_hidden_layers
                               or not set(self.sublayers) <= {"mixer", "mlp"}
                               or any(not self.has_mixer(i) for i in self.linear_layers)
                               or any(not self.has_mlp(i) for i in self.moe_layers)):
            raise ModelLoadError(f"sublayers {self.sublayers} must name each of the {self.num_hidden_layers} layers "
                                 "'mixer' or 'mlp', linear layers mixers and expert layers MLPs")
        if self.residual_in_fp32 and not self.sublayers:
            raise ModelLoadError("residual_in_fp32 is served for models of one sublayer a layer (Mamba's)")
        if self.parallel_mixers and (set(self.linear_layers) != set(range(self.num_hidden_layers))
                                     or not isinstance(self.linear_attention, Mamba2Shape) or self.sublayers):
            raise ModelLoadError("parallel mixers (Falcon-H1) need a Mamba-2 mixer beside attention in every layer")
        if self.moe_latent_size < 0 or (self.moe_latent_size and not self.num_experts):
            raise ModelLoadError(f"config.json: moe_latent_size {self.moe_latent_size} needs experts and must be >= 0")
        if any(not 0 <= layer < self.num_hidden_layers for layer in self.nope_layers):
            raise ModelLoadError(f"config.json: layers without RoPE {self.nope_layers} outside the "
                                 f"{self.num_hidden_layers} layers")

    def _check_position_fields(self) -> None:
        """Llama 4's chunks and query temperature, Ministral 3's query scale: positive periods, chunked layers
        among the model's, and chunks never beside a sliding window (attention reads one or the other)."""
        if self.chunked_layers and (self.attention_chunk is None or self.attention_chunk < 1
                                    or self.sliding_window is not None
                                    or not all(0 <= i < self.num_hidden_layers for i in self.chunked_layers)):
            raise ModelLoadError(f"chunked attention in layers {self.chunked_layers} needs attention_chunk >= 1 "
                                 f"(got {self.attention_chunk}), layers of the model, and no sliding window")
        row = self.sinusoidal_padding_row
        if row is not None and (self.learned_positions is None
                                or not 0 <= row < self.max_position_embeddings + self.learned_positions):
            raise ModelLoadError(f"config.json: pad_token_id {row} must name a row of the sinusoidal positions' table "
                                 f"(0 to {self.max_position_embeddings + (self.learned_positions or 0) - 1})")
        periods = {"floor_scale": self.nope_temperature and self.nope_temperature[0],
                   "original_max_position_embeddings": self.q_position_scale and self.q_position_scale[1]}
        for name, period in periods.items():
            if period is not None and not period > 0:
                raise ModelLoadError(f"config.json: {name} (the period of a query scale by position) must be > 0, "
                                     f"got {period}")


    def _check_classic_layouts(self) -> None:
        """The fields GPT-NeoX, Falcon, OPT, the GPT-2 family, BLOOM and MPT set, consistent with each other."""
        if self.qkv_layout not in (None, "per_head", "grouped", "multi_query") or (
                self.qkv_layout == "grouped" and self.num_attention_heads % self.num_key_value_heads) or (
                self.qkv_layout == "multi_query" and self.num_key_value_heads != 1):
            raise ModelLoadError(f"a fused query_key_value laid out {self.qkv_layout!r} for {self.num_attention_heads} "
                                 f"query and {self.num_key_value_heads} key/value heads: per_head, grouped (query "
                                 "heads a multiple of key/value heads) or multi_query (one key/value head)")
        if (self.parallel_mlp_norm and not self.parallel_block) or (
                self.learned_positions is not None and self.learned_positions < 0):
            raise ModelLoadError(f"parallel_mlp_norm {self.parallel_mlp_norm} without parallel_block, or learned "
                                 f"positions at offset {self.learned_positions}: an MLP norm of its own is for "
                                 "attention and MLP side by side, an offset is >= 0")
        if self.alibi_bias_max is not None and (
                not self.alibi_bias_max > 0 or len(self.nope_layers) != self.num_hidden_layers
                or self.learned_positions is not None or self.sliding_window is not None
                or self.attention_chunk is not None or self.attn_softcap is not None or self.attention_sinks
                or self.mla or self.linear_layers) or (self.alibi_bf16 and self.alibi_bias_max is None):
            raise ModelLoadError(f"ALiBi (alibi_bias_max {self.alibi_bias_max}) is for attention without other "
                                 "positions (no RoPE in any layer, no learned positions), windows, chunks, soft caps, "
                                 "sinks, latent or linear layers, with alibi_bias_max > 0 (alibi_bf16 with it)")
        if self.sinks_scale_output and not self.attention_sinks:
            raise ModelLoadError("sinks_scale_output is a form of attention sinks: set attention_sinks too")
        self._check_layer_shapes()
        if self.shared_blocks is not None and not set(self.shared_blocks.layers) <= set(self.linear_layers):
            raise ModelLoadError(f"shared blocks run before a layer's Mamba-2 mixer: their layers "
                                 f"{self.shared_blocks.layers} must be linear layers ({self.linear_layers})")

    def _check_output_gate(self) -> None:
        if self.attn_output_gate not in (None, "own", "in_query", "per_head"):
            raise ModelLoadError(f"attn_output_gate must be 'own', 'in_query', 'per_head' or None, got "
                                 f"{self.attn_output_gate!r}")
        if self.attn_gate_head_bias and self.attn_output_gate != "own":
            raise ModelLoadError("attn_gate_head_bias is a gate's: set attn_output_gate 'own' too")
        if self.depth_scaled_residuals and not self.sandwich_norms:
            raise ModelLoadError("depth_scaled_residuals join sandwich-normed outputs: set sandwich_norms too")
        if self.nope_query_power is not None and (self.nope_temperature is not None or len(self.nope_query_power) != 2
                                                  or not self.nope_query_power[1] > 0):
            raise ModelLoadError(f"nope_query_power {self.nope_query_power} must be (power, scale > 0), and not beside "
                                 "nope_temperature")
        if self.attn_gate_softplus and self.attn_output_gate not in ("own", "per_head"):
            raise ModelLoadError("attn_gate_softplus is a gate's: set attn_output_gate 'own' or 'per_head' too")
        if self.mla_query_gate and not (self.mla and self.q_lora_rank):
            raise ModelLoadError("mla_query_gate gates latent attention's heads from its query bottleneck: set "
                                 "kv_lora_rank and q_lora_rank too")

    def _check_layer_shapes(self) -> None:
        """The fields that give layers attention shapes of their own (Gemma 4's, MiMo-V2-Flash's)."""
        layers = range(self.num_hidden_layers)
        for name in ("full_layer_heads", "sliding_layer_heads"):
            heads = getattr(self, name)
            if heads is not None and (min(heads) < 1 or self.num_attention_heads % heads[0]):
                raise ModelLoadError(f"{name} {heads}: (KV heads, head_dim), both >= 1, the KV heads dividing "
                                     f"num_attention_heads ({self.num_attention_heads})")
        if self.layer_query_heads is not None and (
                len(self.layer_query_heads) != self.num_hidden_layers
                or any(q < 1 or q % self.layer_heads(i)[0] for i, q in enumerate(self.layer_query_heads))):
            raise ModelLoadError(f"layer_query_heads {list(self.layer_query_heads)} must give each of the "
                                 f"{self.num_hidden_layers} layers a number of query heads its KV heads divide")
        widths = [d for _, d in map(self.layer_heads, layers)]
        if self.value_head_dim is not None and not 0 < self.value_head_dim <= min(widths):
            raise ModelLoadError(f"value_head_dim {self.value_head_dim} must be in 1..head_dim: values are cached "
                                 "padded to the keys' width")
        if not (math.isfinite(self.value_scale) and self.value_scale > 0):
            raise ModelLoadError(f"value_scale must be a positive number, got {self.value_scale}")
        if self.sink_layers is not None and (not self.attention_sinks or not set(self.sink_layers) <= set(layers)):
            raise ModelLoadError(f"sink_layers {self.sink_layers} are layers with attention sinks: set attention_sinks "
                                 f"and name layers of the {self.num_hidden_layers}")
        if self.gemma4 is not None and len(self.gemma4.kv_source) != self.num_hidden_layers:
            raise ModelLoadError(f"Gemma 4's KV sources name {len(self.gemma4.kv_source)} layers of "
                                 f"{self.num_hidden_layers}")

    def _check_rope(self) -> None:
        rope_type = self.rope_type
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(
                f"config.json: rope_scaling type {rope_type!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ModelLoadError(f"config.json: partial_rotary_factor {self.partial_rotary_factor} must leave an even "
                                 f"number of rotated features per head, at least 2 (head_dim {self.head_dim})")
        local = self.local_partial_rotary_factor
        if local is not None and (self.local_rope_theta is None or not 0 < local <= 1 or self.local_rotary_dim < 2
                                  or self.local_rotary_dim % 2):
            raise ModelLoadError(f"local_partial_rotary_factor {local} must leave the sliding layers (local_rope_theta "
                                 f"set) an even number of rotated features per head, at least 2")
        if rope_type == "longrope":
            _check_longrope(self.rope_scaling or {}, self.rotary_dim)

    @property
    def rope_type(self) -> str:
        return _rope_type(self.rope_scaling)

    @property
    def max_model_len(self) -> int:
        """The longest context served."""
        return self.served_context or self.max_position_embeddings

    def with_max_model_len(self, max_model_len: int | None) -> ModelConfig:
        """This model serving at most ``max_model_len`` tokens of context (None: all it has)."""
        return self if max_model_len is None else replace(self, served_context=max_model_len)

    @property
    def rotary_dim(self) -> int:
        """The features of each head that RoPE rotates (the first ones), as transformers rounds them; latent
        attention's rotated block."""
        return self.qk_rope_head_dim if self.mla else int(self.head_dim * self.partial_rotary_factor)

    @property
    def local_rotary_dim(self) -> int:
        """The features of each head the sliding layers rotate where they have a base of their own."""
        share = self.local_partial_rotary_factor
        return self.rotary_dim if share is None else int(self.head_dim * share)

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (mla.py)."""
        return self.kv_lora_rank > 0

    def slides(self, layer: int) -> bool:
        """Whether ``layer`` attends within ``sliding_window`` only."""
        return self.sliding_window is not None and (self.sliding_layers is None or layer in self.sliding_layers)

    def attends_locally(self, layer: int) -> bool:
        """Whether ``layer`` attends within a sliding window or an attention chunk (not to every earlier key)."""
        return self.slides(layer) or layer in self.chunked_layers

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers that keep KV (all but linear-attention layers; all of Falcon-H1's), in order: the KV pool
        has one slot per token for each, and layer ``kv_layers[i]`` reads the pool's layer ``i``."""
        linear = set() if self.parallel_mixers else set(self.linear_layers)
        if self.shared_blocks is not None:  # Zamba2's hybrid layers attend in their shared block
            linear -= set(self.shared_blocks.layers)
        shares = self.gemma4.shares_kv if self.gemma4 is not None else lambda _: False  # reads another's KV
        return tuple(i for i in range(self.num_hidden_layers)
                     if i not in linear and self.has_mixer(i) and not shares(i))

    @cached_property  # read each forward pass
    def kv_free_tail(self) -> int | None:
        """The first of the last layers that write no KV (Gemma 4's KV-sharing layers), or None: no later token
        reads what they compute, so from there on only the rows logits are taken from need running."""
        if self.gemma4 is None or not self.gemma4.shares_kv(self.num_hidden_layers - 1):
            return None
        return next(i for i in range(self.num_hidden_layers) if self.gemma4.shares_kv(i))

    def query_heads(self, layer: int) -> int:
        """``layer``'s query heads: its own where layers have their own (``layer_query_heads``)."""
        return self.num_attention_heads if self.layer_query_heads is None else self.layer_query_heads[layer]

    def layer_heads(self, layer: int) -> tuple[int, int]:
        """``layer``'s (KV heads, head_dim): its type's where it has its own (``full_layer_heads``,
        ``sliding_layer_heads``), else the model's."""
        own = self.sliding_layer_heads if self.slides(layer) else self.full_layer_heads
        return own or (self.num_key_value_heads, self.head_dim)

    @property
    def full_attention(self) -> ModelConfig:
        """The config of the full-attention layers (and their RoPE: Gemma 4's over its wider heads)."""
        if self.full_layer_heads is None:
            return self
        return replace(self, num_key_value_heads=self.full_layer_heads[0], head_dim=self.full_layer_heads[1],
                       full_layer_heads=None, sliding_layer_heads=None)

    @property
    def kv_layer_shapes(self) -> tuple[tuple[int, int], ...] | None:
        """Each KV pool layer's (KV heads, head_dim) where layer types have their own, else None."""
        if self.full_layer_heads is None and self.sliding_layer_heads is None:
            return None
        return tuple(map(self.layer_heads, self.kv_layers))

    @property
    def kv_slot(self) -> tuple[int, int]:
        """(KV heads, head_dim) of the KV pool's slots: each layer's, or where they differ the narrowest layer's
        (one KV head as wide as their greatest common width where that one does not divide the others); a layer
        fills ``heads * head_dim`` / that of them (``kv_slots``: how many in all)."""
        shapes = self.kv_layer_shapes
        if shapes is None:
            return self.num_key_value_heads, self.head_dim
        narrowest = min(shapes, key=lambda s: s[0] * s[1])
        width = math.gcd(*(h * d for h, d in shapes))
        return narrowest if narrowest[0] * narrowest[1] == width else (1, width)

    @property
    def kv_slots(self) -> int:
        """The KV pool's slots a block holds per token: one per KV layer, or where their widths differ as many
        as their keys and values fill."""
        if self.kv_layer_shapes is None:
            return len(self.kv_layers)
        heads, dim = self.kv_slot
        return sum(h * d // (heads * dim) for h, d in self.kv_layer_shapes)

    @property
    def attention_free(self) -> bool:
        """Whether no layer attends (Mamba, Mamba-2): the KV pool holds nothing, blocks only count tokens."""
        return not self.kv_layers

    def has_mixer(self, layer: int) -> bool:
        """Whether ``layer`` mixes tokens (attention or a linear mixer): all but Nemotron-H's MLP layers."""
        return not self.sublayers or self.sublayers[layer] == "mixer"

    def has_mlp(self, layer: int) -> bool:
        """Whether ``layer`` has an MLP (or experts): all but Nemotron-H's mixer layers."""
        return not self.sublayers or self.sublayers[layer] == "mlp"

    @property
    def recurrent(self) -> bool:
        """Whether some layer carries a recurrent state per sequence (linear attention): a sequence's KV blocks
        alone do not resume it, so prefixes are not shared or moved by their blocks."""
        return bool(self.linear_layers)

    def is_moe(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts."""
        return layer in self.moe_layers

    @property
    def uniform_window(self) -> int | None:
        """The window when every layer attends within it (KV before it is never read again, so its blocks can
        be freed), else None."""
        return self.sliding_window if all(self.slides(i) for i in range(self.num_hidden_layers)) else None

    def _check_norm_and_bias_fields(self) -> None:
        if self.norm_bias and not self.layer_norm:
            raise ModelLoadError("norm_bias is a LayerNorm's: set layer_norm too")
        if self.clip_qkv is not None and not self.clip_qkv > 0:
            raise ModelLoadError(f"config.json: clip_qkv must be > 0, got {self.clip_qkv}")
        if self.mlp_bias and self.num_experts:
            raise ModelLoadError("config.json: biases on the MLP are set; experts with biases are not supported")
        if self.self_gated_norm_rank < 0:
            raise ModelLoadError(f"config.json: gated_norm_rank must be >= 1, got {self.self_gated_norm_rank}")
        for name in ("sub_norms", "ternary_weights"):  # BitNet's: in Attention and MLP alone
            if getattr(self, name) and (self.mla or self.num_experts or self.linear_layers or self.sublayers):
                raise ModelLoadError(f"{name} (BitNet's) are served in grouped-query attention and dense MLPs; not "
                                     "with latent attention, experts or linear-attention layers")
        if self.head_vocab_size is not None and not (0 < self.head_vocab_size <= self.vocab_size
                                                     and not self.tie_word_embeddings):
            raise ModelLoadError(f"config.json: output_vocab_size {self.head_vocab_size} must be between 1 and "
                                 f"vocab_size ({self.vocab_size}), with an output head of its own (not tied)")
        if self.pre_norm_layers and (self.pre_norms or self.parallel_block or self.sublayers
                                     or not set(self.pre_norm_layers) <= set(range(self.num_hidden_layers))):
            raise ModelLoadError(f"pre_norm_layers {self.pre_norm_layers} are layers of a post-norm model's")
        if self.ternary_weights not in (None, "packed", "scaled", "online"):
            raise ModelLoadError(f"ternary_weights must be packed, scaled or online, got {self.ternary_weights!r}")
        if self.normed_stream is not None and (len(self.normed_stream) != 6 or not self.pre_norms
                                               or self.parallel_block or self.sandwich_norms):
            raise ModelLoadError(f"normed_stream {self.normed_stream} needs six factors (softmax attention's, "
                                 "lightning attention's and the MLP's alpha and beta) and a plain pre-norm block")

    @property
    def is_llama_like(self) -> bool:
        """The decoder the fused CPU forward computes whole: its blocks, and attention in every layer."""
        return self.fused_blocks and self.plain_attention and not self.linear_layers

    @property
    def fused_blocks(self) -> bool:
        """Decoder blocks the fused CPU forward computes (fp32 only): SwiGLU, pre-norms (with sandwich norms on the
        outputs too), plain embeddings and scaling (the logits' scale is the head's, shared by both paths). Their
        mixers it computes inline where they are ``plain_attention``, or calls. A norm stored as w for a scale of
        1 + w is loaded as 1 + w, so in fp32 its kernel computes what the module does."""
        return (self.hidden_act == "silu" and self.embed_scale == 1.0
                and self.pre_norms and self.attn_scale is None
                and self.final_softcap is None and self.residual_scale == 1.0 and self.logits_divisor == 1.0
                and not self.moe_biases and self.swiglu_limit is None and self.nope_temperature is None
                and self.nope_query_power is None and not self.depth_scaled_residuals
                and self.q_position_scale is None and not self.layer_norm and not self.parallel_block
                and not self.mlp_bias and not self.lm_head_bias and not self.sublayers
                and self.learned_positions is None and self.alibi_bias_max is None and not self.embed_norm
                and self.shared_blocks is None and self.norm_affine and not self.self_gated_norm_rank
                and self.normed_stream is None and not self.sub_norms and self.ternary_weights is None)

    @property
    def plain_attention(self) -> bool:
        """Attention layers the fused CPU forward computes inline (Llama's, with Qwen3's q/k norms or OLMoE's)."""
        return (not self.norm_unit_offset and not self.o_proj_bias and not self.attention_sinks and not self.mla
                and not self.qk_l2_norm and self.attn_output_gate is None and self.clip_qkv is None
                and self.kv_layer_shapes is None and self.value_head_dim is None and self.value_scale == 1.0)

    @property
    def parallel_outputs_first(self) -> bool:
        """With ``parallel_block``: whether attention's and the MLP's outputs are summed before they join the
        stream (Phi-2's, GPT-NeoX's, Falcon's and GPT-J's order), rather than the stream plus attention, then the MLP (Cohere's,
        StableLM's)."""
        return self.architecture in ("PhiForCausalLM", GPT_NEOX, FALCON, GPTJ, "CodeGenForCausalLM")

    @property
    def rope_in_fp32(self) -> bool:
        """Whether RoPE rotates in fp32 and casts back once (cos and sin never rounded to a low-precision dtype),
        as transformers' OLMo, OLMo 2/3, FlexOlmo, LFM3, ERNIE 4.5 and Llama 4 (a complex product in fp32) apply
        it; the others round cos and sin to the model's dtype first."""
        return self.architecture in _ROPE_IN_FP32

    @property
    def norm_scale_in_fp32(self) -> bool:
        """RMSNorm weights applied before the cast back to a low-precision dtype (Gemma's, OLMo 2's and GPT-OSS's
        order)."""
        return self.norm_unit_offset or self.architecture in ("Olmo2ForCausalLM", "Olmo3ForCausalLM", "FlexOlmoForCausalLM",
                                                              "OlmoHybridForCausalLM", "BeamForCausalLM",
                                                              "GptOssForCausalLM", AFMOE, NEMOTRON_H, GEMMA4,
                                                              "FlintForCausalLM")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def lora_shape(self) -> ModelShape:
        """The dimensions a LoRA adapter for this model must have."""
        return ModelShape(self.num_hidden_layers, self.hidden_size, self.intermediate_size,
                          self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim,
                          self.moe_layers, self.num_experts, self.moe_latent_size or self.hidden_size,
                          self.moe_intermediate_size, experts_swapped=self.architecture == LLAMA4,
                          shared_intermediate=self.shared_expert_intermediate_size,
                          projections=self._lora_projections(), query_gates=self.attn_output_gate == "in_query",
                          latent_attention=self.mla, gated_mlp=self.mlp_gated, num_labels=self.num_labels,
                          names=partial(model_name, config=self), no_adapters=self._no_adapters())

    def _no_adapters(self) -> str:
        """Why this model takes no LoRA adapter, where it takes none; "" where it takes them."""
        if self.shared_blocks:
            return "Zamba2 takes no LoRA adapters here (nor in vLLM): its layers run shared blocks with adapters of their own"
        why = ("its attention's widths differ by layer type" if self.kv_layer_shapes or self.value_head_dim else
               "its layers have query heads of their own" if self.layer_query_heads else
               "its query projection reads two latents and gates each head's output" if self.mla_query_gate else
               "its ternary projections round their inputs to 8 bits, which adapters would read unrounded"
               if self.ternary_weights else "")
        return f"{self.architecture} takes no LoRA adapters here yet: {why}" if why else ""

    def _lora_projections(self) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
        """The projections LoRA adapts as the model holds them: (name in the layer, in, out, layers)."""
        mixers = self.linear_attention.projections(self.hidden_size) if self.linear_attention else {}
        found = [(name, *in_out, self.linear_layers) for name, in_out in mixers.items()]
        heads, hidden, attention = self.num_attention_heads, self.hidden_size, self.kv_layers
        if self.attn_output_gate is not None:
            gate = heads if self.attn_output_gate == "per_head" else heads * self.head_dim
            found.append(("self_attn.gate_proj", hidden, gate, attention))
        if self.moe_latent_size:  # Nemotron 3's experts' latent space, in and out
            latent = self.moe_latent_size
            found += [("mlp.fc1_latent_proj", hidden, latent, self.moe_layers),
                      ("mlp.fc2_latent_proj", latent, hidden, self.moe_layers)]
        if self.mla:  # latent attention's (mla.py)
            rope, rank, q_out = self.qk_rope_head_dim, self.kv_lora_rank, heads * (self.qk_nope_head_dim +
                                                                                   self.qk_rope_head_dim)
            queries = [("q_a_proj", hidden, self.q_lora_rank), ("q_b_proj", self.q_lora_rank, q_out)] \
                if self.q_lora_rank else [("q_proj", hidden, q_out)]
            found += [(f"self_attn.{name}", fan_in, fan_out, attention) for name, fan_in, fan_out in (
                *queries, ("kv_a_proj_with_mqa", hidden, rank + rope),
                ("kv_b_proj", rank, heads * (self.qk_nope_head_dim + self.v_head_dim)),
                ("o_proj", heads * self.v_head_dim, hidden))]
        return tuple(found)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        raw, overrides = aliased(text_model_config(raw))
        archs = raw.get("architectures") or ["LlamaForCausalLM"]
        arch = _causal_lm_of(archs[0])
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"config.json: architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
                f", as those {', '.join(ALIASES)}, and the language models of {', '.join(VISION_LANGUAGE)}"
            )
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:
            raise ModelLoadError(f"config.json is missing required fields: {', '.join(missing)}")
        try:
            heads = int(raw["num_attention_heads"])
            eos = raw.get("eos_token_id")
            eos_ids = tuple(int(e) for e in eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            rope_theta, rope_scaling, local_theta, params = _rope_fields(raw, arch)
            gemma, gemma3 = arch in _GEMMAS, arch == "Gemma3ForCausalLM"
            granite, gpt_oss = arch in _GRANITES, arch == "GptOssForCausalLM"
            cohere = arch in _COHERES
            if gemma:
                _check_gemma(raw, gemma3)
            head_dim = _head_dim(raw, arch, heads)
            if arch in HUNYUANS:
                rope_theta, rope_scaling = ntk_alpha_rope(rope_theta, rope_scaling, head_dim)
            latent = mla_fields(raw, arch)  # DeepSeek-V2/V3: the cache holds latents, one "head" of their width
            window = _sliding_window(raw, arch)  # with no layer sliding, there is no window
            sliding_layers = _sliding_layers(raw, arch, int(raw["num_hidden_layers"])) if window else None
            partial = _partial_rotary(raw, arch, params, head_dim)
            if raw.get("clip_qkv") is not None:  # OLMo's (aliases.py) is set aside before this
                raise ModelLoadError(f"config.json: clip_qkv is {raw['clip_qkv']}; {arch} does not clip q, k and v "
                                     "in transformers")
            mlp_bias = _mlp_bias(raw, arch)
            if arch in MOE_DEFAULTS and arch != "MixtralForCausalLM" and raw.get("use_sliding_window"):
                raise ModelLoadError(f"config.json: use_sliding_window is set; {arch} is served with full "
                                     "attention only")
            if _rope_type(rope_scaling) == "longrope" and rope_scaling.get("original_max_position_embeddings") is None \
                    and raw.get("original_max_position_embeddings") is not None:
                # Phi-3 keeps the pretrained context beside rope_scaling; transformers moves it in.
                rope_scaling = {**rope_scaling,
                                "original_max_position_embeddings": raw["original_max_position_embeddings"]}
            config = cls(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw.get("intermediate_size_mlp", 16384) if arch == LLAMA4
                                      else raw["intermediate_size"]),  # Llama 4's dense layers
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=latent.pop("num_key_value_heads", int(raw.get("num_key_value_heads") or heads)),
                head_dim=latent.pop("head_dim", head_dim),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(raw.get("layer_norm_eps", 1e-5) if cohere
                                   else raw.get("rms_norm_eps", 1e-5 if arch == LLAMA4 else 1e-6)),
                rope_theta=float(rope_theta or _DEFAULT_THETA.get(arch, 10000.0)),
                rope_scaling=dict(rope_scaling) if rope_scaling else None,
                partial_rotary_factor=partial,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", gemma or cohere or arch in _ERNIES)),
                attention_bias=bool(raw.get("qkv_bias", True) if arch == "Qwen2MoeForCausalLM"
                                    else raw.get("use_bias") if arch in _ERNIES
                                    else raw.get("attention_bias", arch in ("Qwen2ForCausalLM", "Glm4ForCausalLM",
                                                                            "SeedOssForCausalLM", *_GPT_OSS))),
                o_proj_bias=arch not in _O_PROJ_UNBIASED and bool(
                    raw.get("attention_out_bias") if arch == "SeedOssForCausalLM" else raw.get("use_bias")
                    if arch in _ERNIES else raw.get("attention_bias", gpt_oss)),
                attention_sinks=gpt_oss,
                qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM", *_EXAONES,
                                 "Dots1ForCausalLM", "ApertusForCausalLM", AFMOE, *HUNYUANS, *_WHOLE_QK_NORM)
                or (arch in ("Glm4MoeForCausalLM", "CohereForCausalLM") and bool(raw.get("use_qk_norm"))),
                qk_norm_whole=arch in _WHOLE_QK_NORM,
                pre_norms=arch not in _POST_NORMS,
                attn_softcap=_float_or_none(raw, "attn_logit_softcapping", 50.0) if not gemma3 and gemma else None,
                final_softcap=_float_or_none(raw, "final_logit_softcapping", 30.0) if not gemma3 and gemma else None,
                sliding_window=window if sliding_layers != () else None,
                sliding_layers=sliding_layers or None,
                hidden_act=str(raw.get("hidden_activation") or raw.get("hidden_act")
                               or {"ArceeForCausalLM": "relu2", "ApertusForCausalLM": "xielu"}.get(arch, "silu")),
                mlp_gated=arch not in ("ArceeForCausalLM", "ApertusForCausalLM"),
                mlp_bias=mlp_bias,
                embed_scale=float(raw["hidden_size"]) ** 0.5 if gemma or (arch == AFMOE and raw.get("mup_enabled"))
                else float(raw.get("embedding_multiplier", 1.0)) if granite else 1.0,
                embed_scale_rounded=gemma,
                residual_scale=float(raw.get("residual_multiplier", 1.0)) if granite else 1.0,
                logits_divisor=float(raw.get("logits_scaling", 1.0)) if granite else 1.0,
                norm_unit_offset=gemma,
                sandwich_norms=gemma or arch in ("Glm4ForCausalLM", AFMOE),
                # GLM-4 rotates interleaved pairs of features: the loader reorders its q/k rows (rope.py).
                rope_interleaved=latent.pop("rope_interleaved", arch in ("Glm4ForCausalLM", LLAMA4, *_COHERES, *_ERNIES)),
                attn_scale=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5 if gemma
                else float(raw.get("attention_multiplier", 1.0)) if granite else None,
                local_rope_theta=float(local_theta or 10000.0) if gemma3
                else _olmo3_local_theta(arch, rope_scaling, local_theta or rope_theta),
                **moe_fields(raw, arch, int(raw["num_hidden_layers"])),
                **latent,
                nope_layers=_nope_layers(raw, arch, int(raw["num_hidden_layers"])),
                **(llama4_fields(raw, int(raw["num_hidden_layers"])) if arch == LLAMA4 else {}),
                **(afmoe_fields(raw) if arch == AFMOE else {}),
                **(hunyuan_fields(raw) if arch in HUNYUANS else {}),
                **(dict(layer_norm=True, parallel_block=True, logit_scale=float(raw.get("logit_scale") or 0.0625))
                   if cohere else {}),
                mtp_layers=int(raw.get("num_nextn_predict_layers") or 0),
                **quant_fields(raw.get("quantization_config")),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=eos_ids,
                torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
                architecture=arch,
                vision_language=raw.get("vision_language"),
                q_position_scale=_q_position_scale(rope_scaling),
                num_labels=num_labels(raw),
            )
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"config.json has a field of the wrong type: {exc}") from exc
        return replace(config, **overrides) if overrides else config

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ModelLoadError(f"{model_dir} has no config.json; is it a Hugging Face checkpoint directory?") from exc
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path} must hold a JSON object")
        return cls.from_dict(raw)


def _causal_lm_of(arch: str) -> str:
    """The causal LM whose base model ``arch`` names (``Qwen3Model``: embedding checkpoints saved from the base
    model, pooling.py) or which ``arch`` tops with a classification head (``Qwen3ForSequenceClassification``),
    else ``arch``."""
    for suffix in ("Model", CLASSIFIER_SUFFIX):
        if arch.endswith(suffix) and arch.removesuffix(suffix) + "ForCausalLM" in SUPPORTED_ARCHITECTURES:
            return arch.removesuffix(suffix) + "ForCausalLM"
    return arch


CLASSIFIER_SUFFIX = "ForSequenceClassification"


def num_labels(raw: dict[str, Any]) -> int:
    """A sequence-classification checkpoint's classes, as transformers counts them (``id2label``, else
    ``num_labels``, else 2); 0 for any other checkpoint."""
    archs = raw.get("architectures") or []
    if not archs or not str(archs[0]).endswith(CLASSIFIER_SUFFIX):
        return 0
    labels = raw.get("id2label")
    n = len(labels) if isinstance(labels, dict) and labels else int(raw.get("num_labels") or 2)
    if n < 1:
        raise ModelLoadError(f"config.json: a classifier needs at least one label, got num_labels {n}")
    return n


def _olmo3_local_theta(arch: str, rope_scaling: Any, theta: Any) -> float | None:
    """OLMo 3's sliding layers rotate without the full layers' scaling (YaRN): a RoPE of their own then."""
    if arch != "Olmo3ForCausalLM" or not rope_scaling:
        return None
    return float(theta or _DEFAULT_THETA[arch])


def _head_dim(raw: dict[str, Any], arch: str, heads: int) -> int:
    """``head_dim``, else transformers' default: GPT-OSS's 64, MiniMax-M2's 128, hidden_size / heads."""
    defaults = {"GptOssForCausalLM": 64, "MiniMaxM2ForCausalLM": 128, "Glm4ForCausalLM": 128, "Ernie4_5ForCausalLM": 128,
                AFMOE: 128}
    return int(raw.get("head_dim") or defaults.get(arch) or int(raw["hidden_size"]) // heads)


def _partial_rotary(raw: dict[str, Any], arch: str, params: dict[str, Any], head_dim: int) -> float:
    """The share of each head RoPE rotates, as transformers reads it: ``partial_rotary_factor`` (top level or in
    rope_parameters), MiniMax-M2's ``rotary_dim``, GLM-4.5's default of a half; only the architectures whose
    transformers model rotates part of a head may."""
    if params.get("rope_type") == "proportional":  # its share rotates within the whole head (rope.py)
        params = {k: v for k, v in params.items() if k != "partial_rotary_factor"}
    partial = float(raw.get("partial_rotary_factor") or params.get("partial_rotary_factor")
                    or (raw["rotary_dim"] / head_dim if raw.get("rotary_dim") else 0)
                    or (0.5 if arch in ("Glm4ForCausalLM", "Glm4MoeForCausalLM") else 1.0))
    if partial != 1.0 and arch not in _PARTIAL_ROTARY:
        raise ModelLoadError(f"config.json: partial_rotary_factor is {partial}; RoPE over part of each head is "
                             f"supported for {', '.join(_PARTIAL_ROTARY)} only")
    return partial


def _rope_fields(raw: dict[str, Any], arch: str) -> tuple[Any, Any, Any, dict[str, Any]]:
    """The RoPE base, scaling and local base (Gemma 3's sliding layers) as the checkpoint gives them, and its
    ``rope_parameters`` (empty when absent): transformers >= 5 may nest the base there instead of in
    rope_theta, per layer type where those differ (Gemma 3)."""
    rope_scaling, rope_theta = raw.get("rope_scaling"), raw.get("rope_theta")
    local_theta = raw.get("rope_local_base_freq")
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        local_theta = local_theta or (params.get("sliding_attention") or {}).get("rope_theta")
        params = params["full_attention"]
    if isinstance(params, dict):
        rope_theta = rope_theta or params.get("rope_theta")
        if params.get("rope_type", params.get("type", "default")) != "default" and not rope_scaling:
            rope_scaling = params
    if arch in _GPT_OSS and not rope_scaling and rope_theta is None:  # transformers' defaults: YaRN to 128K
        rope_theta, rope_scaling = 150000.0, dict(_GPT_OSS_ROPE)
    if arch == "ApertusForCausalLM" and not rope_scaling and rope_theta is None:  # transformers' default: llama3
        rope_theta, rope_scaling = 12000000.0, dict(_APERTUS_ROPE)
    return rope_theta, rope_scaling, local_theta, params if isinstance(params, dict) else {}


def _rope_type(scaling: dict[str, Any] | None) -> str:
    """``rope_type`` (or the older ``type``) of a ``rope_scaling``; "default" when unscaled."""
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def _q_position_scale(rope_scaling: dict[str, Any] | None) -> tuple[float, float] | None:
    """Ministral 3's query scale by position: its RoPE parameters' ``llama_4_scaling_beta`` and pretrained context."""
    beta = (rope_scaling or {}).get("llama_4_scaling_beta")
    if beta is None:
        return None
    period = rope_scaling.get("original_max_position_embeddings")
    if not period:
        raise ModelLoadError("config.json: llama_4_scaling_beta needs original_max_position_embeddings in the RoPE "
                             "parameters (the period of its query scale)")
    return float(beta), float(period)


def _sliding_window(raw: dict[str, Any], arch: str) -> int | None:
    """The attention window when the checkpoint uses one: Mistral's ``sliding_window`` when set; Qwen's only with
    ``use_sliding_window`` (their configs carry a window they leave off); Llama has none."""
    window = raw.get("sliding_window", 4096 if arch in (*_GEMMAS, "Cohere2ForCausalLM") else 128 if arch in _GPT_OSS
                     else 1024 if arch == AFMOE else 4096 if arch == "ExaoneMoeForCausalLM" else None)  # transformers' defaults
    if arch == "LlamaForCausalLM" or ((arch.startswith("Qwen") or arch == "SmolLM3ForCausalLM")
                                      and not raw.get("use_sliding_window")):
        return None
    if window is not None and int(window) < 1:
        raise ModelLoadError(f"config.json: sliding_window must be >= 1, got {window}")
    return int(window) if window else None


def _sliding_layers(raw: dict[str, Any], arch: str, layers: int) -> tuple[int, ...] | None:
    """Which layers slide, as transformers decides: all of Mistral's, Mixtral's and Phi-3's (they ignore
    ``layer_types``); the others' as ``layer_types`` says, else Qwen's from ``max_window_layers`` (default 28)
    on, Gemma's and GPT-OSS's all but every ``sliding_window_pattern``-th (default 6 for Gemma 3, else 2). None:
    all."""
    if arch in ("MistralForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM", "Ministral3ForCausalLM"):
        return None
    types = raw.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ModelLoadError(f"config.json: layer_types must list one type per layer ({layers})")
        return tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    if arch in (*_GEMMAS, *_GPT_OSS, "Olmo3ForCausalLM", "Cohere2ForCausalLM", AFMOE):
        default = {"Gemma3ForCausalLM": 6, "Olmo3ForCausalLM": 4, "Cohere2ForCausalLM": 4, AFMOE: 4}.get(arch, 2)
        pattern = int(raw.get("global_attn_every_n_layers" if arch == AFMOE else "sliding_window_pattern", default)
                      or default)
        return tuple(i for i in range(layers) if (i + 1) % pattern)
    if arch in _EXAONES:  # "LLLG": local, local, local, global, repeated; n: every n-th global
        pattern = raw.get("sliding_window_pattern", 4)
        if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
            return tuple(i for i in range(layers) if pattern[i % len(pattern)] == "L")
        return tuple(i for i in range(layers) if (i + 1) % int(pattern))
    return tuple(range(int(raw.get("max_window_layers", 62 if arch == "Dots1ForCausalLM" else 28)), layers))


def _nope_layers(raw: dict[str, Any], arch: str, layers: int) -> tuple[int, ...]:
    """Layers without RoPE, as transformers reads them: SmolLM3's ``no_rope_layers`` (1 = RoPE, 0 = none, per
    layer), else every ``no_rope_layer_interval``-th (default 4); EXAONE 4's and Cohere 2's global layers when
    others slide."""
    if arch in (*_EXAONES, "Cohere2ForCausalLM"):
        if _sliding_window(raw, arch) is None:  # Cohere 2 rotates in its sliding layers only: then none
            return () if arch in _EXAONES else tuple(range(layers))
        local = _sliding_layers(raw, arch, layers)
        return tuple(i for i in range(layers) if i not in local)
    if arch == LLAMA4:
        return llama4_nope_layers(raw, layers)
    if arch == AFMOE:  # RoPE in its sliding layers only, whatever the window
        local = _sliding_layers(raw, arch, layers)
        return tuple(i for i in range(layers) if i not in local)
    if arch != "SmolLM3ForCausalLM":
        return ()
    flags = raw.get("no_rope_layers")
    if flags is None:
        interval = int(raw.get("no_rope_layer_interval") or 4)
        return tuple(i for i in range(layers) if (i + 1) % interval == 0)
    if not isinstance(flags, list) or len(flags) != layers:
        raise ModelLoadError(f"config.json: no_rope_layers must give one 0 or 1 per layer ({layers})")
    return tuple(i for i, uses_rope in enumerate(flags) if not uses_rope)


def _float_or_none(raw: dict[str, Any], name: str, default: float) -> float | None:
    """A field that may be absent (``default``) or null (None)."""
    value = raw.get(name, default)
    return None if value is None else float(value)


# Architectures whose MLP transformers builds with mlp_bias; ERNIE's use_bias puts biases on every projection.
_MLP_BIAS = ("LlamaForCausalLM", "ArceeForCausalLM", "GraniteForCausalLM", "SeedOssForCausalLM", "SmolLM3ForCausalLM")


def _mlp_bias(raw: dict[str, Any], arch: str) -> bool:
    """Whether the MLP's projections have biases, where transformers reads that for ``arch``; set where it
    does not, refused (transformers would build no bias, the checkpoint would hold one it ignores)."""
    if arch in _ERNIES:
        return bool(raw.get("use_bias"))
    if raw.get("mlp_bias") and arch not in _MLP_BIAS:
        raise ModelLoadError(f"config.json: mlp_bias is set; {arch}'s MLP has no biases in transformers")
    if raw.get("use_bias"):
        raise ModelLoadError(f"config.json: use_bias is set; {arch} has no projections with biases")
    return bool(raw.get("mlp_bias"))


def _check_gemma(raw: dict[str, Any], gemma3: bool) -> None:
    """Refuses what the engine does not compute, saying what it found."""
    for name in ("final_logit_softcapping", "attn_logit_softcapping") if gemma3 else ():
        if raw.get(name) is not None:
            raise ModelLoadError(f"config.json: {name} is {raw[name]}; Gemma 3 checkpoints are not soft-capped")
    if not float(raw.get("query_pre_attn_scalar", 256)) > 0:
        raise ModelLoadError(f"config.json: query_pre_attn_scalar must be > 0, got {raw['query_pre_attn_scalar']}")
    if raw.get("use_bidirectional_attention"):
        raise ModelLoadError("config.json: use_bidirectional_attention is set; only causal attention is supported")


def _check_longrope(scaling: dict[str, Any], rotary_dim: int) -> None:
    """LongRoPE needs one short and one long factor per rotated frequency and the pretrained context."""
    for name in ("short_factor", "long_factor"):
        factors = scaling.get(name)
        if not isinstance(factors, list) or len(factors) != rotary_dim // 2 \
                or not all(isinstance(f, int | float) and f > 0 for f in factors):
            raise ModelLoadError(f"config.json: rope_scaling.{name} must list {rotary_dim // 2} positive numbers "
                                 "(one per rotated frequency)")
    original = scaling.get("original_max_position_embeddings")
    if not isinstance(original, int) or original < 2:
        raise ModelLoadError("config.json: LongRoPE needs original_max_position_embeddings (the pretrained context), "
                             f"an integer >= 2; got {original!r}")


def add_max_model_len_flag(p: argparse.ArgumentParser) -> None:
    """``--max-model-len``, vLLM's name: the scheduler and every worker take the same value (docker-compose.yml
    gives them all ``SEAWALL_MAX_MODEL_LEN``; empty there means the model's)."""
    env = os.environ.get("SEAWALL_MAX_MODEL_LEN", "").strip()
    if env and not env.isdigit():
        p.error(f"SEAWALL_MAX_MODEL_LEN must be a whole number of tokens, got {env!r}")
    p.add_argument("--max-model-len", type=int, default=int(env) if env else None,
                   help="longest context served, prompt and output (default: $SEAWALL_MAX_MODEL_LEN, else the "
                        "model's max_position_embeddings; LongRoPE models keep their short factors at or below "
                        "their pretrained context)")
