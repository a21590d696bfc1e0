"""Vision-language checkpoints served as their language model: Gemma 3 from 4B up, Gemma 4 (and its audio), Mistral Small 3.x (Mistral3),
LLaVA and LLaVA-NeXT, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5 (dense and MoE), GLM-4.1V, GLM-4.5V, GLM-4.6V, Llama 4, Aya Vision,
Command A Vision, Cohere's Compass (North-Micro-Vision), Aria, Emu3 and Apertus 1.5 (whose image and audio tokenizers are skipped alike).
Text in, text out; the vision tower is not loaded (the chat API refuses image parts, naming them).

Why this is exact: with no image in the prompt, each of these models runs its language model alone on the
prompt's token embeddings, causally. Qwen's multimodal RoPE gives a text token the same position in each of
its three sections (time, height, width), which is one-dimensional RoPE whatever the sections' split or
interleaving.

The config is ``text_config`` (or the top level, in Qwen2-VL's older flat configs) read as the text
architecture's, with that architecture's transformers defaults for the shape fields a published config
leaves out (gemma-3-4b-it names neither its vocabulary nor its heads). The weights live under
``language_model.model.`` (as transformers saves most of these), ``model.language_model.`` (Qwen3-VL),
``text_model.model.`` (Emu3) or ``model.`` (Qwen2.5-VL); ``language_model.lm_head.``, ``text_model.lm_head.`` or
``lm_head.`` hold the output head. Everything else
(``vision_tower.``, ``visual.``, ``multi_modal_projector.``, ``image_newline``) is the vision side, skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from services.common.errors import ModelLoadError

if TYPE_CHECKING:  # the scheduler reads configs without torch
    import torch

    from services.engine.model_config import ModelConfig

# Checkpoint architecture → its language model's (None: named by text_config's model_type).
VISION_LANGUAGE = {
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "Gemma4ForConditionalGeneration": "Gemma4ForCausalLM",
    "Mistral3ForConditionalGeneration": None,
    "LlavaForConditionalGeneration": None,
    "LlavaNextForConditionalGeneration": None,
    "Qwen2VLForConditionalGeneration": "Qwen2ForCausalLM",
    "Qwen2_5_VLForConditionalGeneration": "Qwen2ForCausalLM",
    "Qwen3VLForConditionalGeneration": "Qwen3ForCausalLM",
    "Qwen3VLMoeForConditionalGeneration": "Qwen3MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM",
    "Llama4ForConditionalGeneration": "Llama4ForCausalLM",
    "Glm4vForConditionalGeneration": "Glm4ForCausalLM",
    "Glm4vMoeForConditionalGeneration": "Glm4MoeForCausalLM",
    "Glm46VForConditionalGeneration": None,
    "AyaVisionForConditionalGeneration": None,
    "Cohere2VisionForConditionalGeneration": None,
    "AriaForConditionalGeneration": "AriaTextForCausalLM",
    "CohereCompassForConditionalGeneration": "CohereCompassForCausalLM",
    # Emu3: images are tokens of its vocabulary (its VQ-VAE, which makes them, is skipped).
    "Emu3ForConditionalGeneration": "Emu3ForCausalLM",
    # Apertus 1.5: images and audio come in as tokens of the vocabulary (their tokenizers are not loaded).
    "Apertus1p5ForConditionalGeneration": "Apertus1p5TextForCausalLM",
}
_TEXT_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                     "gemma3_text": "Gemma3ForCausalLM", "cohere": "CohereForCausalLM", "cohere2": "Cohere2ForCausalLM",
                     "glm4v_text": "Glm4ForCausalLM", "glm4v_moe_text": "Glm4MoeForCausalLM",
                     "ministral3": "Ministral3ForCausalLM"}
# Whose language models rotate by multimodal RoPE sections.
_MROPE = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
          "Qwen3VLMoeForConditionalGeneration", "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration",
          "Glm46VForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
# Whose configs tie the output head to the embeddings unless they say otherwise (transformers' defaults; the
# others tie when their text_config says so, as transformers reads configs saved before v5).
_TIED_BY_DEFAULT = ("Gemma3ForConditionalGeneration", "Gemma4ForConditionalGeneration", "Mistral3ForConditionalGeneration",
                    "AyaVisionForConditionalGeneration", "Cohere2VisionForConditionalGeneration")
# transformers' defaults for the shape fields of each text model type (tests/engine/test_vision_language.py
# checks them against its config classes).
_SHAPE = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(zip(_SHAPE, (32000, 4096, 11008, 32, 32, 32, 2048, 1e-6), strict=True)),
    "mistral": dict(zip(_SHAPE, (32000, 4096, 14336, 32, 32, 8, 131072, 1e-6), strict=True)),
    "gemma3_text": dict(zip(_SHAPE, (262208, 2304, 9216, 26, 8, 4, 131072, 1e-6), strict=True), head_dim=256),
    "gemma4_text": dict(zip(_SHAPE, (262144, 2304, 9216, 30, 8, 4, 131072, 1e-6), strict=True), head_dim=256),
}
# Fields of the checkpoint's own config its language model takes when text_config lacks them.
_INHERITED = ("torch_dtype", "dtype", "quantization_config", "bos_token_id", "eos_token_id")
_TEXT_PREFIXES = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                  ("model.language_model.", "model."), ("text_model.model.", "model."),  # Emu3's
                  ("text_model.lm_head.", "lm_head."))
_TEXT_NAMES = ("model.embed_tokens.", "model.layers.", "model.norm.", "lm_head.")


def text_model_config(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` itself for a text model; for a vision-language checkpoint, its language model's config, with
    ``architectures`` naming the text architecture and ``vision_language`` the checkpoint's."""
    archs = raw.get("architectures") or []
    outer = archs[0] if archs else None
    if outer not in VISION_LANGUAGE:
        return raw
    nested = raw.get("text_config")
    if nested is not None and not isinstance(nested, dict):
        raise ModelLoadError(f"config.json: text_config must be an object, got {nested!r}")
    text = dict(nested) if nested is not None else {k: v for k, v in raw.items() if k != "vision_config"}
    model_type = str(text.get("model_type") or ("llama" if outer.startswith("Llava") else ""))
    arch = VISION_LANGUAGE[outer] or _TEXT_MODEL_TYPES.get(model_type)
    if arch is None:
        raise ModelLoadError(f"config.json: {outer}'s language model is of type {model_type!r}; its language model "
                             f"is served for types {', '.join(t for t in _TEXT_MODEL_TYPES if t != 'gemma3_text')}")
    text = {**TEXT_DEFAULTS.get(model_type, {}), **text}
    for key in _INHERITED:
        if text.get(key) is None and raw.get(key) is not None:
            text[key] = raw[key]
    text["tie_word_embeddings"] = bool(raw.get("tie_word_embeddings", outer in _TIED_BY_DEFAULT)
                                       or (nested or {}).get("tie_word_embeddings"))
    if model_type == "glm4v_text" or outer == "Glm4vForConditionalGeneration":
        # GLM-4.1V's text model: GLM-4's, but heads hidden_size / heads wide and all of each head rotated unless
        # its config says otherwise (the text architecture's defaults are 128 and a half).
        params = text.get("rope_parameters") or text.get("rope_scaling") or {}
        text["head_dim"] = text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"])
        text["partial_rotary_factor"] = text.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0
    if outer in _MROPE:
        _one_dimensional_rope(text)
    if outer == "Cohere2VisionForConditionalGeneration":
        text["logit_scale"] = 1.0  # transformers' head of it leaves its language model's logit_scale out
    if outer == "Qwen3VLMoeForConditionalGeneration":
        text["norm_topk_prob"] = True  # its router always renormalizes (its config has no such field)
    return {**text, "architectures": [arch], "vision_language": outer}


def _one_dimensional_rope(text: dict[str, Any]) -> None:
    """Drops Qwen's (and GLM-4.xV's) multimodal RoPE sections: equal positions in every section make them plain RoPE (older
    configs name it as a rope type, "mrope", which transformers reads as the default)."""
    for key in ("rope_scaling", "rope_parameters"):
        params = text.get(key)
        if isinstance(params, dict):
            params = {k: v for k, v in params.items() if k not in ("mrope_section", "mrope_interleaved")}
            if params.get("rope_type", params.get("type")) == "mrope":
                params = {k: v for k, v in params.items() if k not in ("type", "rope_type")}
            text[key] = params or None


def language_model_weights(weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig,
                           ) -> Iterator[tuple[str, torch.Tensor]]:
    """The language model's tensors of a vision-language checkpoint under a text model's names; the vision
    tower's and the projector's are skipped. Stacked experts (Qwen3-VL-MoE) are published as ``x @ w``
    operands, ``[experts, in, out]``; transformers >= 5 saves them as linear weights, ``[experts, out, in]``:
    either loads, told apart by shape as transformers tells them apart (a square one is taken as saved)."""
    stacked = {"experts.gate_up_proj": (config.num_experts, 2 * config.moe_intermediate_size, config.hidden_size),
               "experts.down_proj": (config.num_experts, config.hidden_size, config.moe_intermediate_size),
               } if config.vision_language == "Qwen3VLMoeForConditionalGeneration" else {}  # Llama 4's: llama4.py
    for name, tensor in weights:
        linear = next((shape for suffix, shape in stacked.items() if name.endswith(suffix)), None)
        if linear is not None and tuple(tensor.shape) != linear:
            tensor = tensor.transpose(1, 2)
        for old, new in _TEXT_PREFIXES:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        else:
            if not name.startswith(_TEXT_NAMES):
                continue
        yield name, tensor
