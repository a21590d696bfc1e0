"""Loading a checkpoint's weights into the fused model (services/engine/loader.py, model.load_weights): parts
of fused projections land in their rows, and what does not fit is named."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.common.errors import ModelLoadError
from services.engine.checkpoint import load_checkpoint_meta
from services.engine.loader import load_model


def _edited(tiny_model_dir, tmp_path, edit):
    out = tmp_path / "model"
    shutil.copytree(tiny_model_dir, out)
    (shard,) = out.glob("*.safetensors")
    tensors = load_file(str(shard))
    edit(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return load_model(load_checkpoint_meta(out), torch.device("cpu"), torch.float32)


def test_fused_projections_hold_each_part_in_its_rows(tiny_model_dir, tmp_path):
    model = _edited(tiny_model_dir, tmp_path, lambda t: None)
    raw = load_file(str(next(tiny_model_dir.glob("*.safetensors"))))
    layer = model.model.layers[2]
    want_qkv = torch.cat([raw[f"model.layers.2.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(layer.self_attn.qkv_proj.weight, want_qkv)
    want_gate_up = torch.cat([raw[f"model.layers.2.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(layer.mlp.gate_up_proj.weight, want_gate_up)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"),
     r"layers.1.self_attn.qkv_proj.weight: missing \['k'\] projection weights"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(3, 3)}),
     r"'model.layers.0.mlp.up_proj.weight' has shape \(3, 3\), the config implies \(384, 128\)"),
    (lambda t: t.update({"model.layers.0.mlp.experts.0.gate_proj.weight": torch.zeros(3, 3)}),
     "no mixture of experts there"),
    (lambda t: t.pop("model.norm.weight"), "checkpoint lacks weights: model.norm.weight"),
])
def test_what_does_not_fit_is_named(tiny_model_dir, tmp_path, edit, message):
    with pytest.raises(ModelLoadError, match=message):
        _edited(tiny_model_dir, tmp_path, edit)


def test_a_tied_head_stored_anyway_is_kept_once(tiny_model_dir, tmp_path):
    def store_head(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    model = _edited(tiny_model_dir, tmp_path, store_head)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_stored_head_that_differs_wins_over_the_tie(tiny_model_dir, tmp_path):
    """As transformers loads it: a config that ties (the built-in model's) but a head of its own stored."""
    head = {}

    def store_head(t):
        head["w"] = t["lm_head.weight"] = torch.randn_like(t["model.embed_tokens.weight"])
    model = _edited(tiny_model_dir, tmp_path, store_head)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, head["w"])
    raw = load_file(str(next(tiny_model_dir.glob("*.safetensors"))))
    assert torch.equal(model.model.embed_tokens.weight, raw["model.embed_tokens.weight"])
