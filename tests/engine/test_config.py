"""``EngineConfig``: every bad value is refused with a message that names its field."""

import argparse

import pytest

from services.common.errors import InvalidArgument
from services.engine.config import EngineConfig
from services.engine.model_config import add_max_model_len_flag


@pytest.mark.parametrize(("field", "value", "message"), [
    ("block_size", 12, "block_size must be a power of two"),
    ("kv_cache_bytes", 0, "kv_cache_bytes must be > 0"),
    ("swap_bytes", -1, "swap_bytes must be >= 0"),
    ("cpu_kernels", "no", "cpu_kernels must be true or false"),
    ("kv_sharing_fast_prefill", 1, "kv_sharing_fast_prefill must be true or false"),
    ("dtype", "float8", "dtype must be auto or one of"),
    ("kv_cache_dtype", "int8", "kv_cache_dtype must be one of auto, fp8, fp8_e4m3, fp8_e5m2"),
    ("device", "tpu", "device must be auto, cpu, cuda"),
    ("max_model_len", 0, "max_model_len must be >= 1"),
])
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(InvalidArgument, match=message):
        EngineConfig(**{field: value})


def test_defaults_are_valid():
    config = EngineConfig()
    assert config.block_size == 16 and config.cpu_kernels is True


@pytest.mark.parametrize(("env", "argv", "expected"), [("", [], None), ("2048", [], 2048), ("2048", ["--max-model-len", "64"], 64),
                                                      (None, [], None)])
def test_max_model_len_comes_from_the_flag_or_the_environment(monkeypatch, env, argv, expected):
    """docker-compose.yml hands every service SEAWALL_MAX_MODEL_LEN, empty when unset."""
    if env is None:
        monkeypatch.delenv("SEAWALL_MAX_MODEL_LEN", raising=False)
    else:
        monkeypatch.setenv("SEAWALL_MAX_MODEL_LEN", env)
    p = argparse.ArgumentParser()
    add_max_model_len_flag(p)
    assert p.parse_args(argv).max_model_len == expected


def test_a_malformed_max_model_len_in_the_environment_is_named(monkeypatch, capsys):
    monkeypatch.setenv("SEAWALL_MAX_MODEL_LEN", "4k")
    with pytest.raises(SystemExit):
        add_max_model_len_flag(argparse.ArgumentParser())
    assert "SEAWALL_MAX_MODEL_LEN must be a whole number of tokens, got '4k'" in capsys.readouterr().err
