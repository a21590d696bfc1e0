"""A next turn continuing a finished request copies its partly filled last block (tail_blocks.py) on the real
engine, and its greedy output still equals transformers'."""

from __future__ import annotations

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.scheduler.core.config import SchedulerConfig

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("block_size", [4, 16])
def test_a_turn_continuing_the_last_takes_its_tail_and_matches_transformers(tiny_model_dir, block_size):
    engine = OfflineEngine(EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32",
                                        block_size=block_size, kv_cache_bytes=8 << 20), SchedulerConfig(chunk_size=16))
    greedy = SamplingParams(max_tokens=6, temperature=0)
    prompt = torch.randint(3, 4096, (29,), generator=torch.Generator().manual_seed(2)).tolist()
    first = engine.generate([prompt], [greedy])[0]
    turn = prompt + first.token_ids + [77, 78, 79]
    second = engine.generate([turn], [greedy])[0]
    computed = len(prompt) + len(first.token_ids) - 1  # the last output's KV was never computed
    assert second.num_cached_prompt_tokens == computed  # full blocks and the tail's tokens
    assert engine.scheduler.prefix_stats.tail_tokens == computed % block_size > 0
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model.generate(torch.tensor([turn]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = ref[0, len(turn):].tolist()
    eos = set(engine.checkpoint.eos_token_ids)
    assert second.token_ids == expected[: next((i + 1 for i, t in enumerate(expected) if t in eos), len(expected))]
