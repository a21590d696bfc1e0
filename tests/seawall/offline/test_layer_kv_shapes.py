"""Models whose layers' KV differ in shape, against transformers under every scheduling path: chunks of any size,
whole prompts, multi-step decoding, preemption by swap and by recompute, prefix-cache hits. Gemma 4 (wider
full-attention heads in runs of the pool's slots, its last layers reading blocks earlier layers wrote) and
MiMo-V2-Flash (twice the KV heads in its sliding layers, values narrower than keys cached padded, sinks in some
layers). Every block is back in the pool at the end."""

from __future__ import annotations

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.sampling_params import SamplingParams
from services.engine.checkpoint_report import kv_bytes_per_token
from services.engine.config import EngineConfig
from services.engine.model_config import ModelConfig
from services.scheduler.core.scheduler import SchedulerConfig

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

transformers = pytest.importorskip("transformers")

PROMPT_LENS = [1, 20, 63, 64, 65, 150]
MAX_TOKENS = 24


@pytest.fixture(scope="module", params=["gemma4", "mimo-v2-flash"])
def case(request, tiny_model_dir, tmp_path_factory):
    """(checkpoint, its transformers model, prompts, their greedy continuations)."""
    from tests.engine.test_architectures import CASES, save_checkpoint

    out = tmp_path_factory.mktemp(request.param)
    model = save_checkpoint(CASES[request.param](), out, tiny_model_dir)
    g = torch.Generator().manual_seed(50)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in PROMPT_LENS]
    return out, model, prompts, [_greedy(model, p) for p in prompts]


def _greedy(model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    return ids[0, len(prompt):].tolist()


def _engine(path, config: SchedulerConfig, blocks: int = 256, cpu_kernels: bool = True) -> OfflineEngine:
    block_bytes = 16 * kv_bytes_per_token(ModelConfig.from_dir(path), "float32")
    return OfflineEngine(EngineConfig(model=str(path), dtype="float32", kv_cache_bytes=blocks * block_bytes,
                                      swap_bytes=200 * block_bytes, cpu_kernels=cpu_kernels), config)


def _params(n: int) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)] * n


SCHEDULES = {
    "sarathi-chunk1": (SchedulerConfig(chunk_size=1), True),
    "sarathi-chunk7-torch-ops": (SchedulerConfig(chunk_size=7), False),
    "vllm-whole-prompts": (SchedulerConfig(policy="vllm"), True),
    "sarathi-decode-steps-4": (SchedulerConfig(chunk_size=32, num_decode_steps=4), True),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_greedy_output_matches_transformers(case, name):
    path, _, prompts, refs = case
    config, kernels = SCHEDULES[name]
    engine = _engine(path, config, cpu_kernels=kernels)
    got = engine.generate(prompts, _params(len(prompts)))
    for n, comp, ref in zip(PROMPT_LENS, got, refs, strict=True):
        assert comp.token_ids == ref, f"the {n}-token prompt diverged"
    assert engine.blocks.num_free == engine.blocks.num_blocks


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_matches_transformers(case, mode):
    """A pool of 16 blocks for prompts of up to 174 tokens' KV: requests are preempted and resumed."""
    path, _, prompts, refs = case
    engine = _engine(path, SchedulerConfig(chunk_size=16, preemption_mode=mode, policy="fastserve+sarathi"),
                     blocks=16)
    got = engine.generate(prompts, _params(len(prompts)))
    assert engine.scheduler.preemptions[mode] > 0
    assert [c.token_ids for c in got] == refs
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_prefix_cache_hits_match_transformers(case):
    """Next turns extend the 150-token prompt and its reply: their prefix's KV comes from the cache (every layer's
    that keeps KV: Gemma 4's sharing layers read their sources' blocks)."""
    path, model, prompts, refs = case
    engine = _engine(path, SchedulerConfig(chunk_size=16))
    first = prompts[-1] + refs[-1]
    turns = [first + [5, 6, 7], first + list(range(100, 140))]
    assert engine.generate([prompts[-1]], _params(1))[0].token_ids == refs[-1]
    got = engine.generate(turns, _params(2))
    assert [c.token_ids for c in got] == [_greedy(model, t) for t in turns]
    # Every token whose KV the first turn computed (its last, sampled token has none yet).
    assert [c.num_cached_prompt_tokens for c in got] == [len(first) - 1] * 2
