"""Checkpoint tensors the model holds under other names: EXAONE 3's GPT-2-style names, Mixtral's and MiniMax-M2's
routers and routing bias, Apertus's and AFMoE's norms, AFMoE's router and routing bias, Hunyuan's q/k norms, router and shared MLP, GLM-4.5's shared experts, Granite MoE's stacked experts, router and shared MLP, ERNIE
4.5's routing bias, MiMo-V2-Flash's sinks, LFM2's attention, MLP and norms, and GLM-4's four norms, which transformers names by where they sit rather than by what
they norm (its ``post_attention_layernorm`` is the MLP's input norm)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from services.engine import (
    aria,
    axk2,
    flint,
    gpt_neox_japanese,
    laguna,
    lara_mini,
    lfm3,
    mamba,
    nanochat,
    nemotron_h,
    olmo_hybrid,
    recurrent_gemma,
)
from services.engine.afmoe import ARCH as AFMOE
from services.engine.afmoe import RENAMES as AFMOE_RENAMES
from services.engine.biogpt import ARCH as BIOGPT
from services.engine.biogpt import RENAMES as BIOGPT_RENAMES
from services.engine.bloom import ARCH as BLOOM
from services.engine.bloom import RENAMES as BLOOM_RENAMES
from services.engine.codegen import ARCH as CODEGEN
from services.engine.dbrx import ARCH as DBRX
from services.engine.dbrx import RENAMES as DBRX_RENAMES
from services.engine.falcon import ARCH as FALCON
from services.engine.falcon import RENAMES as FALCON_RENAMES
from services.engine.falcon_h1 import ARCH as FALCON_H1
from services.engine.falcon_h1 import RENAMES as FALCON_H1_RENAMES
from services.engine.gpt2 import ARCH as GPT2
from services.engine.gpt2 import RENAMES as GPT2_RENAMES
from services.engine.gpt_bigcode import ARCH as GPT_BIGCODE
from services.engine.gpt_bigcode import RENAMES as GPT_BIGCODE_RENAMES
from services.engine.gpt_neo import ARCH as GPT_NEO
from services.engine.gpt_neo import RENAMES as GPT_NEO_RENAMES
from services.engine.gpt_neox import ARCH as GPT_NEOX
from services.engine.gpt_neox import RENAMES as GPT_NEOX_RENAMES
from services.engine.gptj import ARCH as GPTJ
from services.engine.gptj import RENAMES as GPTJ_RENAMES
from services.engine.hunyuan import ARCHS as HUNYUANS
from services.engine.hunyuan import RENAMES as HUNYUAN_RENAMES
from services.engine.jamba import ARCH as JAMBA
from services.engine.jamba import RENAMES as JAMBA_RENAMES
from services.engine.kimi_linear import ARCH as KIMI_LINEAR
from services.engine.kimi_linear import RENAMES as KIMI_LINEAR_RENAMES
from services.engine.llama4 import ARCH as LLAMA4
from services.engine.llama4 import RENAMES as LLAMA4_RENAMES
from services.engine.mimo_v2 import ARCH as MIMO_V2
from services.engine.mpt import ARCH as MPT
from services.engine.mpt import RENAMES as MPT_RENAMES
from services.engine.opt import ARCH as OPT
from services.engine.opt import RENAMES as OPT_RENAMES
from services.engine.persimmon import ARCH as PERSIMMON
from services.engine.persimmon import RENAMES as PERSIMMON_RENAMES
from services.engine.xglm import ARCH as XGLM
from services.engine.xglm import RENAMES as XGLM_RENAMES

if TYPE_CHECKING:
    import torch

    from services.engine.model_config import ModelConfig

_RENAMES = ((".block_sparse_moe.gate.", ".mlp.gate."), (".mlp.shared_experts.", ".mlp.shared_expert."),
            (".block_sparse_moe.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
            (".mlp.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
            (".block_sparse_moe.input_linear.weight", ".mlp.experts.gate_up_proj"),
            (".block_sparse_moe.output_linear.weight", ".mlp.experts.down_proj"),
            (".block_sparse_moe.router.layer.", ".mlp.gate."),
            # GraniteMoe's experts as transformers >= 5 saves a model it has no legacy layout for (GraniteMoeSWA)
            (".block_sparse_moe.experts.gate_up_proj", ".mlp.experts.gate_up_proj"),
            (".block_sparse_moe.experts.down_proj", ".mlp.experts.down_proj"),
            (".block_sparse_moe.router.weight", ".mlp.gate.weight"),
            (".shared_mlp.input_linear.", ".mlp.shared_expert.gate_up_proj."),
            (".shared_mlp.output_linear.", ".mlp.shared_expert.down_proj."))
# GLM-4 (dense): its sandwich norms under the names Gemma's have here; one rename per name (they overlap).
_GLM4 = ((".post_self_attn_layernorm.", ".post_attention_layernorm."),
         (".post_attention_layernorm.", ".pre_feedforward_layernorm."),
         (".post_mlp_layernorm.", ".post_feedforward_layernorm."))


# Phi-1.5 / Phi-2: GPT-style names for Llama's tensors.
_PHI = ((".self_attn.dense.", ".self_attn.o_proj."), (".mlp.fc1.", ".mlp.up_proj."), (".mlp.fc2.", ".mlp.down_proj."),
        ("model.final_layernorm.", "model.norm."))


# HyperCLOVA X: its peri-layer norms under the names Gemma's sandwich norms have here; one rename per name.
_HYPERCLOVAX = ((".post_attention_layernorm.", ".pre_feedforward_layernorm."),
                (".post_norm1.", ".post_attention_layernorm."), (".post_norm2.", ".post_feedforward_layernorm."))


# EXAONE 3 / 3.5: GPT-2's names for Llama's tensors (transformers saves them so too, as a LlamaForCausalLM).
_EXAONE = (("transformer.wte.", "model.embed_tokens."), ("transformer.h.", "model.layers."),
           ("transformer.ln_f.", "model.norm."), (".attn.attention.", ".self_attn."),
           (".self_attn.out_proj.", ".self_attn.o_proj."), (".ln_1.", ".input_layernorm."),
           (".ln_2.", ".post_attention_layernorm."), (".mlp.c_fc_0.", ".mlp.gate_proj."),
           (".mlp.c_fc_1.", ".mlp.up_proj."), (".mlp.c_proj.", ".mlp.down_proj."))


# LFM2: Llama's tensors under its own names (its conv layers' are the model's own).
_LFM2 = ((".self_attn.out_proj.", ".self_attn.o_proj."), (".self_attn.q_layernorm.", ".self_attn.q_norm."),
         (".self_attn.k_layernorm.", ".self_attn.k_norm."), (".feed_forward.w1.", ".mlp.gate_proj."),
         (".feed_forward.w3.", ".mlp.up_proj."), (".feed_forward.w2.", ".mlp.down_proj."),
         (".operator_norm.", ".input_layernorm."), (".ffn_norm.", ".post_attention_layernorm."),
         ("model.embedding_norm.", "model.norm."))


# Each architecture's own names, applied in order after the shared ones.
_BY_ARCHITECTURE = {
    # Apertus: its two norms named for what they feed.
    "ApertusForCausalLM": ((".attention_layernorm.", ".input_layernorm."),
                           (".feedforward_layernorm.", ".post_attention_layernorm.")),
    AFMOE: AFMOE_RENAMES, **dict.fromkeys(HUNYUANS, HUNYUAN_RENAMES),
    # VaultGemma: its MLP's input norm, under Gemma 2's name for it.
    "VaultGemmaForCausalLM": ((".pre_feedforward_layernorm.", ".post_attention_layernorm."),),
    "Lfm2ForCausalLM": _LFM2,
    "Lfm2MoeForCausalLM": (*_LFM2, (".feed_forward.experts.", ".mlp.experts."), (".feed_forward.gate.", ".mlp.gate."),
                           (".feed_forward.expert_bias", ".mlp.gate.e_score_correction_bias")),
    "PhimoeForCausalLM": ((".mlp.router.", ".mlp.gate."),),  # its router, as transformers 5 saves it
    "PhiForCausalLM": _PHI,
    JAMBA: JAMBA_RENAMES, KIMI_LINEAR: KIMI_LINEAR_RENAMES, FALCON_H1: FALCON_H1_RENAMES, GPT_NEOX: GPT_NEOX_RENAMES, FALCON: FALCON_RENAMES,
    OPT: OPT_RENAMES, GPT2: GPT2_RENAMES, GPT_BIGCODE: GPT_BIGCODE_RENAMES, GPTJ: GPTJ_RENAMES, BLOOM: BLOOM_RENAMES,
    MPT: MPT_RENAMES, GPT_NEO: GPT_NEO_RENAMES, DBRX: DBRX_RENAMES, CODEGEN: GPTJ_RENAMES, BIOGPT: BIOGPT_RENAMES,
    PERSIMMON: PERSIMMON_RENAMES, XGLM: XGLM_RENAMES,
    LLAMA4: LLAMA4_RENAMES,  # llama4_weights renames its tensors first: these are for adapters' names
    "BambaForCausalLM": ((".feed_forward.", ".mlp."), (".pre_ff_layernorm.", ".post_attention_layernorm."),
                         ("model.final_layernorm.", "model.norm.")),
    "Starcoder2ForCausalLM": ((".mlp.c_fc.", ".mlp.up_proj."), (".mlp.c_proj.", ".mlp.down_proj.")),  # GPT-2's
    MIMO_V2: ((".self_attn.attention_sink_bias", ".self_attn.sinks"),),  # its sliding layers' sinks
    nanochat.ARCH: nanochat.RENAMES, laguna.ARCH: laguna.RENAMES, flint.ARCH: flint.RENAMES,
    axk2.ARCH: axk2.RENAMES, recurrent_gemma.ARCH: recurrent_gemma.RENAMES, lara_mini.ARCH: lara_mini.RENAMES,
    olmo_hybrid.ARCH: olmo_hybrid.RENAMES, aria.ARCH: aria.RENAMES, gpt_neox_japanese.ARCH: gpt_neox_japanese.RENAMES,
    # A.X K1: its MoE blocks' output norm, stored on the layer (transformers renames it so too).
    "AXK1ForCausalLM": ((".post_mlp_layernorm.", ".mlp.post_mlp_layernorm."),),
    # Kolibri-1: its routing bias and output norms as released, under GLM-4's names (renamed on from there).
    "Kolibri1ForCausalLM": ((".moe.router.expert_bias", ".mlp.gate.e_score_correction_bias"),
                            (".post_attn_norm.", ".post_self_attn_layernorm."), (".post_ffn_norm.", ".post_mlp_layernorm.")),
    # Hy3: its router, routing bias and shared MLP as released (transformers' names for them too).
    "HYV3ForCausalLM": ((".mlp.router.gate.", ".mlp.gate."), (".mlp.expert_bias", ".mlp.gate.e_score_correction_bias"),
                        (".mlp.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
                        (".mlp.shared_mlp.", ".mlp.shared_expert.")),
}


# Architectures whose tensors are under ``transformer.`` by names of their own, not EXAONE's.
_OWN_TRANSFORMER_NAMES = (FALCON, GPT2, GPT_BIGCODE, GPTJ, BLOOM, MPT, GPT_NEO, DBRX, CODEGEN)


def checkpoint_name(name: str, architecture: str = "") -> str:
    """The name the model holds a checkpoint's tensor by."""
    if architecture == "GraniteMoeHybridForCausalLM":  # dense Granite 4.0: its shared MLP is the MLP
        name = name.replace(".shared_mlp.input_linear.", ".mlp.gate_up_proj.").replace(
            ".shared_mlp.output_linear.", ".mlp.down_proj.")
    if name.startswith("transformer.") and architecture not in _OWN_TRANSFORMER_NAMES:  # EXAONE's layout
        for old, new in _EXAONE:
            name = name.replace(old, new)
    for old, new in (*_RENAMES, *_BY_ARCHITECTURE.get(architecture, ())):
        name = name.replace(old, new)
    if architecture in ("Glm4ForCausalLM", "HyperCLOVAXForCausalLM", "Kolibri1ForCausalLM"):  # four norms a layer
        renames = _HYPERCLOVAX if architecture == "HyperCLOVAXForCausalLM" else _GLM4
        old, new = next(((o, n) for o, n in renames if o in name), ("", ""))
        name = name.replace(old, new) if old else name
    return name


def model_name(name: str, config: ModelConfig) -> str:
    """The name the model holds a checkpoint's tensor by, from the name alone (an adapter's, which names the weight
    it adapts): the loader's renames in its order (``loader._arranged``'s LFM3 and Nemotron-H stages, which rename
    by the layer's kind, then ``checkpoint_name``)."""
    named = iter([(name, None)])
    if config.architecture == lfm3.ARCH:
        named = lfm3.checkpoint_names(named, config.sandwich_norms)
    if config.architecture in (nemotron_h.ARCH, *mamba.ARCHS):
        named = nemotron_h.checkpoint_names(named, config.sublayers, config.linear_layers)
    return checkpoint_name(next(named, (name, None))[0], config.architecture)


def split_query_key_value(weights: Iterator[tuple[str, torch.Tensor]], layout: str, num_heads: int,
                          num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
    """A fused ``query_key_value`` projection (weight and bias; GPT-NeoX's, Falcon's) as the q, k and v projections
    the model holds, its rows read in ``layout``: ``per_head``, each head's ``[q | k | v]`` in turn; ``grouped``,
    each key/value head's queries, then its key and its value (Falcon's new architecture); ``multi_query``, every
    query head, then the one key and the one value (Falcon-7B)."""
    for name, tensor in weights:
        if ".query_key_value." not in name:
            yield name, tensor
            continue
        rest = tensor.shape[1:]
        if layout == "grouped":
            groups = tensor.reshape(num_kv_heads, num_heads // num_kv_heads + 2, -1, *rest)
            parts = groups[:, :-2], groups[:, -2], groups[:, -1]
        elif layout == "multi_query":
            heads = tensor.reshape(num_heads + 2, -1, *rest)
            parts = heads[:num_heads], heads[num_heads], heads[num_heads + 1]
        else:
            heads = tensor.reshape(num_heads, 3, -1, *rest)
            parts = heads[:, 0], heads[:, 1], heads[:, 2]
        for part, rows in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
            yield name.replace(".query_key_value.", f".{part}."), rows.reshape(-1, *rest).contiguous()


def ernie_weights(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """ERNIE 4.5 MoE's tensors as the model holds them: its routing bias, stored ``[1, experts]`` under
    ``moe_statics``, as the router's; its multi-token-prediction block (``mtp_*``; K-EXAONE's ``mtp.*``)
    skipped, as transformers skips it."""
    for name, tensor in weights:
        if name.startswith(("model.mtp", "mtp")):
            continue
        if name.endswith(".mlp.moe_statics.e_score_correction_bias"):
            name, tensor = name.replace(".mlp.moe_statics.", ".mlp.gate."), tensor.reshape(-1)
        yield name, tensor


def split_query_gates(weights: Iterator[tuple[str, torch.Tensor]], head_dim: int,
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """MiniCPM5-MoE's ``q_proj`` (transformers' ``q_gate_proj``) as the query and output-gate projections the
    model holds: each head's rows are its query's ``head_dim`` then its gate's (transformers views the output
    per head as ``[q | gate]``)."""
    for name, tensor in weights:
        if not name.endswith((".self_attn.q_proj.weight", ".self_attn.q_proj.bias", ".self_attn.q_gate_proj.weight",
                              ".self_attn.q_gate_proj.bias")):
            yield name, tensor
            continue
        pairs = tensor.reshape(-1, 2, head_dim, *tensor.shape[1:])
        base = name.replace(".q_gate_proj.", ".q_proj.")
        for i, part in enumerate(("q_proj", "gate_proj")):
            yield base.replace(".q_proj.", f".{part}."), pairs[:, i].reshape(-1, *tensor.shape[1:]).contiguous()
