"""Hybrid models against transformers (Qwen3-Next: Gated DeltaNet linear attention in two layers of three; Granite
4.0-H: Mamba-2 in two of three; LFM2: gated short convolutions in two of three; Nemotron 3: Mamba-2 and attention
between expert layers; Jamba: the first Mamba in three layers of four; Falcon-H1: attention and Mamba-2 side by
side in every layer; LFM3: LFM2's convolutions beside sliding and full attention; Kimi Linear: Kimi Delta Attention beside latent
attention and experts; Zamba2: Mamba-2 in every layer, shared transformer blocks before it in some; Mamba, Falcon
Mamba and Mamba-2 without attention) under every scheduling path that must carry their recurrent state: prompt chunks of any size (a state resumed chunk after
chunk), whole prompts, multi-step decoding, MLFQ order, preemption by swap (the state stays on the worker) and by
recompute (it starts again from zeros). A prefix is never taken from the cache (the blocks do not hold the
state); every state slot is back in the pool at the end."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.sampling_params import SamplingParams
from services.common.step import NewSequence, StepPlan
from services.engine.checkpoint_report import kv_bytes_per_token
from services.engine.config import EngineConfig
from services.engine.model_config import ModelConfig
from services.scheduler.core.scheduler import SchedulerConfig

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

transformers = pytest.importorskip("transformers")

PROMPT_LENS = [1, 20, 63, 64, 65, 150]
MAX_TOKENS = 24


# Falcon Mamba's state is Mamba's (tests/engine/test_mamba.py checks its model).
@pytest.fixture(scope="module", params=["qwen3-next", "granite4-h", "lfm2", "nemotron-h-moe", "jamba", "falcon-h1",
                                        "lfm3", "kimi-linear", "mamba", "mamba2", "zamba2"])
def model_dir(request, hybrid_model_dir, tiny_model_dir, tmp_path_factory):
    if request.param == "qwen3-next":
        return hybrid_model_dir
    from tests.engine.test_architectures import CASES, save_checkpoint
    from tests.engine.test_mamba import CASES as ATTENTION_FREE

    out = tmp_path_factory.mktemp(request.param)
    save_checkpoint({**CASES, **ATTENTION_FREE}[request.param](), out, tiny_model_dir)
    return out


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _greedy(model, prompts, max_tokens=MAX_TOKENS):
    refs = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0,
                                 eos_token_id=None)
            refs.append(out[0, len(prompt):].tolist())
    return refs


@pytest.fixture(scope="module")
def case(hf_model):
    g = torch.Generator().manual_seed(50)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in PROMPT_LENS]
    return prompts, _greedy(hf_model, prompts)


def _engine(model_dir, config: SchedulerConfig, blocks: int | None = None, checkpoints: int = 16,
            host_checkpoints: int = 64, cpu_kernels: bool = True) -> OfflineEngine:
    # 16 tokens' KV in fp32 (one attention layer's K and V of 2 heads of 16 in most of these; Falcon-H1 attends in
    # every layer, Kimi Linear keeps a latent). An attention-free model's blocks hold nothing: as many as one
    # sequence of so many blocks' context makes.
    block_bytes = 16 * kv_bytes_per_token(ModelConfig.from_dir(model_dir), "float32")
    pool = (dict(kv_cache_bytes=(blocks or 256) * block_bytes, swap_bytes=200 * block_bytes) if block_bytes
            else dict(state_slots=1, max_model_len=(blocks or 256) * 16))
    return OfflineEngine(EngineConfig(model=str(model_dir), dtype="float32", **pool,
                                      state_checkpoints=checkpoints, host_state_checkpoints=host_checkpoints,
                                      cpu_kernels=cpu_kernels), config)


def _params(n: int) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)] * n


def _all_states_free(engine: OfflineEngine) -> bool:
    """After the plan that tells the worker which sequences finished (the next one, as in the mesh)."""
    engine.runner.execute(engine.scheduler.schedule())
    states = engine.runner.states
    return states.num_free == states.capacity - states.num_checkpoints and not engine.runner.seqs


CASES = {
    "sarathi-chunk1": SchedulerConfig(chunk_size=1),
    "sarathi-chunk7": SchedulerConfig(chunk_size=7),
    "sarathi-chunk64": SchedulerConfig(chunk_size=64),
    "vllm-whole-prompts": SchedulerConfig(policy="vllm"),
    "fastserve+sarathi-chunk16": SchedulerConfig(policy="fastserve+sarathi", chunk_size=16),
    "sarathi-decode-steps-4": SchedulerConfig(chunk_size=32, num_decode_steps=4),
}


@pytest.mark.parametrize("name", CASES)
def test_greedy_output_matches_transformers(model_dir, case, name):
    prompts, refs = case
    engine = _engine(model_dir, CASES[name])
    got = engine.generate(prompts, _params(len(prompts)))
    for n, comp, ref in zip(PROMPT_LENS, got, refs, strict=True):
        assert comp.token_ids == ref, f"the {n}-token prompt diverged"
    assert engine.blocks.num_free == engine.blocks.num_blocks and _all_states_free(engine)


@pytest.mark.parametrize("name", ["sarathi-chunk7", "sarathi-decode-steps-4"])
def test_the_torch_ops_path_matches_transformers_too(model_dir, case, name):
    """Without the fused CPU kernels (what a GPU or bf16 runs): the layers' torch ops, the chunked form for
    prompts."""
    prompts, refs = case
    engine = _engine(model_dir, CASES[name], cpu_kernels=False)
    assert engine.runner.kernels is None
    got = engine.generate(prompts, _params(len(prompts)))
    assert [c.token_ids for c in got] == refs


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_keeps_or_restarts_the_state(model_dir, case, mode):
    prompts, refs = case
    # 20 blocks for prompts and outputs that need 33 at once: requests crowd each other out.
    engine = _engine(model_dir, SchedulerConfig(chunk_size=16, preemption_mode=mode, policy="fastserve+sarathi"),
                     blocks=20)
    on_host, execute = [], engine.runner.execute

    def watched(plan):  # a swapped-out sequence's state waits in host memory, not in a device slot
        result = execute(plan)
        on_host.append(engine.runner.states.num_on_host)
        return result

    engine.runner.execute = watched
    got = engine.generate(prompts, _params(len(prompts)))
    assert engine.scheduler.preemptions[mode] > 0
    assert (max(on_host) > 0) == (mode == "swap") and on_host[-1] == 0
    for n, comp, ref in zip(PROMPT_LENS, got, refs, strict=True):
        assert comp.token_ids == ref, f"the {n}-token prompt diverged after preemption ({mode})"
    assert engine.blocks.num_free == engine.blocks.num_blocks and _all_states_free(engine)


def test_a_repeated_prompt_resumes_from_the_state_saved_at_its_last_full_block(model_dir, case):
    """The first run saves its state where the prompt's last full block ends (144 of 150 tokens, inside a chunk
    of 32); a second run of the prompt takes those blocks and that state, runs the last 6 tokens, and matches
    transformers. Without state checkpoints a prefix is never taken (its blocks alone would skip the tokens the
    state needs)."""
    prompts, refs = case
    engine = _engine(model_dir, SchedulerConfig(chunk_size=32, enable_prefix_caching=True))
    first = engine.generate([prompts[-1]], _params(1))
    again = engine.generate([prompts[-1], prompts[-1]], _params(2))
    assert [c.num_cached_prompt_tokens for c in first + again] == [0, 144, 144]
    assert [c.token_ids for c in first + again] == [refs[-1]] * 3
    assert engine.blocks.num_free == engine.blocks.num_blocks and _all_states_free(engine)
    none = _engine(model_dir, SchedulerConfig(chunk_size=32, enable_prefix_caching=True), checkpoints=0)
    runs = none.generate([prompts[-1]], _params(1)) + none.generate([prompts[-1]], _params(1))
    assert [c.num_cached_prompt_tokens for c in runs] == [0, 0] and [c.token_ids for c in runs] == [refs[-1]] * 2


@pytest.mark.parametrize("chunk", [7, 64, None, "decode-steps-4"], ids=["chunk7", "chunk64", "whole", "decode-steps-4"])
def test_a_next_turn_resumes_from_the_state_of_the_turn_before(model_dir, hf_model, case, chunk):
    """A conversation's second turn (the first prompt, its output, a new message) takes the first turn's blocks
    and the state saved at the last block its output filled; its output matches transformers' for the whole
    second prompt, and the first prompt again still finds its own. Chunks of 7 cross the saved points inside a
    chunk, 64 too, whole prompts (vLLM's policy) at their end; multi-step decodes of 4 passes save in whichever
    pass fills a block."""
    prompts, _ = case
    if chunk == "decode-steps-4":
        config = SchedulerConfig(chunk_size=64, num_decode_steps=4)
    else:
        config = SchedulerConfig(chunk_size=chunk) if chunk else SchedulerConfig(policy="vllm")
    engine = _engine(model_dir, replace(config, enable_prefix_caching=True))
    first = engine.generate([prompts[3]], _params(1))[0]
    # 64 + 24 tokens, 87 computed (the last output never ran): states saved after 48 (the prompt's last full
    # block a repeat could take), then as decodes fill blocks, each replacing the one before: the latest after 80.
    second = prompts[3] + first.token_ids + prompts[1]
    got = engine.generate([second], _params(1))[0]
    assert got.num_cached_prompt_tokens == 80
    assert got.token_ids == _greedy(hf_model, [second])[0]
    repeat = engine.generate([prompts[3]], _params(1))[0]
    assert repeat.num_cached_prompt_tokens == 48 and repeat.token_ids == first.token_ids


@pytest.mark.parametrize("chunk", [7, 64], ids=["chunk7", "chunk64"])
def test_prompts_sharing_a_system_prompt_resume_from_where_they_part(model_dir, hf_model, case, chunk):
    """Three prompts after one 150-token system prompt: the second finds the first's blocks but no state
    after them, and saves one where the two part (144: the system prompt's last full block; the blocks after
    hold other tokens); the third resumes from it. Each output matches transformers'."""
    prompts, _ = case
    system = prompts[5]
    asks = [system + prompts[i] for i in (1, 2, 0)]  # + 20, 63 and 1 tokens
    engine = _engine(model_dir, SchedulerConfig(chunk_size=chunk, enable_prefix_caching=True))
    got = [engine.generate([ask], _params(1))[0] for ask in asks]
    assert [c.num_cached_prompt_tokens for c in got] == [0, 0, 144]
    assert [c.token_ids for c in got] == _greedy(hf_model, asks)
    assert engine.blocks.num_free == engine.blocks.num_blocks and _all_states_free(engine)


def test_states_moved_to_host_memory_resume_the_next_turns(model_dir, hf_model, case):
    """Three conversations on a worker with 2 device slots for saved states: each first turn's saves push the
    states before them to host memory (8 slots), and every next turn resumes from its turn before's latest
    state, wherever it waits (80 of 63 + 24 and 64 + 24 tokens, 160 of 150 + 24), matching transformers.
    Without host slots, those of the first conversations were dropped. The first turns one at a time (a plan
    saves at most as many states as there are device slots), the next ones together."""
    prompts, _ = case
    firsts = [prompts[i] for i in (2, 3, 5)]
    config = SchedulerConfig(chunk_size=64, enable_prefix_caching=True)
    hits, outputs = {}, {}
    for host in (8, 0):
        engine = _engine(model_dir, config, checkpoints=2, host_checkpoints=host)
        outs = [engine.generate([p], _params(1))[0] for p in firsts]
        seconds = [p + o.token_ids + prompts[1] for p, o in zip(firsts, outs, strict=True)]
        got = engine.generate(seconds, _params(3))
        outputs[host], hits[host] = [c.token_ids for c in got], [c.num_cached_prompt_tokens for c in got]
        assert (engine.runner.states.num_host_checkpoints > 0) == (host > 0)
        assert engine.blocks.num_free == engine.blocks.num_blocks and _all_states_free(engine)
    assert outputs[8] == outputs[0] == _greedy(hf_model, seconds)
    assert hits[8] == [80, 80, 160] and sum(hits[0]) < sum(hits[8])


def test_more_sequences_than_slots_grow_the_state_pool(model_dir, case):
    prompts, refs = case
    engine = _engine(model_dir, SchedulerConfig(chunk_size=64))
    start = engine.runner.states.capacity
    many = prompts * 3  # 18 at once past the pool's first 8 slots
    got = engine.generate(many, _params(len(many)))
    assert [c.token_ids for c in got] == refs * 3
    assert engine.runner.states.capacity > start and _all_states_free(engine)


def test_what_cannot_carry_a_recurrent_state_is_refused(hybrid_model_dir):
    with pytest.raises(ValueError, match="speculative decoding is not served for models with linear-attention"):
        _engine(hybrid_model_dir, SchedulerConfig(num_speculative_tokens=3))
    engine = _engine(hybrid_model_dir, SchedulerConfig())
    # A sequence whose first tokens ran elsewhere (a prefix cached or moved by its blocks) fails alone, by name.
    plan = StepPlan(1, new=[NewSequence("moved", list(range(3, 40)), 37, 32, [0, 1, 2], SamplingParams(max_tokens=4))],
                    num_scheduled_tokens={"moved": 5})
    result = engine.runner.execute(plan)
    assert "32 tokens computed elsewhere and no recurrent state" in str(result.errors["moved"])
    assert "moved" not in result.sampled


def test_kv_is_kept_for_attention_layers_only_and_mtp_weights_are_skipped(hybrid_model_dir, tmp_path):
    """The pool's block holds the one attention layer's K and V; a multi-token-prediction module (Qwen3-Next's
    checkpoints hold one, ``mtp.*``, which transformers skips) loads as if absent."""
    import shutil

    from safetensors.torch import load_file, save_file

    prompts = [list(range(5, 5 + n)) for n in (3, 40, 70)]
    refs = _greedy(transformers.AutoModelForCausalLM.from_pretrained(hybrid_model_dir, dtype=torch.float32).eval(),
                   prompts)
    shutil.copytree(hybrid_model_dir, tmp_path / "ckpt")
    weights = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    weights |= {"mtp.fc.weight": torch.ones(64, 128), "mtp.layers.0.input_layernorm.weight": torch.ones(64)}
    save_file(weights, str(tmp_path / "ckpt" / "model.safetensors"), metadata={"format": "pt"})
    engine = _engine(tmp_path / "ckpt", SchedulerConfig(chunk_size=16))
    assert engine.runner.layout.num_layers == 1 and engine.runner.layout.bytes_per_block == 16 * 2 * 2 * 16 * 4
    assert [c.token_ids for c in engine.generate(prompts, _params(3))] == refs
