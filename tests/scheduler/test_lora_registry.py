"""The adapters the mesh serves (services/scheduler/lora_registry.py): added once checked, resolved by name."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument, NotFound
from services.common.step import LoraRef
from services.engine.model_config import ModelConfig
from services.scheduler.lora_registry import LoraRegistry


@pytest.fixture
def registry(tiny_model_dir) -> LoraRegistry:
    return LoraRegistry(ModelConfig.from_dir(tiny_model_dir).lora_shape, 16, ("tiny", str(tiny_model_dir)))


def test_names_resolve_to_adapters_and_the_base_model_to_none(registry, lora_dirs, tiny_model_dir):
    registry.add("alpha", str(lora_dirs["alpha"]))
    assert registry.resolve("alpha") == LoraRef("alpha", str(lora_dirs["alpha"]))
    assert registry.resolve(None) is registry.resolve("") is registry.resolve("tiny") is None
    assert registry.resolve(str(tiny_model_dir)) is None
    with pytest.raises(NotFound, match="'beta' does not exist here; this server serves 'tiny', 'alpha'"):
        registry.resolve("beta")


def test_a_name_is_taken_once_and_never_the_base_models(registry, lora_dirs):
    registry.add("alpha", str(lora_dirs["alpha"]))
    with pytest.raises(InvalidArgument, match="already loaded"):
        registry.add("alpha", str(lora_dirs["beta"]))
    with pytest.raises(InvalidArgument, match="the base model's name"):
        registry.add("tiny", str(lora_dirs["beta"]))
    with pytest.raises(InvalidArgument, match="cannot read"):
        registry.add("gamma", "/nowhere")
    assert [s.ref.name for s in registry] == ["alpha"]
    registry.remove("alpha")
    assert len(registry) == 0
    with pytest.raises(NotFound):
        registry.remove("alpha")
    with pytest.raises(NotFound):
        registry.resolve("alpha")


def test_the_scheduler_takes_adapters_from_flags_or_the_environment(monkeypatch, tmp_path):
    from services.scheduler.main import parse_args

    assert parse_args(["--lora-modules", "a=x", f"b={tmp_path}"]).lora_modules == (
        ("a", str(tmp_path.cwd() / "x")), ("b", str(tmp_path)))
    monkeypatch.setenv("SEAWALL_LORA_MODULES", "sql=/models/sql  chat=/models/chat")
    config = parse_args([])
    assert config.lora_modules == (("sql", "/models/sql"), ("chat", "/models/chat"))
    assert config.max_lora_rank == 16 and not config.allow_runtime_lora_updating
    monkeypatch.setenv("SEAWALL_LORA_MODULES", "no-path")
    with pytest.raises(InvalidArgument, match="SEAWALL_LORA_MODULES: 'no-path': give an adapter as NAME=PATH"):
        parse_args([])


def test_a_model_field_that_is_no_string_is_refused(registry):
    with pytest.raises(InvalidArgument, match="model must be a string, got 5"):
        registry.resolve(5)
