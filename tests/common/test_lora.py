"""Reading and checking PEFT LoRA adapters without torch (services/common/lora.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from services.common.errors import InvalidArgument
from services.common.lora import CONFIG_FILE, WEIGHTS_FILE, check_name, read_lora
from services.common.lora_shape import ModelShape
from services.common.step import LoraRef
from services.engine.model_config import ModelConfig


@pytest.fixture
def shape(tiny_model_dir) -> ModelShape:
    return ModelConfig.from_dir(tiny_model_dir).lora_shape


def test_peft_adapters_read_with_their_rank_scaling_and_projections(lora_dirs, shape):
    alpha = read_lora(LoraRef("alpha", str(lora_dirs["alpha"])), shape, max_rank=16)
    assert (alpha.rank, alpha.scaling) == (8, 2.0)
    assert len(alpha.tensors) == 7 * shape.num_layers
    beta = read_lora(LoraRef("beta", str(lora_dirs["beta"])), shape, max_rank=16)
    assert beta.scaling == pytest.approx(8 / math.sqrt(4))  # rsLoRA
    assert {m for _, m in beta.tensors} == {"q_proj", "k_proj", "v_proj", "up_proj"}


def _copy(lora_dirs, tmp_path, **config):
    out = tmp_path / "adapter"
    shutil.copytree(lora_dirs["alpha"], out)
    cfg = json.loads((out / CONFIG_FILE).read_text())
    cfg.update(config)
    (out / CONFIG_FILE).write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("config, message", [
    ({"r": 32, "lora_alpha": 32}, "above --max-lora-rank 16"),
    ({"use_dora": True}, "DoRA adapters not supported"),
    ({"use_qalora": True, "kasa_config": {}}, "QALoRA adapters not supported"),
    ({"bias": "all"}, "bias 'all' not supported"),
    ({"modules_to_save": "score"}, "modules_to_save must be a list of module names, got 'score'"),
    ({"rank_pattern": {"q_proj": 4}}, "q_proj.lora_A.weight has shape (8, 128); this model needs (4, 128)"),
    ({"rank_pattern": {"q_proj": 32}}, "rank 32 is above --max-lora-rank 16"),
    ({"alpha_pattern": {"q_(proj": 4}}, "alpha_pattern key 'q_(proj' is not a regular expression"),
    ({"alpha_pattern": {"q_proj": "4"}}, "alpha_pattern must map module patterns to positive numbers"),
    ({"target_parameters": ["lm_head.weight"]}, "adapters of parameter 'lm_head.weight' (of parameters, only"),
    ({"peft_type": "PREFIX_TUNING"}, "not a LoRA adapter"),
    ({"r": 4}, "down_proj.lora_A.weight has shape (8, 384); this model needs (4, 384)"),
])
def test_what_the_engine_cannot_run_is_refused_saying_what(lora_dirs, shape, tmp_path, config, message):
    with pytest.raises(InvalidArgument, match=f"LoRA 'x'.*{re.escape(message)}"):
        read_lora(LoraRef("x", str(_copy(lora_dirs, tmp_path, **config))), shape, max_rank=16)


def _saving_whole(lora_dirs, tmp_path, saved: dict[str, tuple[int, int]], **config) -> LoraRef:
    """The alpha adapter with tensors of modules saved whole (``saved``: name -> shape) and ``config``."""
    out = _copy(lora_dirs, tmp_path, **config)
    tensors = load_file(out / WEIGHTS_FILE)
    tensors.update({f"base_model.model.{name}": np.ones(dims, np.float32) for name, dims in saved.items()})
    save_file(tensors, str(out / WEIGHTS_FILE))
    return LoraRef("x", str(out))


def test_an_adapter_of_a_classifier_brings_its_head_saved_whole(lora_dirs, shape, tmp_path):
    # PEFT's task_type SEQ_CLS lists both names transformers gives a classifier head and saves the one there is.
    classifier = dataclasses.replace(shape, num_labels=3)
    ref = _saving_whole(lora_dirs, tmp_path, {"score.weight": (3, shape.hidden_size)},
                        modules_to_save=["classifier", "score"])
    spec = read_lora(ref, classifier, max_rank=16)
    assert spec.head == "base_model.model.score.weight" and len(spec.tensors) == 7 * shape.num_layers
    # Listed but not saved (nothing was trained whole): a plain adapter, for a model with no head too.
    plain = read_lora(LoraRef("x", str(_copy(lora_dirs, tmp_path / "plain", modules_to_save=["lm_head"]))), shape,
                      max_rank=16)
    assert plain.head is None


@pytest.mark.parametrize("saved, config, classes, message", [
    ({"lm_head.weight": (4096, 128)}, {}, 0,
     "supported for a sequence classifier's head (score.weight) only; found base_model.model.lm_head.weight"),
    ({"score.weight": (3, 128), "score.bias": (3,)}, {}, 3, "found base_model.model.score.bias"),
    ({"score.weight": (3, 128)}, {}, 0, "the model is no sequence classifier"),
    ({"score.weight": (2, 128)}, {}, 3, "has shape (2, 128); this classifier's head is (3, 128) (3 labels)"),
    ({"score.weight": (3, 128)}, {"alora_invocation_tokens": [5, 6]}, 3, "an activated LoRA"),
])
def test_modules_saved_whole_that_the_engine_cannot_serve_are_refused(lora_dirs, shape, tmp_path, saved, config,
                                                                     classes, message):
    names = sorted({name.split(".")[0] for name in saved})
    ref = _saving_whole(lora_dirs, tmp_path, saved, modules_to_save=names, **config)
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        read_lora(ref, dataclasses.replace(shape, num_labels=classes), max_rank=16)


def test_missing_damaged_or_foreign_files_are_refused(lora_dirs, shape, tmp_path):
    with pytest.raises(InvalidArgument, match="cannot read adapter_config.json"):
        read_lora(LoraRef("x", str(tmp_path / "nowhere")), shape, max_rank=16)
    out = _copy(lora_dirs, tmp_path)
    (out / WEIGHTS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(InvalidArgument, match="not a readable safetensors file"):
        read_lora(LoraRef("x", str(out)), shape, max_rank=16)
    save_file({"base_model.model.lm_head.lora_A.weight": np.zeros((8, 128), np.float32)}, str(out / WEIGHTS_FILE))
    with pytest.raises(InvalidArgument, match="not a LoRA A/B weight of a decoder layer's projection"):
        read_lora(LoraRef("x", str(out)), shape, max_rank=16)
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((8, 128), np.float32)},
              str(out / WEIGHTS_FILE))
    with pytest.raises(InvalidArgument, match="layer 0 q_proj has only one of lora_A and lora_B"):
        read_lora(LoraRef("x", str(out)), shape, max_rank=16)
    save_file({"base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight": np.zeros((8, 128), np.float32)},
              str(out / WEIGHTS_FILE))
    with pytest.raises(InvalidArgument, match="adapts layer 9; the model has 4"):
        read_lora(LoraRef("x", str(out)), shape, max_rank=16)
    h, qkv = shape.in_out("qkv_proj", 0)
    layer0 = "base_model.model.model.layers.0.self_attn"
    save_file({f"{layer0}.qkv_proj.lora_A.weight": np.zeros((8, h), np.float32),
               f"{layer0}.qkv_proj.lora_B.weight": np.zeros((qkv, 8), np.float32),
               f"{layer0}.k_proj.lora_A.weight": np.zeros((8, h), np.float32),
               f"{layer0}.k_proj.lora_B.weight": np.zeros((shape.kv_size, 8), np.float32)}, str(out / WEIGHTS_FILE))
    with pytest.raises(InvalidArgument, match="adapts layer 0: qkv_proj and k_proj, the same projection twice"):
        read_lora(LoraRef("x", str(out)), shape, max_rank=16)


def test_second_model_refuses_an_adapter_of_the_first(lora_dirs, second_model_dir):
    with pytest.raises(InvalidArgument, match="another base model"):
        read_lora(LoraRef("alpha", str(lora_dirs["alpha"])), ModelConfig.from_dir(second_model_dir).lora_shape,
                  max_rank=16)


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 129, "é"])
def test_names_clients_cannot_send_plainly_are_refused(name):
    with pytest.raises(InvalidArgument, match="LoRA name"):
        check_name(name)
    assert check_name("sql-lora/v2.1") == "sql-lora/v2.1"


def test_adapters_of_a_mixture_of_experts_mlp_are_refused(lora_dirs, shape, tmp_path):
    """An MoE layer has no dense gate/up/down to adapt; adapters of its attention projections still fit."""
    moe = dataclasses.replace(shape, moe_layers=(1,))
    with pytest.raises(InvalidArgument, match="adapts (gate|up|down)_proj of layer 1, whose MLP is a mixture of "
                                              "experts; adapters of the attention projections, of the "
                                              "experts"):
        read_lora(LoraRef("alpha", str(lora_dirs["alpha"])), moe, max_rank=16)
    out = _copy(lora_dirs, tmp_path)
    weights = load_file(str(out / WEIGHTS_FILE))
    save_file({k: v for k, v in weights.items() if ".self_attn." in k}, str(out / WEIGHTS_FILE))
    attention_only = read_lora(LoraRef("x", str(out)), moe, max_rank=16)
    assert {m for _, m in attention_only.tensors} == {"q_proj", "k_proj", "v_proj", "o_proj"}


@pytest.mark.parametrize("field, refused, kept", [
    ("latent_attention", "adapts k_proj; latent attention .* has q_a_proj", (".mlp.",)),  # DeepSeek-V3
    ("gated_mlp", "adapts gate_proj; this model's MLP has no gate", (".self_attn.", ".up_proj.", ".down_proj.")),
])
def test_adapters_of_projections_the_model_lacks_are_refused(lora_dirs, shape, tmp_path, field, refused, kept):
    """Latent attention has no q/k/v/o of those shapes, a gateless MLP (GPT-2's, Arcee's) no gate; the other
    projections' adapters fit."""
    odd = dataclasses.replace(shape, **{field: not getattr(shape, field)})
    with pytest.raises(InvalidArgument, match=refused):
        read_lora(LoraRef("alpha", str(lora_dirs["alpha"])), odd, max_rank=16)
    out = _copy(lora_dirs, tmp_path)
    weights = load_file(str(out / WEIGHTS_FILE))
    save_file({k: v for k, v in weights.items() if any(part in k for part in kept)}, str(out / WEIGHTS_FILE))
    assert read_lora(LoraRef("x", str(out)), odd, max_rank=16).tensors


def _adapter(out, modules: dict[str, tuple[int, int]], layers: int, **config):
    """A PEFT-format adapter of rank 4 adapting ``modules`` (each checkpoint module's path under a layer, with
    its (in, out)) in each of ``layers`` layers."""
    tensors = {}
    for layer in range(layers):
        for path, (fan_in, fan_out) in modules.items():
            key = "base_model.model." + path.format(layer=layer)
            tensors[f"{key}.lora_A.weight"] = np.ones((4, fan_in), np.float32)
            tensors[f"{key}.lora_B.weight"] = np.ones((fan_out, 4), np.float32)
    out.mkdir()
    save_file(tensors, str(out / WEIGHTS_FILE))
    (out / CONFIG_FILE).write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8, **config}))
    return LoraRef("x", str(out))


def test_adapters_name_the_modules_of_the_checkpoint_they_were_trained_on(tmp_path):
    """GPT-2's c_attn, c_proj and c_fc (Conv1D layers: PEFT saves fan_in_fan_out, which only says how to merge
    them) and BLOOM's query_key_value, read as the projections the model holds them as."""
    gpt2 = ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4, "n_layer": 2,
                                  "vocab_size": 100}).lora_shape
    conv1d = {"transformer.h.{layer}.attn.c_attn": (64, 192), "transformer.h.{layer}.attn.c_proj": (64, 64),
              "transformer.h.{layer}.mlp.c_fc": (64, 256), "transformer.h.{layer}.mlp.c_proj": (256, 64)}
    spec = read_lora(_adapter(tmp_path / "gpt2", conv1d, 2, fan_in_fan_out=True), gpt2, max_rank=8)
    assert sorted(spec.tensors) == [(layer, m) for layer in (0, 1) for m in ("down_proj", "o_proj", "qkv_proj",
                                                                              "up_proj")]
    assert spec.tensors[1, "qkv_proj"][1] == "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight"
    bloom = ModelConfig.from_dict({"architectures": ["BloomForCausalLM"], "hidden_size": 64, "n_head": 4,
                                   "n_layer": 2, "vocab_size": 100}).lora_shape
    fused = {"transformer.h.{layer}.self_attention.query_key_value": (64, 192)}
    assert sorted(read_lora(_adapter(tmp_path / "bloom", fused, 2), bloom, max_rank=8).tensors) == [
        (0, "query_key_value"), (1, "query_key_value")]
    with pytest.raises(InvalidArgument, match=r"c_fc.lora_B.weight has shape \(256, 4\); this model needs "
                                              r"\(128, 4\)"):
        read_lora(_adapter(tmp_path / "wider", conv1d, 1), dataclasses.replace(gpt2, intermediate_size=128), 8)
    with pytest.raises(InvalidArgument, match="'base_model.model.transformer.h.0.attn.c_attn.lora_A.weight' is not "
                                              "a LoRA A/B weight of a decoder layer's projection"):
        read_lora(_adapter(tmp_path / "llama", {"transformer.h.{layer}.attn.c_attn": (64, 192)}, 1), bloom, 8)


def test_a_projection_adapted_under_the_other_sublayer_is_refused(lora_dirs, shape, tmp_path):
    """AFMoE's attention has a gate_proj of its own (its output gate): an adapter of it is not taken for the
    MLP's gate_proj."""
    out = _copy(lora_dirs, tmp_path)
    weights = load_file(str(out / WEIGHTS_FILE))
    moved = {k.replace(".mlp.gate_proj.", ".self_attn.gate_proj."): v for k, v in weights.items()}
    assert moved.keys() != weights.keys()
    save_file(moved, str(out / WEIGHTS_FILE))
    with pytest.raises(InvalidArgument, match=r"adapts self_attn\.gate_proj; supported: the attention's q_proj"):
        read_lora(LoraRef("x", str(out)), shape, max_rank=16)


def _experts_adapter(tmp_path, shape: ModelShape, tensors: dict, **config) -> LoraRef:
    """An adapter of stacked experts as PEFT saves one (``target_parameters``), from numpy arrays."""
    out = tmp_path / "experts"
    out.mkdir(exist_ok=True)
    cfg = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": [],
           "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], **config}
    (out / CONFIG_FILE).write_text(json.dumps(cfg))
    save_file({f"base_model.model.model.layers.{k}.weight": v for k, v in tensors.items()}, str(out / WEIGHTS_FILE))
    return LoraRef("x", str(out))


def _moe(shape: ModelShape) -> ModelShape:
    return dataclasses.replace(shape, moe_layers=(1,), num_experts=4, expert_input=shape.hidden_size,
                               expert_intermediate=16)


def test_experts_adapters_read_by_how_deep_peft_wrapped_each_parameter(shape, tmp_path):
    """PEFT wraps gate_up_proj first (the module registers it first), so the innermost wrapper's (most
    ``base_layer``s) A and B adapt it; ``rank_pattern`` and ``alpha_pattern`` match the parameter's name."""
    moe, h = _moe(shape), shape.hidden_size
    arrays = {"1.mlp.experts.base_layer.lora_A": np.zeros((8, h), np.float32),
              "1.mlp.experts.base_layer.lora_B": np.zeros((32, 8), np.float32),
              "1.mlp.experts.lora_A": np.zeros((16, 16), np.float32),
              "1.mlp.experts.lora_B": np.zeros((h, 16), np.float32),
              "0.self_attn.q_proj.lora_A": np.zeros((2, h), np.float32),
              "0.self_attn.q_proj.lora_B": np.zeros((shape.q_size, 2), np.float32)}
    spec = read_lora(_experts_adapter(tmp_path, moe, arrays, target_modules=["q_proj"],
                                      rank_pattern={"experts.down_proj": 4}, alpha_pattern={"gate_up_proj": 8}),
                     moe, max_rank=16)
    layers = "base_model.model.model.layers"
    assert spec.tensors == {
        (0, "q_proj"): (f"{layers}.0.self_attn.q_proj.lora_A.weight", f"{layers}.0.self_attn.q_proj.lora_B.weight"),
        (1, "experts.down_proj"): (f"{layers}.1.mlp.experts.lora_A.weight", f"{layers}.1.mlp.experts.lora_B.weight"),
        (1, "experts.gate_up_proj"): (f"{layers}.1.mlp.experts.base_layer.lora_A.weight",
                                      f"{layers}.1.mlp.experts.base_layer.lora_B.weight")}
    assert spec.scaling == 2.0 and spec.scalings == {(1, "experts.down_proj"): 1.0, (1, "experts.gate_up_proj"): 4.0}
    # One parameter adapted: no base_layer; Llama 4's swapped A and B.
    down = {"1.mlp.experts.lora_A": np.zeros((8, 16), np.float32), "1.mlp.experts.lora_B": np.zeros((h, 8), np.float32)}
    only_down = read_lora(_experts_adapter(tmp_path, moe, down, target_parameters=["down_proj"]), moe, max_rank=16)
    assert set(only_down.tensors) == {(1, "experts.down_proj")}
    swapped = {"1.mlp.experts.lora_A": np.zeros((8, h), np.float32), "1.mlp.experts.lora_B": np.zeros((16, 8), np.float32)}
    assert read_lora(_experts_adapter(tmp_path, moe, swapped, target_parameters=["down_proj"]),
                     dataclasses.replace(moe, experts_swapped=True), max_rank=16).tensors


def test_experts_adapters_that_do_not_fit_are_refused_saying_what(shape, tmp_path):
    moe, h = _moe(shape), shape.hidden_size
    down = {"1.mlp.experts.lora_A": np.zeros((8, 16), np.float32), "1.mlp.experts.lora_B": np.zeros((h, 8), np.float32)}

    def refused(arrays, message, model=moe, **config):
        with pytest.raises(InvalidArgument, match=f"LoRA 'x'.*{re.escape(message)}"):
            read_lora(_experts_adapter(tmp_path, model, arrays, **config), model, max_rank=16)

    refused(down, "1 parameters of model.layers.1.mlp.experts adapted, but its config's target_parameters name 2 of "
            "them (gate_up_proj, down_proj)")
    refused(down, "adapts model.layers.1.mlp.experts.down_proj; layer 1 has no experts",
            dataclasses.replace(moe, moe_layers=(0,)), target_parameters=["down_proj"])
    refused(down, "lora_A.weight has shape (8, 16); this model's 2 experts need (4, 16) (an adapter for another",
            dataclasses.replace(moe, num_experts=2), target_parameters=["down_proj"])
    refused(down, "adapters of parameter 'mlp.gate.weight' (of parameters, only an MoE's stacked experts' "
            "gate_up_proj, up_proj, down_proj)", target_parameters=["mlp.gate.weight"])
    refused({"1.mlp.experts.lora_A": down["1.mlp.experts.lora_A"]}, "down_proj has only one of lora_A and lora_B",
            target_parameters=["down_proj"])


def test_shared_expert_adapters_read_at_its_width_and_only_where_there_is_one(shape, tmp_path):
    moe, h = dataclasses.replace(_moe(shape), shared_intermediate=24), shape.hidden_size

    def shared(layer: int, module: str, width: int) -> dict:
        fan_in, fan_out = (width, h) if module == "down_proj" else (h, width)
        return {f"{layer}.mlp.shared_expert.{module}.lora_A": np.zeros((2, fan_in), np.float32),
                f"{layer}.mlp.shared_expert.{module}.lora_B": np.zeros((fan_out, 2), np.float32)}

    spec = read_lora(_experts_adapter(tmp_path, moe, {**shared(1, "gate_proj", 24), **shared(1, "down_proj", 24)},
                                      target_parameters=[]), moe, max_rank=16)
    assert set(spec.tensors) == {(1, "shared_expert.gate_proj"), (1, "shared_expert.down_proj")}
    for arrays, message in [
        (shared(0, "up_proj", 24), "adapts the shared expert's up_proj of layer 0, which has none"),
        (shared(1, "up_proj", shape.intermediate_size), f"has shape ({shape.intermediate_size}, 2); this model needs "
                                                        "(24, 2)"),
        ({**shared(1, "gate_up_proj", 48), **shared(1, "up_proj", 24)},
         "adapts layer 1: shared_expert.gate_up_proj and shared_expert.up_proj, the same projection twice"),
    ]:
        with pytest.raises(InvalidArgument, match=re.escape(message)):
            read_lora(_experts_adapter(tmp_path, moe, arrays, target_parameters=[]), moe, max_rank=16)


def test_projections_held_as_checkpoints_hold_them_read_in_their_layers_only(shape, tmp_path):
    """A linear-attention mixer's projections (and latent attention's, an output gate's) are adapted as the model
    holds them, in the layers that have them; with the output gate's rows in q_proj (Qwen3.5), its B is twice
    the queries' height."""
    h, q = shape.hidden_size, shape.q_size
    mixers = dataclasses.replace(shape, projections=(("linear_attn.in_proj_z", h, 32, (0, 2)),), query_gates=True)

    def arrays(layer: int, module: str, fan_in: int, fan_out: int) -> dict:
        return {f"{layer}.{module}.lora_A": np.zeros((2, fan_in), np.float32),
                f"{layer}.{module}.lora_B": np.zeros((fan_out, 2), np.float32)}

    spec = read_lora(_experts_adapter(tmp_path, mixers, {**arrays(2, "linear_attn.in_proj_z", h, 32),
                                                         **arrays(1, "self_attn.q_proj", h, 2 * q)},
                                      target_parameters=[]), mixers, max_rank=16)
    assert set(spec.tensors) == {(2, "linear_attn.in_proj_z"), (1, "q_proj")}
    assert read_lora(_experts_adapter(tmp_path, mixers, arrays(1, "self_attn.q_gate_proj", h, 2 * q),
                                      target_parameters=[]), mixers, max_rank=16).tensors
    for model, tensors, message in [
        (mixers, arrays(1, "linear_attn.in_proj_z", h, 32), "adapts linear_attn.in_proj_z of layer 1; that "
         "projection is adapted in layers 0, 2 only"),
        (mixers, arrays(0, "linear_attn.in_proj_z", h, 16), "has shape (16, 2); this model needs (32, 2)"),
        (shape, arrays(0, "linear_attn.in_proj_z", h, 32), "is not a LoRA A/B weight of a decoder layer's"),
        (shape, arrays(1, "self_attn.q_gate_proj", h, 2 * q), "adapts 'q_gate_proj'; supported:"),
    ]:
        with pytest.raises(InvalidArgument, match=re.escape(message)):
            read_lora(_experts_adapter(tmp_path, model, tensors, target_parameters=[]), model, max_rank=16)
