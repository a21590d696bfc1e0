"""Vision-language checkpoints served as their language model, against transformers' vision-language models
on text-only prompts: checkpoints written by transformers itself (the vision tower beside the language model),
greedy tokens and logprobs through the engine; published configs read as transformers reads them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from seawall.offline.engine import OfflineEngine
from services.common.errors import ModelLoadError
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.engine.model_config import ModelConfig
from services.engine.vision_language import TEXT_DEFAULTS, language_model_weights
from services.scheduler.core.scheduler import SchedulerConfig
from tests.engine.test_architectures import COMMON, MAX_TOKENS, assert_matches_transformers, save_checkpoint

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

transformers = pytest.importorskip("transformers")

_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
               patch_size=14)
_QWEN_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
_QWEN3_5_TEXT = dict(head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                     linear_value_head_dim=24, layer_types=["linear_attention", "full_attention", "linear_attention"],
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                      "mrope_section": [2, 1, 1], "mrope_interleaved": True})
CASES = {
    # Gemma 3 (4B and up): the text model's sliding and full layers, linear scaling on the full layers only,
    # the head tied by default.
    "gemma3": lambda: transformers.Gemma3Config(
        text_config=dict(head_dim=32, query_pre_attn_scalar=24, sliding_window=24, sliding_window_pattern=2,
                         rope_scaling={"rope_type": "linear", "factor": 8.0}, **COMMON),
        vision_config=_VISION, mm_tokens_per_image=4),
    # Gemma 4 (E2B's layout, with its audio tower): wider full-attention heads, KV shared by the last layers, their
    # MLPs twice as wide, per-layer inputs.
    "gemma4": lambda: transformers.Gemma4Config(
        text_config=dict(head_dim=16, global_head_dim=32, sliding_window=24, hidden_size_per_layer_input=8,
                         vocab_size_per_layer_input=4096, num_kv_shared_layers=2, use_double_wide_mlp=True,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                                      "full_attention"], **{**COMMON, "num_hidden_layers": 5}),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16),
        audio_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, output_proj_dims=32,
                          subsampling_conv_channels=[8, 4])),
    # Mistral Small 3.x: Mistral's text model; tied (no head stored), as the config says by default.
    "mistral3": lambda: transformers.Mistral3Config(
        text_config=dict(model_type="mistral", sliding_window=None, **COMMON),
        vision_config=dict(_VISION, model_type="pixtral", head_dim=16)),
    # Ministral 3 (its released checkpoints are Mistral3's): the "llama 4 scaling" of its queries.
    "ministral3": lambda: transformers.Mistral3Config(
        text_config=dict(model_type="ministral3", head_dim=16, rope_parameters={
            "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 32,
            "max_position_embeddings": 512, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.5}, **COMMON),
        vision_config=dict(_VISION, model_type="pixtral", head_dim=16)),
    # LLaVA over Llama; its head stored.
    "llava": lambda: transformers.LlavaConfig(
        text_config=dict(model_type="llama", **COMMON),
        vision_config=dict(_VISION, model_type="clip_vision_model", projection_dim=32)),
    "llava-next": lambda: transformers.LlavaNextConfig(
        text_config=dict(model_type="mistral", sliding_window=24, **COMMON),
        vision_config=dict(_VISION, model_type="clip_vision_model", projection_dim=32),
        image_grid_pinpoints=[[28, 28]]),
    # Qwen2-VL and Qwen2.5-VL: Qwen2's text model (q/k/v biases) with multimodal RoPE sections; weights under
    # model. and visual.
    "qwen2-vl": lambda: transformers.Qwen2VLConfig(
        text_config=dict(rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}, **COMMON),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)),
    "qwen2.5-vl": lambda: transformers.Qwen2_5_VLConfig(
        text_config=dict(rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}, **COMMON),
        vision_config=_QWEN_VISION),
    # Qwen3-VL: Qwen3's (q/k norms), the sections interleaved; weights under model.language_model.
    "qwen3-vl": lambda: transformers.Qwen3VLConfig(
        text_config=dict(head_dim=16, rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3],
                                                    "mrope_interleaved": True}, **COMMON),
        vision_config=dict(_QWEN_VISION, deepstack_visual_indexes=[0])),
    # Qwen3-VL-MoE: Qwen3-MoE's text model (2 of 8 experts, always renormalized), experts stored stacked.
    "qwen3-vl-moe": lambda: qwen3_vl_moe_config(),
    # Qwen3.5 and its MoE (as released: Qwen3_5ForConditionalGeneration): Qwen3-Next's gated attention and Gated
    # DeltaNet linear layers (projections stored apart), a quarter of each head rotated in interleaved sections.
    "qwen3.5": lambda: transformers.Qwen3_5Config(
        text_config=dict(_QWEN3_5_TEXT, **COMMON), vision_config=_QWEN_VISION),
    "qwen3.5-moe": lambda: transformers.Qwen3_5MoeConfig(
        text_config=dict(_QWEN3_5_TEXT, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=48, **COMMON),
        vision_config=_QWEN_VISION),
    # GLM-4.1V: GLM-4's text model (sandwich norms, q/k/v biases, RoPE over part of each head in interleaved
    # pairs) with multimodal sections; GLM-4.5V: GLM-4.5's (DeepSeek-V3's routing, half of each head rotated).
    "glm4v": lambda: transformers.Glm4vConfig(
        text_config=dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                          "partial_rotary_factor": 0.5}, **COMMON),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)),
    "glm4v-moe": lambda: transformers.Glm4vMoeConfig(
        text_config=dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                          "partial_rotary_factor": 0.5},
                         n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                         first_k_dense_replace=1, **COMMON),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)),
    "glm46v": lambda: transformers.Glm46VConfig(
        text_config=dict(model_type="glm4v_moe_text", rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5},
            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
            first_k_dense_replace=1, **COMMON),
        vision_config=dict(model_type="glm4v_vision", depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64)),
    # Aya Vision: Cohere 2's text model (Command R7B's), tied by default.
    "aya-vision": lambda: transformers.AyaVisionConfig(
        text_config=dict(model_type="cohere2", sliding_window=24, logit_scale=0.3,
                         **{**COMMON, "num_hidden_layers": 4, "pad_token_id": 0}),
        vision_config=dict(_VISION, model_type="siglip_vision_model"), downsample_factor=1),
    # Llama 4 (Scout, Maverick): its chunked attention, NoPE layers and routing (tests/engine/test_architectures.py).
    "llama4": lambda: transformers.Llama4Config(
        text_config=dict(head_dim=16, no_rope_layers=[1, 0, 1, 0], attention_chunk_size=24, floor_scale=16,
                         attn_scale=0.5, interleave_moe_layer_step=2, num_local_experts=4, num_experts_per_tok=1,
                         intermediate_size_mlp=96, **{**COMMON, "num_hidden_layers": 4, "intermediate_size": 32}),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14, vision_output_dim=32, projector_input_dim=32,
                           projector_output_dim=32)),
    # Aria: its language model's experts as released (mlp.experts.fc1 / fc2, [experts, in, out]).
    "aria": lambda: transformers.AriaConfig(
        text_config=dict(model_type="aria_text", moe_num_experts=4, moe_topk=2, moe_num_shared_experts=2,
                         **{**COMMON, "intermediate_size": 32}),
        vision_config=dict(_VISION, model_type="idefics3_vision"), projector_patch_to_query_dict={1: 4, 4: 4},
        image_token_id=5),
    # Cohere's Compass (North-Micro-Vision): Qwen3-VL's wrapper around Cohere 2's block; full layers without
    # positions here, the sliding ones' multimodal RoPE plain for text.
    "cohere-compass": lambda: transformers.CohereCompassConfig(
        text_config=dict(model_type="cohere_compass_text", sliding_window=24,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                                "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                                          "full_attention": None},
                         **{**COMMON, "num_hidden_layers": 4, "head_dim": 16, "pad_token_id": 0}),
        vision_config=dict(_QWEN_VISION, deepstack_visual_indexes=[0])),
    # Emu3: Llama under text_model (its VQ-VAE, which turns images into tokens, skipped).
    "emu3": lambda: transformers.Emu3Config(
        text_config={**COMMON, "pad_token_id": 0},
        vq_config=dict(codebook_size=64, base_channels=32, channel_multiplier=[1, 1], num_res_blocks=1,
                       attn_resolutions=[], hidden_size=32, embed_dim=4, latent_channels=4),
        vocabulary_map={"<image>": 5, "<|visual token 000000|>": 6}),
    # Apertus 1.5: images and audio come in as tokens (from tokenizers of their own, skipped here); its output head
    # pruned to the text tokens, the first 3000.
    "apertus1.5": lambda: transformers.Apertus1p5Config(
        text_config=dict(output_vocab_size=3000, **COMMON),
        vision_config=dict(codebook_size=512, embed_dim=8, latent_channels=8, base_channels=32, channel_multiplier=[1, 1],
                           num_res_blocks=1, attn_resolutions=[], resolution=16),
        audio_config=dict(model_type="wavtokenizer_encoder", codebook_size=64, hidden_size=16, num_filters=4,
                          codebook_dim=16),
        image_token_offset=3000, audio_token_offset=3512, image_token_id=5, audio_token_id=6),
}


def qwen3_vl_moe_config():
    return transformers.Qwen3VLMoeConfig(
        text_config=dict(head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                         rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                         **COMMON),
        vision_config=dict(_QWEN_VISION, deepstack_visual_indexes=[0]))


def _save(name, out, tiny_model_dir):
    return save_checkpoint(CASES[name](), out, tiny_model_dir, auto=transformers.AutoModelForImageTextToText)


def _generate(path, prompts, cpu_kernels=True):
    engine = OfflineEngine(EngineConfig(model=str(path), dtype="float32", cpu_kernels=cpu_kernels),
                           SchedulerConfig(chunk_size=16))
    return engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                                    logprobs=0)] * len(prompts))


def _prompts(seed=3, lengths=(1, 17, 40, 150)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 4096, (n,), generator=g).tolist() for n in lengths]


# The wrappers change which weights and config fields the language model reads, not how it attends: each runs on
# the fused kernels here; both attention paths of each language model are in test_architectures (Qwen3-VL's and
# Llama 4's both here too).
@pytest.mark.parametrize(("name", "cpu_kernels"), [(n, k) for n in CASES for k in (True, False)
                                                   if k or n in ("qwen3-vl", "llama4")],
                         ids=lambda v: v if isinstance(v, str) else ("kernels" if v else "torch"))
def test_language_model_matches_transformers_on_text(name, cpu_kernels, tmp_path, tiny_model_dir):
    model = _save(name, tmp_path, tiny_model_dir)
    config = ModelConfig.from_dir(tmp_path)
    assert config.vision_language == model.config.architectures[0]
    if name == "llama4":  # transformers' text-only generate fails on its output (image_outputs); with no image
        model = model.language_model  # its forward is its language model's, on the same weights
    prompts = _prompts()
    assert_matches_transformers(model, prompts, _generate(tmp_path, prompts, cpu_kernels))


def test_a_head_of_its_own_wins_over_a_tie_the_config_implies(tmp_path, tiny_model_dir):
    """Mistral Small 3.1's config.json as published leaves tie_word_embeddings out (transformers then ties by
    default) and stores a head of its own: transformers keeps that head, and so must the engine."""
    model = save_checkpoint(transformers.Mistral3Config(
        text_config=dict(model_type="mistral", sliding_window=None, **COMMON),
        vision_config=dict(_VISION, model_type="pixtral", head_dim=16), tie_word_embeddings=False),
        tmp_path, tiny_model_dir, auto=transformers.AutoModelForImageTextToText)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert ModelConfig.from_dir(tmp_path).tie_word_embeddings
    prompts = _prompts(lengths=(5, 30))
    assert_matches_transformers(model, prompts, _generate(tmp_path, prompts))


# Published config.json files (vision_config left out: it is not read), as their repositories hold them.
GEMMA3_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
             "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
             "mm_tokens_per_image": 256, "model_type": "gemma3", "torch_dtype": "bfloat16",
             "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                             "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                             "sliding_window": 1024}}
LLAVA_15_7B = {"architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100, "image_token_index": 32000,
               "model_type": "llava", "pad_token_id": 32001, "projector_hidden_act": "gelu",
               "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                               "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                               "torch_dtype": "float16", "vocab_size": 32064},
               "tie_word_embeddings": False, "torch_dtype": "float16", "vision_feature_layer": -2}
QWEN25_VL_7B = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
                "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
                "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
                "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
                "intermediate_size": 18944, "max_position_embeddings": 128000, "max_window_layers": 28,
                "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
                "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
                "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
                "use_sliding_window": False, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                "vocab_size": 152064}
MISTRAL_SMALL_31 = {"architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10,
                    "model_type": "mistral3", "multimodal_projector_bias": False, "projector_hidden_act": "gelu",
                    "spatial_merge_size": 2,
                    "text_config": {"head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
                                    "intermediate_size": 32768, "max_position_embeddings": 131072,
                                    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40,
                                    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0,
                                    "sliding_window": None, "use_cache": True, "vocab_size": 131072},
                    "torch_dtype": "bfloat16", "vision_feature_layer": -1}
QWEN3_VL_30B_A3B = {"architectures": ["Qwen3VLMoeForConditionalGeneration"], "image_token_id": 151655,
                    "model_type": "qwen3_vl_moe", "tie_word_embeddings": False, "video_token_id": 151656,
                    "vision_end_token_id": 151653, "vision_start_token_id": 151652,
                    "text_config": {"attention_bias": False, "bos_token_id": 151643, "decoder_sparse_step": 1,
                                    "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
                                    "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 262144,
                                    "mlp_only_layers": [], "model_type": "qwen3_vl_moe_text",
                                    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32,
                                    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
                                    "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
                                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                                     "rope_type": "default"},
                                    "rope_theta": 5000000, "vocab_size": 151936}}
LLAMA4_SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080,
                "eoi_token_index": 200081, "image_token_index": 200092, "model_type": "llama4",
                "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "text_config": {"attention_bias": False, "attention_chunk_size": 8192, "attn_scale": 0.1,
                                "attn_temperature_tuning": True, "bos_token_id": 200000,
                                "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "head_dim": 128,
                                "hidden_act": "silu", "hidden_size": 5120, "interleave_moe_layer_step": 1,
                                "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                                "max_position_embeddings": 10485760, "model_type": "llama4_text", "no_rope_layers": [],
                                "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48,
                                "num_key_value_heads": 8, "num_local_experts": 16, "pad_token_id": 200018,
                                "rms_norm_eps": 1e-05, "rope_scaling": {
                                    "factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                                    "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                                "rope_theta": 500000.0, "torch_dtype": "bfloat16", "use_qk_norm": True,
                                "vocab_size": 202048}}
PUBLISHED = {"gemma-3-4b-it": (GEMMA3_4B, "Gemma3Config"), "llava-1.5-7b-hf": (LLAVA_15_7B, "LlavaConfig"),
             "Qwen2.5-VL-7B-Instruct": (QWEN25_VL_7B, "Qwen2_5_VLConfig"),
             "Mistral-Small-3.1-24B-Instruct-2503": (MISTRAL_SMALL_31, "Mistral3Config"),
             "Qwen3-VL-30B-A3B-Instruct": (QWEN3_VL_30B_A3B, "Qwen3VLMoeConfig"),
             "Llama-4-Scout-17B-16E-Instruct": (LLAMA4_SCOUT, "Llama4Config")}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_configs_are_read_as_transformers_reads_them(name):
    raw, config_class = PUBLISHED[name]
    config = ModelConfig.from_dict(raw)
    hf = getattr(transformers, config_class)(**raw).get_text_config()
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "max_position_embeddings", "rms_norm_eps"):
        if field != "intermediate_size" or hf.model_type != "llama4_text":  # the experts' width there (below)
            assert getattr(config, field) == getattr(hf, field), field
    experts = next((getattr(hf, n) for n in ("num_experts", "num_local_experts") if hasattr(hf, n)), 0)
    assert (config.num_experts, config.num_experts_per_tok) == (experts, getattr(hf, "num_experts_per_tok", 0))
    assert config.head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    layers = hf.num_hidden_layers
    types = getattr(hf, "layer_types", None) or ["full_attention"] * layers
    if hf.model_type == "mistral" and hf.sliding_window:
        types = ["sliding_attention"] * layers
    assert [config.slides(i) for i in range(layers)] == [t == "sliding_attention" for t in types]
    params = hf.rope_parameters.get("full_attention", hf.rope_parameters)
    assert config.rope_theta == params["rope_theta"]
    assert config.rope_type == params["rope_type"]
    assert config.torch_dtype == "bfloat16" if name != "llava-1.5-7b-hf" else config.torch_dtype == "float16"


def test_llama4s_layers_are_read_as_transformers_builds_them():
    """Scout as published: every fourth layer without RoPE and attending to all, the others in chunks; every
    layer routing; Maverick's shape (every other layer routing, no q/k norm) too."""
    for raw in (LLAMA4_SCOUT, dict(LLAMA4_SCOUT, text_config={**LLAMA4_SCOUT["text_config"], "use_qk_norm": False,
                                                             "interleave_moe_layer_step": 2, "num_local_experts": 128})):
        config, hf = ModelConfig.from_dict(raw), transformers.Llama4Config(**raw).text_config
        layers = range(hf.num_hidden_layers)
        assert [i not in config.nope_layers for i in layers] == [bool(f) for f in hf.no_rope_layers]
        assert [i in config.chunked_layers for i in layers] == [t == "chunked_attention" for t in hf.layer_types]
        assert list(config.moe_layers) == hf.moe_layers and config.attention_chunk == hf.attention_chunk_size
        assert config.qk_l2_norm == hf.use_qk_norm and config.nope_temperature == (hf.floor_scale, hf.attn_scale)
        assert (config.intermediate_size, config.moe_intermediate_size, config.shared_expert_intermediate_size) == (
            hf.intermediate_size_mlp, hf.intermediate_size, hf.intermediate_size)


def test_text_defaults_are_transformers_defaults():
    classes = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "gemma3_text": transformers.Gemma3TextConfig, "gemma4_text": transformers.Gemma4TextConfig}
    for model_type, defaults in TEXT_DEFAULTS.items():
        hf = classes[model_type]().to_dict()  # (Gemma 4's head_dim is per layer as an attribute)
        assert {k: hf[k] for k in defaults} == defaults, model_type


def test_weights_outside_the_language_model_are_skipped():
    t = torch.zeros(1)
    names = ["language_model.model.layers.0.mlp.up_proj.weight", "language_model.lm_head.weight",
             "model.language_model.norm.weight", "model.embed_tokens.weight", "lm_head.weight", "vision_tower.x",
             "model.visual.merger.norm.weight", "visual.blocks.0.attn.qkv.weight", "multi_modal_projector.linear_1.weight",
             "image_newline"]
    got = [n for n, _ in language_model_weights(((n, t) for n in names), ModelConfig.from_dict(QWEN25_VL_7B))]
    assert got == ["model.layers.0.mlp.up_proj.weight", "lm_head.weight", "model.norm.weight",
                   "model.embed_tokens.weight", "lm_head.weight"]


def test_unsupported_language_models_are_refused_by_type():
    raw = dict(MISTRAL_SMALL_31, text_config={**MISTRAL_SMALL_31["text_config"], "model_type": "mistral4"})
    with pytest.raises(ModelLoadError, match="of type 'mistral4'"):
        ModelConfig.from_dict(raw)
    with pytest.raises(ModelLoadError, match="text_config must be an object"):
        ModelConfig.from_dict(dict(GEMMA3_4B, text_config=[]))


def test_stacked_experts_load_as_published(tmp_path, tiny_model_dir):
    """Qwen3-VL-MoE's published checkpoints hold each layer's experts as ``x @ w`` operands ([experts, in,
    out]), transposed from what transformers >= 5 saves: both serve the same model."""
    model = _save("qwen3-vl-moe", tmp_path, tiny_model_dir)
    (shard,) = tmp_path.glob("*.safetensors")
    tensors = load_file(str(shard))
    stacked = [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(stacked) == 2 * COMMON["num_hidden_layers"]
    for name in stacked:
        tensors[name] = tensors[name].transpose(1, 2).contiguous()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    prompts = _prompts(lengths=(5, 30))
    assert_matches_transformers(model, prompts, _generate(tmp_path, prompts))
