"""The worker's LoRA pieces (services/engine/lora.py): which rows each adapter gets, the adapter cache."""

from __future__ import annotations

import torch

from services.common.step import LoraRef
from services.engine.lora import LoraCache, lora_batch
from services.engine.model_config import ModelConfig


def _cache(model_dir, max_idle: int = 8) -> LoraCache:
    return LoraCache(ModelConfig.from_dir(model_dir).lora_shape, torch.device("cpu"), torch.float32, max_idle)


def test_rows_are_grouped_per_adapter_and_runs_of_rows_skip_the_gather(tiny_model_dir, lora_dirs):
    cache = _cache(tiny_model_dir)
    a = cache.get(LoraRef("alpha", str(lora_dirs["alpha"])), set())
    b = cache.get(LoraRef("beta", str(lora_dirs["beta"])), set())
    assert lora_batch([(None, 3, 0), (None, 1, 0)], torch.device("cpu")) is None
    (only,) = lora_batch([(a, 3, 0), (a, 2, -4)], torch.device("cpu")).groups
    assert only == (a, slice(None))
    (first, second) = lora_batch([(a, 1, 0), (None, 2, 0), (b, 3, 0), (a, 2, 0)], torch.device("cpu")).groups
    assert first[0] is a and first[1].tolist() == [0, 6, 7]  # spread: gathered
    assert second == (b, slice(3, 6))  # one run: a view
    # An activated LoRA's tokens before its invocation are not its rows; a chunk wholly before it has none.
    (late,) = lora_batch([(a, 4, 2), (a, 3, 3), (b, 2, 0)], torch.device("cpu")).groups[:1]
    assert late == (a, slice(2, 4))


def test_a_batch_adds_what_peft_adds_to_each_projection(tiny_model_dir, lora_dirs):
    from safetensors.torch import load_file

    cache = _cache(tiny_model_dir)
    a = cache.get(LoraRef("alpha", str(lora_dirs["alpha"])), set())
    raw = load_file(str(lora_dirs["alpha"] / "adapter_model.safetensors"))
    shape = cache.shape
    x = torch.randn(5, shape.hidden_size)
    key = "base_model.model.model.layers.1.self_attn.{}_proj.lora_{}.weight"
    for spans, rows in (([(None, 2, 0), (a, 3, 0)], [2, 3, 4]), ([(a, 1, 0), (None, 2, 0), (a, 2, 0)], [0, 3, 4])):
        y = torch.zeros(5, shape.q_size + 2 * shape.kv_size)
        lora_batch(spans, torch.device("cpu")).add(y, x, 1, "qkv")  # a run of rows (a view), then spread rows
        want = torch.cat([x[rows] @ raw[key.format(p, "A")].T @ raw[key.format(p, "B")].T * 2.0 for p in "qkv"], 1)
        others = [i for i in range(5) if i not in rows]
        assert torch.allclose(y[rows], want, atol=1e-5) and not y[others].any()


def test_idle_adapters_beyond_the_limit_are_dropped_but_never_those_in_use(tiny_model_dir, lora_dirs, tmp_path):
    import shutil

    cache = _cache(tiny_model_dir, max_idle=1)
    refs = []
    for i in range(3):  # three copies under other paths: three adapters to the cache
        shutil.copytree(lora_dirs["beta"], tmp_path / f"b{i}")
        refs.append(LoraRef(f"b{i}", str(tmp_path / f"b{i}")))
    first = cache.get(refs[0], set())
    cache.get(refs[1], {id(first)})
    cache.get(refs[2], {id(first)})
    assert len(cache) == 3  # b0 in use, b1 the one idle adapter kept, b2 just asked for
    cache.get(refs[2], set())
    assert len(cache) == 2
    assert cache.get(refs[2], set()) is cache.get(refs[2], set())
