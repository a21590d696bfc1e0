"""Token-exact oracle: ``seawall run-batch`` against Hugging Face ``transformers`` on the same weights.

16 prompts of 1 to 720 tokens with different output lengths run together (continuous batching: requests
join and leave while others prefill or decode) at several chunk budgets and block sizes and under every
step policy (also when requests are preempted by swap and by recompute); every greedy token must equal what ``transformers`` generates for that prompt alone, and the reported logprobs must
equal its log-softmax to 1e-4.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from seawall.cli import main

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

transformers = pytest.importorskip("transformers")

# The engine under test runs here (fp32 everywhere); on a GPU machine: SEAWALL_TEST_DEVICE=cuda pytest -m oracle.
DEVICE = os.environ.get("SEAWALL_TEST_DEVICE", "cpu")
# A GPU's pool is sized here: by default it takes 90% of free memory, which a process beside this one may need.
KV_BYTES = None if DEVICE == "cpu" else 2**30
ENGINE_FLAGS = ["--device", DEVICE, "--dtype", "float32", *(["--kv-cache-bytes", str(KV_BYTES)] if KV_BYTES else [])]

PROMPT_LENS = [1, 2, 3, 5, 8, 13, 16, 17, 31, 33, 64, 100, 150, 257, 400, 720]
TOP_N = 5


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _max_tokens(i: int) -> int:
    return 3 + (i * 5) % 11  # 3..13: requests finish at different steps


def _hf_reference(model_dir, prompts, max_tokens=None):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    refs = []
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens or _max_tokens(i), do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            ids = out.sequences[0, len(prompt):].tolist()
            logprobs = [torch.log_softmax(step[0].float(), -1) for step in out.logits]
            cut = next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))
            refs.append((ids[:cut], logprobs[:cut]))
    return refs


@pytest.fixture(scope="module", params=["tiny", "second"])
def oracle_case(request, tiny_model_dir, second_model_dir):
    model_dir = tiny_model_dir if request.param == "tiny" else second_model_dir
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    prompts = _prompts(vocab)
    return model_dir, prompts, _hf_reference(model_dir, prompts)


def _run_batch(tmp_path, model_dir, prompts, *flags):
    src = tmp_path / "in.jsonl"
    dst = tmp_path / "out.jsonl"
    lines = [
        {"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": p, "max_tokens": _max_tokens(i), "temperature": 0, "logprobs": TOP_N}}
        for i, p in enumerate(prompts)
    ]
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["run-batch", "-i", str(src), "-o", str(dst), "--model", str(model_dir), *ENGINE_FLAGS,
                 *flags]) == 0
    return [json.loads(line) for line in dst.read_text().splitlines()]


# Chunks of one token run the 16 prompts in ~1,800 steps (a minute in CI per case): one block size only.
CASES = [(1, 16, "sarathi")]
CASES += [(chunk, block, "sarathi") for chunk in (7, 16, 64, None) for block in (16, 32)]
CASES += [(None, 16, "vllm")]


@pytest.mark.parametrize(("chunk_size", "block_size", "policy"), CASES)
def test_greedy_tokens_and_logprobs_match_transformers(tmp_path, oracle_case, chunk_size, block_size, policy):
    model_dir, prompts, refs = oracle_case
    flags = ["--block-size", str(block_size), "--policy", policy]
    flags += ["--chunk-size", str(chunk_size)] if chunk_size else []
    _assert_matches(_run_batch(tmp_path, model_dir, prompts, *flags), refs)


# The other policies. --max-num-seqs 3 leaves most of the 16 requests out of each step, so the MLFQ's order,
# demotions and starvation promotions (on the logical clock) decide who runs and who idles with its KV;
# --tbt-target-s 0.0215 derives a budget of 10 tokens per step from the default step-time model.
POLICY_CASES = {
    "fcfs": ["--policy", "fcfs"],
    "fastserve": ["--policy", "fastserve"],
    "fastserve-3-seqs-block32-paper": ["--policy", "fastserve", "--max-num-seqs", "3", "--block-size", "32",
                                       "--mlfq", "paper"],
    "fastserve+sarathi-chunk7": ["--policy", "fastserve+sarathi", "--chunk-size", "7"],
    "fastserve+sarathi-tau-3-seqs-code": ["--policy", "fastserve+sarathi", "--tbt-target-s", "0.0215",
                                          "--max-num-seqs", "3", "--mlfq", "released-code"],
    "sarathi-tau": ["--policy", "sarathi", "--tbt-target-s", "0.0215"],
    # run-batch decodes up to 8 passes per step by default (multi-step decoding): once all 16 are admitted,
    # decodes are fed their own samples, and requests that stop mid-way drop what they sampled past the stop.
    # One pass per step, and other step counts:
    "sarathi-one-pass": ["--policy", "sarathi", "--decode-steps", "1"],
    "sarathi-chunk16-decode-steps-4": ["--policy", "sarathi", "--chunk-size", "16", "--decode-steps", "4"],
    "fastserve-3-seqs-decode-steps-3": ["--policy", "fastserve", "--max-num-seqs", "3", "--decode-steps", "3"],
    # The cases above run the fused C kernels on the CPU (when a compiler is present); these run the plain
    # torch ops (gather + SDPA attention, torch norms and RoPE) that CUDA and compiler-less machines use.
    "sarathi-chunk7-torch-ops": ["--chunk-size", "7", "--no-cpu-kernels"],
    "sarathi-block32-torch-ops": ["--block-size", "32", "--no-cpu-kernels"],
}


@pytest.mark.parametrize("case", POLICY_CASES)
def test_every_policy_keeps_greedy_output_identical(tmp_path, oracle_case, case):
    model_dir, prompts, refs = oracle_case
    _assert_matches(_run_batch(tmp_path, model_dir, prompts, *POLICY_CASES[case]), refs)


def _assert_matches(results, refs):
    assert [r["custom_id"] for r in results] == [f"p{i}" for i in range(len(refs))]
    for i, (result, (ref_ids, ref_logprobs)) in enumerate(zip(results, refs, strict=True)):
        assert result["response"]["status_code"] == 200, result
        choice = result["response"]["body"]["choices"][0]
        assert choice["token_ids"] == ref_ids, f"prompt {i} ({PROMPT_LENS[i]} tokens) diverged"
        got = choice["logprobs"]
        for step, ref in enumerate(ref_logprobs):
            top = torch.topk(ref, TOP_N)
            got_ids = [tid for tid, _ in got["top_logprobs_ids"][step]]
            got_lps = torch.tensor([lp for _, lp in got["top_logprobs_ids"][step]])
            assert got_ids[0] == top.indices[0].item()
            torch.testing.assert_close(got_lps, top.values, atol=1e-4, rtol=0)
            assert abs(got["token_logprobs"][step] - ref[ref_ids[step]].item()) < 1e-4


@pytest.mark.parametrize("chunk_size", [7, None])
def test_prefix_cache_hits_match_transformers(tiny_model_dir, chunk_size):
    """Prompts sharing a 300-token prefix: a first batch fills the cache, a second one is served from it."""
    from seawall.offline.engine import OfflineEngine
    from services.common.sampling_params import SamplingParams
    from services.engine.config import EngineConfig
    from services.scheduler.core.scheduler import SchedulerConfig

    g = torch.Generator().manual_seed(99)
    prefix = torch.randint(0, 4096, (300,), generator=g).tolist()
    # Suffix lengths cover: none (the prompt is the prefix), a block boundary (300 + 20 = 320), and ragged.
    second = [prefix + torch.randint(0, 4096, (n,), generator=g).tolist() for n in (0, 1, 20, 37, 150)]
    first = [prefix + [5, 6, 7]]
    refs = _hf_reference(tiny_model_dir, second)
    engine = OfflineEngine(EngineConfig(model=str(tiny_model_dir), device=DEVICE, dtype="float32",
                                        kv_cache_bytes=KV_BYTES), SchedulerConfig(chunk_size=chunk_size))
    params = [SamplingParams(max_tokens=_max_tokens(i), temperature=0) for i in range(len(second))]
    engine.generate(first, params[:1])
    got = engine.generate(second, params)
    for comp, (ref_ids, _) in zip(got, refs, strict=True):
        assert comp.token_ids == ref_ids
    # 300 tokens = 18 full blocks of 16 are cached; the prompt equal to the prefix must still compute a token.
    assert [c.num_cached_prompt_tokens for c in got] == [288, 288, 288, 288, 288]


@pytest.fixture(scope="module")
def preemption_case(tiny_model_dir):
    """8 requests growing to ~8 blocks each, their transformers reference, and the bytes of one KV block."""
    from seawall.offline.engine import OfflineEngine
    from services.engine.config import EngineConfig

    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 4096, (40 + 9 * i,), generator=g).tolist() for i in range(8)]
    refs = _hf_reference(tiny_model_dir, prompts, max_tokens=30)
    probe = OfflineEngine(EngineConfig(model=str(tiny_model_dir), kv_cache_bytes=1 << 20, device=DEVICE,
                                       dtype="float32"))
    return prompts, refs, probe.runner.layout.bytes_per_block


@pytest.mark.parametrize("policy", ["sarathi", "fcfs", "fastserve", "fastserve+sarathi"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_matches_transformers(tiny_model_dir, preemption_case, mode, policy):
    """The 8 requests in a pool of 24 blocks: requests are preempted (by swap or by recompute) and resumed,
    and every greedy token still equals transformers'."""
    from seawall.offline.engine import OfflineEngine
    from services.common.sampling_params import SamplingParams
    from services.engine.config import EngineConfig
    from services.scheduler.core.scheduler import SchedulerConfig

    prompts, refs, block_bytes = preemption_case
    engine = OfflineEngine(
        EngineConfig(model=str(tiny_model_dir), kv_cache_bytes=24 * block_bytes, swap_bytes=200 * block_bytes,
                     device=DEVICE, dtype="float32"),
        SchedulerConfig(chunk_size=32, preemption_mode=mode, policy=policy),
    )
    got = engine.generate(prompts, [SamplingParams(max_tokens=30, temperature=0)] * len(prompts))
    assert engine.scheduler.preemptions[mode] > 0
    for i, (comp, (ref_ids, _)) in enumerate(zip(got, refs, strict=True)):
        assert comp.token_ids == ref_ids, f"prompt {i} diverged after preemption"
    assert engine.blocks.num_free == engine.blocks.num_blocks
