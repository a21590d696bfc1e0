"""vLLM's ``cache_salt`` through the core and the runner: only requests with the same salt share cached KV."""

from __future__ import annotations

import pytest

from seawall.offline.engine import OfflineEngine
from services.common.errors import InvalidArgument
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.scheduler.admission import check_cache_salt
from services.scheduler.core.config import SchedulerConfig

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def test_a_salted_prefix_is_cached_for_its_salt_only(tiny_model_dir):
    engine = OfflineEngine(EngineConfig(model=str(tiny_model_dir), kv_cache_bytes=8 << 20), SchedulerConfig())
    prompt = list(range(20, 90))  # 70 tokens: 4 full blocks to take from the cache
    runs = [(salt, engine.generate([prompt], [GREEDY], cache_salts=[salt])[0])
            for salt in ("a", "b", "", "a", "")]
    assert [out.num_cached_prompt_tokens for _, out in runs] == [0, 0, 0, 64, 64]
    assert len({tuple(out.token_ids) for _, out in runs}) == 1  # the salt changes what is shared, not the output


def test_a_salt_is_a_non_empty_string_of_bounded_length():
    assert check_cache_salt(None) == "" and check_cache_salt("t") == "t"
    for bad in ("", 7, ["a"], "x" * 1025):
        with pytest.raises(InvalidArgument, match="cache_salt"):
            check_cache_salt(bad)
