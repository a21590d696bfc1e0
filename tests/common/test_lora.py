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
from services.common.lora import CONFIG_FILE, WEIGHTS_FILE, ModelShape, check_name, read_lora
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
    ({"bias": "all"}, "bias 'all' not supported"),
    ({"modules_to_save": ["lm_head"]}, "modules saved whole"),
    ({"rank_pattern": {"q_proj": 4}}, "per-module ranks"),
    ({"peft_type": "PREFIX_TUNING"}, "not a LoRA adapter"),
    ({"r": 4}, "down_proj.lora_A.weight has shape (8, 384); this model needs (4, 384)"),
])
def test_what_the_engine_cannot_run_is_refused_saying_what(lora_dirs, shape, tmp_path, config, message):
    with pytest.raises(InvalidArgument, match=f"LoRA 'x'.*{re.escape(message)}"):
        read_lora(LoraRef("x", str(_copy(lora_dirs, tmp_path, **config))), shape, max_rank=16)


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
    h, qkv = shape.in_out("qkv_proj")
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
                                              "experts; adapters of the attention projections only"):
        read_lora(LoraRef("alpha", str(lora_dirs["alpha"])), moe, max_rank=16)
    out = _copy(lora_dirs, tmp_path)
    weights = load_file(str(out / WEIGHTS_FILE))
    save_file({k: v for k, v in weights.items() if ".self_attn." in k}, str(out / WEIGHTS_FILE))
    attention_only = read_lora(LoraRef("x", str(out)), moe, max_rank=16)
    assert {m for _, m in attention_only.tensors} == {"q_proj", "k_proj", "v_proj", "o_proj"}


@pytest.mark.parametrize("field, refused, kept", [
    ("latent_attention", "adapters of latent attention .* are not supported", ".mlp."),  # DeepSeek-V3
    ("gated_mlp", "adapters of an MLP without a gate .* are not supported", ".self_attn."),  # Arcee
])
def test_adapters_of_projections_the_model_lacks_are_refused(lora_dirs, shape, tmp_path, field, refused, kept):
    """Latent attention has no q/k/v/o of those shapes, a gateless MLP no gate/up/down pair; the other part's
    adapters fit."""
    odd = dataclasses.replace(shape, **{field: not getattr(shape, field)})
    with pytest.raises(InvalidArgument, match=refused):
        read_lora(LoraRef("alpha", str(lora_dirs["alpha"])), odd, max_rank=16)
    out = _copy(lora_dirs, tmp_path)
    weights = load_file(str(out / WEIGHTS_FILE))
    save_file({k: v for k, v in weights.items() if kept in k}, str(out / WEIGHTS_FILE))
    assert read_lora(LoraRef("x", str(out)), odd, max_rank=16).tensors


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
