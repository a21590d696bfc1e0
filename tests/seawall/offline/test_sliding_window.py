"""A sliding-window model (a Mistral checkpoint, every layer attending within 40 keys) against transformers:
prompts and outputs well past the window, under chunk sizes, policies, preemption by swap and by recompute,
prefix-cache hits and speculative decoding, on both model paths. The core frees each request's blocks as
they fall out of the window, so a long request holds a few blocks, not one per 16 tokens."""

from __future__ import annotations

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.scheduler.core.scheduler import SchedulerConfig
from tests.conftest import WINDOW

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

transformers = pytest.importorskip("transformers")

PROMPT_LENS = [1, 20, 39, 40, 41, 100, 150, 257]
MAX_TOKENS = 30


def _greedy(model, prompts, max_tokens=MAX_TOKENS):
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    refs = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
            ids = out[0, len(prompt):].tolist()
            refs.append(ids[: next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))])
    return refs


@pytest.fixture(scope="module")
def hf_model(windowed_model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(windowed_model_dir, dtype=torch.float32).eval()
    assert model.config.sliding_window == WINDOW
    return model


@pytest.fixture(scope="module")
def case(hf_model):
    g = torch.Generator().manual_seed(40)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in PROMPT_LENS]
    return prompts, _greedy(hf_model, prompts)


@pytest.fixture(scope="module")
def block_bytes(windowed_model_dir):
    return OfflineEngine(EngineConfig(model=str(windowed_model_dir), kv_cache_bytes=1 << 20)).runner.layout.bytes_per_block


def _engine(model_dir, config: SchedulerConfig, block_bytes: int, blocks: int = 24, cpu_kernels=True,
            ) -> tuple[OfflineEngine, list[int]]:
    """The engine on a pool of ``blocks`` (small: a freed block is soon another request's, so a block freed
    too early shows in the tokens), the core's integrity checked after every plan; returns it and the list
    the pool's used block counts are appended to, one per plan."""
    e = OfflineEngine(EngineConfig(model=str(model_dir), dtype="float32", cpu_kernels=cpu_kernels,
                                   kv_cache_bytes=blocks * block_bytes, swap_bytes=200 * block_bytes), config)
    used: list[int] = []
    schedule = e.scheduler.schedule

    def checked(now=None):
        plan = schedule(now)
        e.scheduler.check_integrity()
        used.append(e.blocks.num_blocks - e.blocks.num_free)
        return plan

    e.scheduler.schedule = checked
    return e, used


CASES = {
    "sarathi-chunk7": (SchedulerConfig(chunk_size=7), True),
    "sarathi-chunk16-torch-ops": (SchedulerConfig(chunk_size=16), False),
    "vllm-whole-prompts": (SchedulerConfig(policy="vllm"), True),
    "fastserve+sarathi-chunk64-torch-ops": (SchedulerConfig(policy="fastserve+sarathi", chunk_size=64), False),
    "sarathi-decode-steps-4": (SchedulerConfig(chunk_size=32, num_decode_steps=4), True),
    "sarathi-speculative-3": (SchedulerConfig(chunk_size=32, num_speculative_tokens=3), True),
}


@pytest.mark.parametrize("name", CASES)
def test_greedy_output_past_the_window_matches_transformers(windowed_model_dir, case, block_bytes, name):
    prompts, refs = case
    config, kernels = CASES[name]
    engine, _ = _engine(windowed_model_dir, config, block_bytes, cpu_kernels=kernels)
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0)] * len(prompts))
    for n, comp, ref in zip(PROMPT_LENS, got, refs, strict=True):
        assert comp.token_ids == ref, f"the {n}-token prompt diverged"
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_a_long_request_holds_about_a_window_of_blocks(windowed_model_dir, hf_model, block_bytes):
    g = torch.Generator().manual_seed(41)
    prompt = torch.randint(3, 4096, (400,), generator=g).tolist()
    engine, used = _engine(windowed_model_dir, SchedulerConfig(chunk_size=16), block_bytes, blocks=200)
    (comp,) = engine.generate([prompt], [SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)])
    assert len(comp.token_ids) == 60
    assert comp.token_ids[:12] == _greedy(hf_model, [prompt], max_tokens=12)[0]
    # 460 tokens would fill 29 blocks; the window (40) and a 16-token chunk span at most 5, and a block
    # is freed when the plan after the one that left it behind is made: 6.
    assert max(used) <= 6, used


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_with_dropped_blocks_matches_transformers(windowed_model_dir, case, block_bytes, mode):
    prompts, refs = case
    # 16 blocks: the long prompts' windows and the short ones crowd each other out.
    engine, _ = _engine(windowed_model_dir, SchedulerConfig(chunk_size=16, preemption_mode=mode,
                                                           policy="fastserve+sarathi"), block_bytes, blocks=16)
    got = engine.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0)] * len(prompts))
    assert engine.scheduler.preemptions[mode] > 0
    for n, comp, ref in zip(PROMPT_LENS, got, refs, strict=True):
        assert comp.token_ids == ref, f"the {n}-token prompt diverged after preemption"
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_prefix_cache_hits_past_the_window_match_transformers(windowed_model_dir, hf_model, block_bytes):
    """A 120-token shared prefix (three windows): its blocks were freed as the first request ran past them,
    and stay cached for the second batch."""
    g = torch.Generator().manual_seed(42)
    prefix = torch.randint(3, 4096, (120,), generator=g).tolist()
    second = [prefix + torch.randint(3, 4096, (n,), generator=g).tolist() for n in (0, 8, 45)]
    engine, _ = _engine(windowed_model_dir, SchedulerConfig(chunk_size=16), block_bytes, blocks=64)
    params = [SamplingParams(max_tokens=12, temperature=0)] * len(second)
    engine.generate([prefix + [5, 6, 7]], params[:1])
    got = engine.generate(second, params)
    assert [c.num_cached_prompt_tokens for c in got] == [112, 112, 112]
    assert [c.token_ids for c in got] == _greedy(hf_model, second, max_tokens=12)


def test_a_request_longer_than_the_pool_runs_when_its_window_fits(windowed_model_dir, hf_model, block_bytes):
    """300 + 30 tokens need 21 blocks whole; a 12-block pool holds its window and a 16-token chunk (5)."""
    from services.common.errors import ResourceExhausted

    g = torch.Generator().manual_seed(43)
    prompt = torch.randint(3, 4096, (300,), generator=g).tolist()
    params = SamplingParams(max_tokens=30, temperature=0)
    engine, used = _engine(windowed_model_dir, SchedulerConfig(chunk_size=16), block_bytes, blocks=12)
    engine.validate(prompt, params)
    (comp,) = engine.generate([prompt], [params])
    assert comp.token_ids == _greedy(hf_model, [prompt])[0] and max(used) <= 5
    # A policy that runs a prompt whole needs all of it at once.
    whole, _ = _engine(windowed_model_dir, SchedulerConfig(policy="vllm"), block_bytes, blocks=12)
    with pytest.raises(ResourceExhausted, match="needs 21 KV blocks"):
        whole.validate(prompt, params)
