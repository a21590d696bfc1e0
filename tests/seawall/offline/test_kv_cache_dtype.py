"""A float8 KV cache (``--kv-cache-dtype fp8`` / ``fp8_e5m2``, services/engine/kv_quant.py) on the real engine:
greedy output equals transformers' with a cache that rounds each key and value the same way
(tests/kv_fp8_oracle.py), on every scheduling path — chunked prefill, block sizes, preemption by swap and by
recompute, multi-step decoding, prefix-cache hits down to a partly filled block — and the rounding is real:
that oracle parts from unrounded transformers on most prompts.

"Equals" allows one thing: the rounding turns a last-bit difference (a chunk's attention summed in another
order than one pass's) into a key rounded to the next float8 where it sat at a midpoint, which can tip a
near-tie. So a request's tokens equal the oracle's, or part from them once at a position where both sides
rank the two tokens within ``NEAR_TIE`` of each other (measured: one request in 144 parted, at gaps of 0.001 and
0.01); every case has at most one such request. A stale block, an unrounded key or a wrong table parts at once
and by far more."""

from __future__ import annotations

import os

import pytest
import torch

from seawall.offline.engine import OfflineEngine
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.scheduler.core.config import SchedulerConfig
from tests.kv_fp8_oracle import rounding_cache

pytestmark = [pytest.mark.oracle, pytest.mark.slow]
transformers = pytest.importorskip("transformers")

LENGTHS = [1, 5, 16, 17, 40, 100, 257, 300]
MAX_TOKENS = 16
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=5)
NEAR_TIE = 0.05  # logprob gap
# The engine under test runs here (fp32; the oracle stays on the CPU): on a GPU machine, SEAWALL_TEST_DEVICE=cuda.
DEVICE = os.environ.get("SEAWALL_TEST_DEVICE", "cpu")


def _prompts(lengths=LENGTHS, seed=8) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 4096, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    """``hf(prompt, max_tokens, kv_cache_dtype)``: transformers' greedy tokens, up to EOS, and each step's
    logprobs; the KV rounded to the named float8, or not rounded with ``None``."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    eos = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
              else [model.generation_config.eos_token_id])
    memo = {}

    def generate(prompt, max_tokens, kv_cache_dtype):
        key = (tuple(prompt), max_tokens, kv_cache_dtype)
        if key not in memo:
            extra = {"cache": rounding_cache(kv_cache_dtype)()} if kv_cache_dtype else {}
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                     pad_token_id=0, output_logits=True, return_dict_in_generate=True, **extra)
            ids = out.sequences[0, len(prompt):].tolist()
            cut = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
            memo[key] = ids[:cut], [torch.log_softmax(step[0], -1) for step in out.logits[:cut]]
        return memo[key]

    return generate


def _engine(model_dir, kv_cache_dtype, sched=None, **engine) -> OfflineEngine:
    config = EngineConfig(model=str(model_dir), device=DEVICE, dtype="float32", kv_cache_dtype=kv_cache_dtype,
                          **{"kv_cache_bytes": 8 << 20, **engine})
    return OfflineEngine(config, sched or SchedulerConfig())


def test_a_float8_pool_holds_four_times_the_blocks_of_fp32_and_runs_torch_ops(tiny_model_dir):
    fp32 = _engine(tiny_model_dir, "auto").runner
    for name, dtype in (("fp8", torch.float8_e4m3fn), ("fp8_e4m3", torch.float8_e4m3fn),
                        ("fp8_e5m2", torch.float8_e5m2)):
        runner = _engine(tiny_model_dir, name).runner
        assert runner.kv.device_kv.dtype == runner.layout.dtype == dtype
        assert runner.layout.bytes_per_block * 4 == fp32.layout.bytes_per_block
        assert runner.kv.num_blocks == 4 * fp32.kv.num_blocks
        # The fused kernels round their norms and RoPE otherwise than torch, which the float8 rounding would turn
        # into other tokens (kv_quant.py).
        assert runner.kernels is None
        # Widening is exact whoever does it: the kernels' gather widens e4m3 (torch converts it ~13x slower).
        assert (runner.float8_kernels is not None) == (dtype == torch.float8_e4m3fn and fp32.kernels is not None)
    assert fp32.float8_kernels is None


def test_the_rounding_changes_what_transformers_generates(hf):
    """Else the oracle below could not tell a float8 pool from an fp32 one."""
    prompts = _prompts()
    for kv in ("fp8", "fp8_e5m2"):
        assert sum(hf(p, MAX_TOKENS, kv)[0] != hf(p, MAX_TOKENS, None)[0] for p in prompts) >= len(prompts) // 2


def _agrees(prompt, comp, ref) -> bool:
    """True where ``comp``'s tokens equal the oracle's ``ref`` (ids, logprobs); False where they part at a
    near-tie; fails where they part otherwise."""
    ref_ids, ref_logprobs = ref
    at = next((i for i, (a, b) in enumerate(zip(comp.token_ids, ref_ids, strict=False)) if a != b), None)
    if at is None:
        assert comp.token_ids == ref_ids, f"the {len(prompt)}-token prompt stopped elsewhere"
        return True
    ours, theirs = comp.token_ids[at], ref_ids[at]
    top = dict(comp.logprobs[at].top_logprobs)
    assert theirs in top and top[ours] - top[theirs] <= NEAR_TIE, f"the {len(prompt)}-token prompt parted at {at}"
    assert ref_logprobs[at][theirs] - ref_logprobs[at][ours] <= NEAR_TIE, f"the {len(prompt)}-token prompt parted"
    return False


SMALL_POOL = 24  # blocks of 16 tokens: the 8 requests need 59 at once
CASES = {
    "whole-prompts": ({}, {}),
    "chunk-7": (dict(chunk_size=7), {}),
    "chunk-1": (dict(chunk_size=1), {}),
    "chunk-7-no-cpu-kernels": (dict(chunk_size=7), dict(cpu_kernels=False)),  # torch widens the pool's rows
    "block-32-chunk-64": (dict(chunk_size=64), dict(block_size=32)),
    "block-4": (dict(chunk_size=16), dict(block_size=4)),
    "decode-steps-4": (dict(chunk_size=32, num_decode_steps=4), {}),
    # Drafts verified in the pass of the newest token: rejected ones' keys are written, then overwritten.
    "speculative-5": (dict(chunk_size=32, num_speculative_tokens=5), {}),
    "swap-fastserve": (dict(chunk_size=32, policy="fastserve", preemption_mode="swap"), dict(pool=SMALL_POOL)),
    "recompute-sarathi": (dict(chunk_size=32, preemption_mode="recompute"), dict(pool=SMALL_POOL)),
    "swap-fastserve+sarathi-chunk-7": (dict(chunk_size=7, policy="fastserve+sarathi"), dict(pool=SMALL_POOL)),
}


# e5m2 differs from e4m3 only in the rounding: two paths suffice for it.
PARAMS = [(case, "fp8") for case in CASES] + [("chunk-7", "fp8_e5m2"), ("swap-fastserve", "fp8_e5m2")]


@pytest.mark.parametrize(("case", "kv_cache_dtype"), PARAMS)
def test_greedy_output_equals_transformers_with_a_rounding_cache(tiny_model_dir, hf, kv_cache_dtype, case):
    sched, engine_kwargs = CASES[case]
    engine_kwargs = dict(engine_kwargs)
    pool = engine_kwargs.pop("pool", None)
    if pool is not None:
        probe = _engine(tiny_model_dir, kv_cache_dtype, kv_cache_bytes=1 << 20).runner.layout.bytes_per_block
        engine_kwargs.update(kv_cache_bytes=pool * probe, swap_bytes=200 * probe)
    engine = _engine(tiny_model_dir, kv_cache_dtype, SchedulerConfig(**sched), **engine_kwargs)
    prompts = _prompts()
    got = engine.generate(prompts, [GREEDY] * len(prompts))
    if pool is not None:
        assert sum(engine.scheduler.preemptions.values()) > 0
    same = [_agrees(p, comp, hf(p, MAX_TOKENS, kv_cache_dtype)) for p, comp in zip(prompts, got, strict=True)]
    assert sum(same) >= len(prompts) - 1
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_next_turns_from_the_prefix_cache_equal_transformers(tiny_model_dir, hf):
    """A next turn reuses its last turn's full blocks and its partly filled last one (as rounded float8 bytes):
    the same tokens as a cache that rounded them as the turn computes them."""
    engine = _engine(tiny_model_dir, "fp8", SchedulerConfig(chunk_size=16))
    prompts = _prompts([20, 45, 70], seed=9)
    first = engine.generate(prompts, [GREEDY] * len(prompts))
    turns = [p + c.token_ids + [101, 102, 103] for p, c in zip(prompts, first, strict=True)]
    second = engine.generate(turns, [GREEDY] * len(turns))
    same = [_agrees(p, comp, hf(p, MAX_TOKENS, "fp8")) for p, comp in zip(prompts + turns, first + second,
                                                                         strict=True)]
    assert sum(same) >= len(same) - 1
    assert all(c.num_cached_prompt_tokens >= len(p) for p, c in zip(prompts, second, strict=True))
    assert engine.scheduler.prefix_stats.tail_tokens > 0



@pytest.mark.parametrize("fixture", ["windowed_model_dir", "hybrid_model_dir"])
def test_sliding_windows_and_linear_attention_layers_equal_transformers(request, fixture):
    """A sliding-window model (its blocks behind the window freed as chunks pass) and a hybrid (attention layers
    beside Gated DeltaNet states, which stay in the model's dtype): the rounding touches the attention layers'
    keys and values only, as the oracle's cache does."""
    model_dir = request.getfixturevalue(fixture)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = _engine(model_dir, "fp8", SchedulerConfig(chunk_size=16))
    prompts = _prompts([9, 41, 90, 200], seed=10)
    got = engine.generate(prompts, [GREEDY] * len(prompts))
    same = []
    for prompt, comp in zip(prompts, got, strict=True):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0,
                                 output_logits=True, return_dict_in_generate=True,
                                 cache=rounding_cache("fp8")(config=model.config))
        ids = out.sequences[0, len(prompt):].tolist()
        cut = next((i + 1 for i, t in enumerate(ids) if t in engine.checkpoint.eos_token_ids), len(ids))
        same.append(_agrees(prompt, comp, (ids[:cut], [torch.log_softmax(x[0], -1) for x in out.logits[:cut]])))
    assert sum(same) >= len(prompts) - 1


def test_beam_search_equals_transformers_with_a_rounding_cache(tiny_model_dir):
    """Beams fork and copy partly filled float8 blocks (tail_blocks.py): the hypotheses equal transformers'
    generate(num_beams=4) with a rounding cache token for token; scores to 2e-3 (the rounding turns the
    logits' last-bit differences into ~1e-3 of a score, as it tips near-ties above)."""
    from services.common.beam_search import BeamParams
    from tests.beam_oracle import assert_beams_match, hf_beams

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    generate = model.generate
    model.generate = lambda *args, **kwargs: generate(*args, cache=rounding_cache("fp8")(), **kwargs)
    engine = _engine(tiny_model_dir, "fp8", SchedulerConfig(chunk_size=16))
    for prompt in _prompts([5, 30, 70], seed=3):
        beam = BeamParams(4, 12, end_token_ids=tuple(engine.checkpoint.eos_token_ids))
        assert_beams_match(engine.beam_search(prompt, beam), hf_beams(model, prompt, beam), rel=2e-3)

def _with_kv_scales(src, out, scales: dict[int, tuple[float, float]]):
    """``src``'s checkpoint as llm-compressor writes an FP8 one with an FP8 KV cache: FP8 weights per channel,
    ``kv_cache_scheme``, and each attention layer's calibrated ``self_attn.k_scale`` / ``v_scale``."""
    import json

    from safetensors.torch import load_file, save_file

    from tests.engine.test_fp8 import compressed_tensors_config, write_fp8

    config = compressed_tensors_config("channel")
    config["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                 "symmetric": True}
    path = write_fp8(src, out, config, "channel", "weight_scale")
    tensors = load_file(str(path / "model.safetensors"))
    for layer, (k, v) in scales.items():
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(k)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor([v])  # either shape, as checkpoints have
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == len(scales)
    return path


def test_a_checkpoints_calibrated_kv_scales_divide_what_a_float8_pool_stores(tiny_model_dir, tmp_path):
    """llm-compressor's FP8 KV cache (kv_cache_scheme, a key and a value scale per layer): a float8 pool stores
    k / k_scale and reads it back times k_scale, as transformers with such a rounding cache computes; an
    unquantized pool ignores the scales, as vLLM does, and equals transformers (which ignores them too)."""
    pytest.importorskip("compressed_tensors")
    from tests.engine.test_architectures import CASES, save_checkpoint

    save_checkpoint(CASES["qwen2"](), tmp_path / "bf16", tiny_model_dir)
    # Scales well below 1: the rounding is finer than scale 1's, and another than it (each layer its own).
    scales = {0: (0.031, 0.0125), 1: (0.05, 0.02), 2: (0.0625, 0.017)}
    path = _with_kv_scales(tmp_path / "bf16", tmp_path / "fp8-kv", scales)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=transformers.CompressedTensorsConfig(run_compressed=False))
    model.eval()
    prompts = _prompts([5, 40, 120], seed=12)

    def oracle(prompt, cache):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0,
                                 output_logits=True, return_dict_in_generate=True,
                                 **({"cache": cache} if cache is not None else {}))
        return out.sequences[0, len(prompt):].tolist(), [torch.log_softmax(x[0], -1) for x in out.logits]

    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=5)] * len(prompts)
    scaled = [oracle(p, rounding_cache("fp8", scales)()) for p in prompts]
    unscaled = [oracle(p, rounding_cache("fp8")())[0] for p in prompts]
    assert [ids for ids, _ in scaled] != unscaled  # else the test could not tell the scales were applied
    for kernels in (True, False):
        engine = _engine(path, "fp8", SchedulerConfig(chunk_size=16), cpu_kernels=kernels)
        assert [m.kv_scale for m in engine.runner.model.modules() if hasattr(m, "kv_scale")] == [
            pytest.approx(s, rel=1e-6) for s in scales.values()]
        got = engine.generate(prompts, params)
        same = [_agrees(p, c, ref) for p, c, ref in zip(prompts, got, scaled, strict=True)]
        assert sum(same) >= len(prompts) - 1
    plain = _engine(path, "auto", SchedulerConfig(chunk_size=16)).generate(prompts, params)
    assert [c.token_ids for c in plain] == [oracle(p, None)[0] for p in prompts]


def test_a_layer_without_its_kv_scales_or_a_bad_scale_is_refused_naming_it(tiny_model_dir, tmp_path):
    pytest.importorskip("compressed_tensors")
    from safetensors.torch import load_file, save_file

    from services.common.errors import ModelLoadError
    from tests.engine.test_architectures import CASES, save_checkpoint

    save_checkpoint(CASES["qwen2"](), tmp_path / "bf16", tiny_model_dir)
    path = _with_kv_scales(tmp_path / "bf16", tmp_path / "fp8-kv", {0: (0.1, 0.1), 1: (0.1, 0.1), 2: (0.1, 0.1)})
    file = str(path / "model.safetensors")
    tensors = load_file(file)
    del tensors["model.layers.1.self_attn.v_scale"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="layer 1's self_attn.k_scale and v_scale are not both"):
        _engine(path, "fp8")
    tensors["model.layers.1.self_attn.v_scale"] = torch.tensor(-1.0)
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="KV scale 'model.layers.1.self_attn.v_scale' must be one positive"):
        _engine(path, "auto")


@pytest.mark.parametrize("arch", ["deepseek-v3", "deepseek-v2"])
def test_latent_attention_caches_a_float8_latent_and_equals_transformers(tiny_model_dir, tmp_path, arch):
    """DeepSeek's cache holds one latent a token (the normed compressed KV and the rotated key part), which
    transformers 5 caches too: rounded alike, the tokens are the same, whole prompts or chunks."""
    from tests.engine.test_architectures import CASES, save_checkpoint

    save_checkpoint(CASES[arch](), tmp_path, tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompts = _prompts([5, 17, 40, 100], seed=21)
    eos = set(_engine(tmp_path, "auto", kv_cache_bytes=1 << 20).checkpoint.eos_token_ids)
    refs, plain = [], []
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0,
                                 output_logits=True, return_dict_in_generate=True, cache=rounding_cache("fp8")())
            unrounded = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                       pad_token_id=0)[0, len(prompt):].tolist()
        ids = out.sequences[0, len(prompt):].tolist()
        cut = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
        refs.append((ids[:cut], [torch.log_softmax(x[0], -1) for x in out.logits[:cut]]))
        plain.append(unrounded[:cut])
    assert sum(ref[0] != p for ref, p in zip(refs, plain, strict=True)) >= len(prompts) // 2
    for chunk in (16, None):
        engine = _engine(tmp_path, "fp8", SchedulerConfig(chunk_size=chunk))
        assert engine.runner.layout.num_parts == 1 and engine.runner.layout.dtype == torch.float8_e4m3fn
        got = engine.generate(prompts, [GREEDY] * len(prompts))
        assert sum(_agrees(p, c, ref) for p, c, ref in zip(prompts, got, refs, strict=True)) >= len(prompts) - 1
