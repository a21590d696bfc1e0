"""``EngineConfig``: every bad value is refused with a message that names its field."""

import pytest

from services.common.errors import InvalidArgument
from services.engine.config import EngineConfig


@pytest.mark.parametrize(("field", "value", "message"), [
    ("block_size", 12, "block_size must be a power of two"),
    ("kv_cache_bytes", 0, "kv_cache_bytes must be > 0"),
    ("swap_bytes", -1, "swap_bytes must be >= 0"),
    ("cpu_kernels", "no", "cpu_kernels must be true or false"),
    ("dtype", "float8", "dtype must be auto or one of"),
    ("device", "tpu", "device must be auto, cpu, cuda"),
])
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(InvalidArgument, match=message):
        EngineConfig(**{field: value})


def test_defaults_are_valid():
    config = EngineConfig()
    assert config.block_size == 16 and config.cpu_kernels is True
