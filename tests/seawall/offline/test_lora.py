"""LoRA adapters through the scheduler core and the model runner: greedy output of every adapter (and of the
base model) in one batch equals ``transformers`` + ``peft`` token for token, whatever the chunk size, the
policy, preemptions by swap or recompute, or the prefix cache; an adapter's KV is never served to another."""

from __future__ import annotations

import random
import shutil

import pytest

from seawall.offline.engine import OfflineEngine
from services.common.errors import InvalidArgument
from services.common.sampling_params import SamplingParams
from services.common.step import LoraRef
from services.engine.config import EngineConfig
from services.scheduler.core.config import SchedulerConfig
from tests.lora_adapters import peft_greedy

pytest.importorskip("peft")

MAX_TOKENS = 20
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)


def _engine(model_dir, kv_kib: int = 8192, kernels: bool = True, **sched) -> OfflineEngine:
    return OfflineEngine(EngineConfig(model=str(model_dir), kv_cache_bytes=kv_kib << 10, swap_bytes=4 << 20,
                                      cpu_kernels=kernels), SchedulerConfig(**sched))


@pytest.fixture(scope="module")
def oracle(tiny_model_dir, lora_dirs):
    """Prompts, the adapter (or None) each runs with, and peft's greedy output for each."""
    rng = random.Random(3)
    prompts = [[i + 6] + [rng.randrange(6, 500) for _ in range(rng.choice([3, 17, 40, 90]))] for i in range(9)]
    names = [None, "alpha", "beta"] * 3
    expected = {name: peft_greedy(tiny_model_dir, lora_dirs[name] if name else None, prompts, MAX_TOKENS)
                for name in set(names)}
    refs = [LoraRef(n, str(lora_dirs[n])) if n else None for n in names]
    return prompts, refs, [expected[n][i] for i, n in enumerate(names)], expected


def test_adapters_change_the_output(oracle):
    prompts, _, _, expected = oracle
    for name in ("alpha", "beta"):
        assert sum(a != b for a, b in zip(expected[name], expected[None], strict=True)) >= len(prompts) - 1


@pytest.mark.oracle
@pytest.mark.parametrize("kernels, kv_kib, sched", [
    (True, 8192, {"chunk_size": 16}),
    (False, 8192, {"chunk_size": 64}),
    (True, 8192, {"policy": "vllm"}),
    (True, 512, {"policy": "fastserve"}),  # a small pool: swaps
    (True, 512, {"policy": "sarathi", "preemption_mode": "recompute", "chunk_size": 32}),
    (True, 8192, {"num_speculative_tokens": 3}),
    (True, 8192, {"num_decode_steps": 4}),
])
def test_greedy_output_of_mixed_adapters_equals_peft(tiny_model_dir, oracle, kernels, kv_kib, sched):
    prompts, refs, want, _ = oracle
    engine = _engine(tiny_model_dir, kv_kib, kernels, **sched)
    outs = engine.generate(prompts, [GREEDY] * len(prompts), refs)
    assert [o.token_ids for o in outs] == want
    if kv_kib < 1024:
        assert sum(o.num_preemptions for o in outs) > 0
    engine.scheduler.check_integrity()


def test_prefix_cache_is_shared_within_an_adapter_never_across(tiny_model_dir, oracle):
    prompts, _, _, expected = oracle
    alpha, beta = oracle[1][1], oracle[1][2]
    engine = _engine(tiny_model_dir)
    prompt = prompts[3]  # 90+ tokens: several full blocks
    runs = [(None, expected[None][3]), (alpha, expected["alpha"][3]), (beta, expected["beta"][3]),
            (alpha, expected["alpha"][3])]
    cached = []
    for ref, want in runs:
        (out,) = engine.generate([prompt], [GREEDY], [ref])
        assert out.token_ids == want
        cached.append(out.num_cached_prompt_tokens)
    assert cached[:3] == [0, 0, 0]  # the base model's blocks hold other KV than an adapter's
    assert cached[3] >= 16 * ((len(prompt) - 1) // 16)


def test_an_adapter_the_worker_cannot_load_fails_its_request_alone(tiny_model_dir, lora_dirs, tmp_path, oracle):
    prompts, _, _, expected = oracle
    gone = tmp_path / "gone"
    shutil.copytree(lora_dirs["alpha"], gone)
    (gone / "adapter_model.safetensors").unlink()
    engine = _engine(tiny_model_dir)
    outs = engine.generate(prompts[:2], [GREEDY] * 2, [LoraRef("gone", str(gone)), None])
    assert outs[0].finish_reason == "error" and isinstance(outs[0].error, InvalidArgument)
    assert "cannot read adapter_model.safetensors" in str(outs[0].error)
    assert outs[1].token_ids == expected[None][1]
    assert engine.blocks.num_free == engine.blocks.num_blocks


@pytest.mark.oracle
def test_an_adapter_of_the_second_model_equals_peft(second_model_dir, tmp_path):
    """GQA ratio 3, head_dim 16, untied embeddings, llama3 RoPE, sharded weights: other shapes for every A and B."""
    from tests.lora_adapters import make_adapter

    adapter = make_adapter(second_model_dir, tmp_path / "second", 5, r=4, lora_alpha=12,
                           target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"])
    rng = random.Random(8)
    prompts = [[rng.randrange(6, 500) for _ in range(n)] for n in (4, 37, 70)]
    want = peft_greedy(second_model_dir, adapter, prompts, MAX_TOKENS)
    engine = _engine(second_model_dir, chunk_size=16)
    outs = engine.generate(prompts, [GREEDY] * 3, [LoraRef("s", str(adapter))] * 2 + [None])
    assert [o.token_ids for o in outs[:2]] == want[:2]
    assert outs[2].token_ids == peft_greedy(second_model_dir, None, prompts[2:], MAX_TOKENS)[0]


@pytest.mark.oracle
def test_an_adapter_of_fused_projections_equals_peft(tiny_model_dir, tmp_path):
    """Phi-3 stores q/k/v and gate/up fused, and its adapters adapt them whole (``qkv_proj``,
    ``gate_up_proj``): one A and one B over the engine's fused projection, any mix with the base model."""
    import torch
    import transformers

    from tests.lora_adapters import make_adapter

    config = transformers.Phi3Config(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                     bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # decisive logits: greedy choices are not near-ties
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.2) if "norm" in name else p.normal_(0.0, 0.3)
    base = tmp_path / "phi3"
    model.save_pretrained(base)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, base / name)
    adapter = make_adapter(base, tmp_path / "phi3-lora", 5, r=8, lora_alpha=16,
                           target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    rng = random.Random(4)
    prompts = [[rng.randrange(6, 4000) for _ in range(n)] for n in (5, 30, 70)]
    want, plain = peft_greedy(base, adapter, prompts, MAX_TOKENS), peft_greedy(base, None, prompts, MAX_TOKENS)
    assert want != plain
    refs = [LoraRef("phi", str(adapter)), None, LoraRef("phi", str(adapter))]
    got = _engine(base, chunk_size=16).generate(prompts, [GREEDY] * 3, refs)
    assert [c.token_ids for c in got] == [want[0], plain[1], want[2]]


@pytest.mark.oracle
@pytest.mark.parametrize("kernels", [True, False])
def test_per_module_ranks_and_alphas_equal_peft(tiny_model_dir, tmp_path, kernels):
    """PEFT's ``rank_pattern`` and ``alpha_pattern``: q at rank 8 beside k and v at 4, v and up at their own alpha
    (inside one fused projection: a part's scaling folded into its B as a ratio), down at rank 2 with rsLoRA;
    mixed with the base model in one batch."""
    from tests.lora_adapters import make_adapter

    adapter = make_adapter(tiny_model_dir, tmp_path / "patterned", 7, r=4, lora_alpha=8, use_rslora=True,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"],
                           rank_pattern={"q_proj": 8, r"layers\.1\.mlp\.down_proj": 2},
                           alpha_pattern={"v_proj": 32, "up_proj": 2})
    rng = random.Random(8)
    prompts = [[rng.randrange(6, 500) for _ in range(n)] for n in (4, 33, 70)]
    want = peft_greedy(tiny_model_dir, adapter, prompts, MAX_TOKENS)
    assert want != peft_greedy(tiny_model_dir, None, prompts, MAX_TOKENS)
    ref = LoraRef("patterned", str(adapter))
    outs = _engine(tiny_model_dir, kernels=kernels, chunk_size=16).generate(
        prompts * 2, [GREEDY] * 6, loras=[ref] * 3 + [None] * 3)
    assert [o.token_ids for o in outs[:3]] == want
    assert [o.token_ids for o in outs[3:]] == peft_greedy(tiny_model_dir, None, prompts, MAX_TOKENS)


INVOCATION = [301, 302, 303]


@pytest.fixture(scope="module")
def activated(tiny_model_dir, tmp_path_factory):
    """An activated LoRA (aLoRA): it applies from the last occurrence of its invocation tokens in the prompt."""
    from tests.lora_adapters import make_adapter

    return make_adapter(tiny_model_dir, tmp_path_factory.mktemp("alora"), seed=9, r=8, lora_alpha=32,
                        task_type="CAUSAL_LM", alora_invocation_tokens=INVOCATION,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


@pytest.mark.parametrize("kernels", [True, False])
def test_an_activated_lora_applies_from_its_invocation_as_peft_does(tiny_model_dir, lora_dirs, activated, kernels):
    """Prompts invoking it once, twice (the last counts), at their very end, or not at all (the base model),
    beside a plain adapter and the base model in one batch, chunks of 16 splitting them anywhere."""
    rng = random.Random(5)

    def some(n: int) -> list[int]:
        return [rng.randrange(6, 300) for _ in range(n)]

    prompts = [some(30) + INVOCATION + some(10), some(5) + INVOCATION + some(35) + INVOCATION + some(4),
               some(40), some(21) + INVOCATION, some(17), some(25)]
    ref, alpha = LoraRef("alora", str(activated)), LoraRef("alpha", str(lora_dirs["alpha"]))
    refs = [ref, ref, ref, ref, alpha, None]
    outs = _engine(tiny_model_dir, kernels=kernels, chunk_size=16).generate(prompts, [GREEDY] * len(prompts), refs)
    want = [peft_greedy(tiny_model_dir, None if r is None else r.path, [p], MAX_TOKENS)[0]
            for p, r in zip(prompts, refs, strict=True)]
    assert [o.token_ids for o in outs] == want
    assert want[2] == peft_greedy(tiny_model_dir, None, prompts[2:3], MAX_TOKENS)[0]  # not invoked: the base model
    assert want[0] != peft_greedy(tiny_model_dir, None, prompts[:1], MAX_TOKENS)[0]  # invoked: the adapter matters


def test_an_activated_loras_kv_is_shared_only_where_it_applies_from_the_same_point(tiny_model_dir, activated):
    """A prompt that invokes it again later computes the tokens between the two invocations without the
    adapter: the cached blocks of a prompt that invoked it once (same tokens, adapter applied) are not its KV."""
    rng = random.Random(6)
    first = [rng.randrange(6, 300) for _ in range(10)] + INVOCATION + [rng.randrange(6, 300) for _ in range(51)]
    second = first + INVOCATION + [rng.randrange(6, 300) for _ in range(5)]
    engine, ref = _engine(tiny_model_dir, chunk_size=64), LoraRef("alora", str(activated))
    engine.generate([first], [GREEDY], [ref])
    out = engine.generate([second], [GREEDY], [ref])[0]
    assert out.token_ids == peft_greedy(tiny_model_dir, activated, [second], MAX_TOKENS)[0]
    again = engine.generate([second], [GREEDY], [ref])[0]  # its own blocks are its KV: served from the cache
    assert again.token_ids == out.token_ids and again.num_cached_prompt_tokens >= 64


def test_an_activated_lora_takes_the_base_models_kv_before_its_invocation(tiny_model_dir, activated):
    """Before the block its invocation starts in, an activated LoRA's KV is the base model's: served from the
    blocks a base-model request cached, and cached for the next base-model request in turn."""
    rng = random.Random(7)
    context = [rng.randrange(6, 300) for _ in range(70)]
    invoked = context + INVOCATION + [rng.randrange(6, 300) for _ in range(6)]
    engine, ref = _engine(tiny_model_dir, chunk_size=64), LoraRef("alora", str(activated))
    base = engine.generate([context], [GREEDY])[0]
    out = engine.generate([invoked], [GREEDY], [ref])[0]
    assert out.token_ids == peft_greedy(tiny_model_dir, activated, [invoked], MAX_TOKENS)[0]
    assert out.num_cached_prompt_tokens == 64  # the four blocks before the one its invocation starts in
    plain = engine.generate([context + [5] * 20], [GREEDY])[0]  # and the base model takes them back
    assert plain.num_cached_prompt_tokens == 64 and base.num_cached_prompt_tokens == 0
