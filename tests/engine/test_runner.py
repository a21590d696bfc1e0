"""The model runner driven by hand-built step plans: swaps, copies, seeded sampling, bad plans."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.common.errors import InvalidArgument
from services.common.sampling_params import SamplingParams
from services.common.step import ContinuingSequence, NewSequence, StepPlan
from services.engine.config import EngineConfig
from services.engine.runner import ModelRunner

BLOCK = 16
GREEDY = SamplingParams(max_tokens=64, temperature=0)


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(EngineConfig(model=str(tiny_model_dir), block_size=BLOCK, kv_cache_bytes=8 << 20,
                                    swap_bytes=2 << 20))


def _prompt(n: int, offset: int = 0) -> list[int]:
    return [(7 * i + 3 + offset) % 4000 + 10 for i in range(n)]


class Driver:
    """Runs one sequence step by step on a runner, handing out step ids."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.step = 0

    def run(self, plan_kwargs: dict) -> dict:
        self.step += 1
        sampled = self.runner.execute(StepPlan(self.step, **plan_kwargs)).sampled
        return {sid: [t.token_id for t in tokens] for sid, tokens in sampled.items()}

    def generate(self, seq_id, prompt, blocks, steps, params=GREEDY) -> list[int]:
        out = [self.run({"new": [NewSequence(seq_id, prompt, len(prompt), 0, blocks, params)],
                         "num_scheduled_tokens": {seq_id: len(prompt)}})[seq_id][0]]
        for _ in range(steps - 1):
            out.append(self.run({"num_scheduled_tokens": {seq_id: 1}})[seq_id][0])
        return out


def test_swap_out_and_in_to_other_blocks_leaves_output_unchanged(runner):
    d = Driver(runner)
    prompt = _prompt(40)
    reference = d.generate("ref", prompt, [0, 1, 2, 3], 12)
    d.run({"finished": ["ref"]})

    first = d.generate("s", prompt, [10, 11, 12, 13], 5)
    d.run({"swap_out": [(10, 0), (11, 1), (12, 2), (13, 3)]})
    # Another sequence overwrites the freed device blocks while "s" sits in host memory.
    d.generate("other", _prompt(60, 99), [10, 11, 12, 13], 1)
    d.run({"finished": ["other"], "swap_in": [(0, 20), (1, 21), (2, 22), (3, 23)],
           "continuing": [ContinuingSequence("s", [], block_ids=[20, 21, 22, 23])]})
    rest = [d.run({"num_scheduled_tokens": {"s": 1}})["s"][0] for _ in range(7)]
    assert first + rest == reference


def test_copied_blocks_continue_identically(runner):
    d = Driver(runner)
    prompt = _prompt(35, 5)
    reference = d.generate("ref", prompt, [0, 1, 2], 9)
    d.run({"finished": ["ref"]})
    first = d.generate("c", prompt, [30, 31, 32], 4)
    d.run({"copy": [(30, 40), (31, 41), (32, 42)],
           "continuing": [ContinuingSequence("c", [], block_ids=[40, 41, 42])]})
    d.generate("clobber", _prompt(48, 17), [30, 31, 32], 1)
    rest = [d.run({"num_scheduled_tokens": {"c": 1}})["c"][0] for _ in range(5)]
    assert first + rest == reference


def test_seeded_sampling_is_independent_of_batch_composition(runner):
    params = SamplingParams(max_tokens=64, temperature=0.9, top_p=0.95, seed=42)
    d = Driver(runner)
    alone = d.generate("a", _prompt(20), [0, 1], 10, params)
    d.run({"finished": ["a"]})
    # Same request again, now batched with two others that sample from the same generator family.
    new = [NewSequence("a", _prompt(20), 20, 0, [0, 1], params),
           NewSequence("b", _prompt(30, 1), 30, 0, [2, 3, 5], SamplingParams(temperature=1.0, seed=7)),
           NewSequence("c", _prompt(9, 2), 9, 0, [4, 6], SamplingParams(temperature=1.3))]
    got = [d.run({"new": new, "num_scheduled_tokens": {"a": 20, "b": 30, "c": 9}})["a"][0]]
    for _ in range(9):
        got.append(d.run({"num_scheduled_tokens": {"a": 1, "b": 1, "c": 1}})["a"][0])
    assert got == alone
    d.run({"finished": ["a", "b", "c"]})


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(max_tokens=64, temperature=0.9, top_k=40, seed=3)],
                         ids=["greedy", "seeded"])
def test_multi_step_plans_sample_what_single_steps_do(runner, params):
    d = Driver(runner)
    reference = {sid: d.generate(sid, _prompt(n, i), blocks, 12, params)
                 for i, (sid, n, blocks) in enumerate([("a", 20, [0, 1]), ("b", 9, [2, 3])])}
    d.run({"finished": ["a", "b"]})
    # The prompt of "a" plus 3 decode passes fed its own samples, beside 9 prompt tokens of "b" that sample once.
    new = [NewSequence("a", _prompt(20, 0), 20, 0, [0, 1], params), NewSequence("b", _prompt(9, 1), 9, 0, [2], params)]
    first = d.run({"new": new, "num_scheduled_tokens": {"a": 23, "b": 9}})
    assert first == {"a": reference["a"][:4], "b": reference["b"][:1]}
    # Decodes of different lengths in one plan: passes go on while either has tokens left.
    second = d.run({"num_scheduled_tokens": {"a": 8, "b": 3}, "continuing": [ContinuingSequence("b", [3])]})
    assert second == {"a": reference["a"][4:12], "b": reference["b"][1:4]}
    d.run({"finished": ["a", "b"]})


def test_a_sequence_whose_constraints_leave_no_token_fails_alone_and_is_kept_until_finished(runner):
    d = Driver(runner)
    a = runner.checkpoint.tokenizer.encode("a").ids
    assert len(a) == 1
    # "a" is all the grammar allows first, then only end-of-sequence, which allowed_token_ids rules out.
    stuck = SamplingParams(max_tokens=8, temperature=0, structured_output=("regex", "a"), allowed_token_ids=tuple(a))
    reference = d.generate("ok", _prompt(12), [0], 4)
    d.run({"finished": ["ok"]})
    new = [NewSequence("ok", _prompt(12), 12, 0, [0], GREEDY), NewSequence("stuck", _prompt(9, 1), 9, 0, [1], stuck)]
    step = runner.execute(StepPlan(100, new=new, num_scheduled_tokens={"ok": 15, "stuck": 12}))
    # Each ran the prompt and sampled; "stuck" sampled "a", then failed: its further passes did not run.
    assert {sid: [t.token_id for t in tokens] for sid, tokens in step.sampled.items()} == {"ok": reference,
                                                                                          "stuck": a}
    assert list(step.errors) == ["stuck"] and isinstance(step.errors["stuck"], InvalidArgument)
    assert str(step.errors["stuck"]).startswith("no token satisfies the structured output (regex) and "
                                                "allowed_token_ids (1 tokens) at output token 2")
    # A plan sent before the scheduler heard of it still names it: it is reported again, the rest runs.
    again = runner.execute(StepPlan(101, num_scheduled_tokens={"ok": 1, "stuck": 1}))
    assert list(again.sampled) == ["ok"] and list(again.errors) == ["stuck"]
    runner.execute(StepPlan(102, finished=["ok", "stuck"]))
    assert "stuck" not in runner.seqs


def test_plans_that_overrun_known_tokens_or_blocks_are_rejected(runner):
    d = Driver(runner)
    with pytest.raises(ValueError, match="no room for 12 more"):  # past its known tokens: one block holds 16
        d.run({"new": [NewSequence("x", _prompt(5), 5, 0, [0], GREEDY)], "num_scheduled_tokens": {"x": 17}})
    with pytest.raises(ValueError, match="need 2 blocks"):
        d.run({"new": [NewSequence("y", _prompt(20), 20, 0, [0], GREEDY)], "num_scheduled_tokens": {"y": 20}})
    with pytest.raises(KeyError, match="does not hold"):
        d.run({"num_scheduled_tokens": {"nobody": 1}})
    with pytest.raises(InvalidArgument, match="context"):
        d.run({"new": [NewSequence("z", [1] * 5000, 5000, 0, [], GREEDY)]})
    d.run({"finished": ["x", "y"]})


@pytest.mark.parametrize("chunk", [7, 16, 40])
def test_prompt_logprobs_match_transformers_whatever_the_chunks(runner, tiny_model_dir, chunk):
    transformers = pytest.importorskip("transformers")
    import torch

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt = _prompt(40, 3)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), -1)
    params = SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=2)
    d = Driver(runner)
    scored = {}
    new = [NewSequence("p", prompt, len(prompt), 0, [50, 51, 52], params),
           NewSequence("plain", _prompt(20, 9), 20, 0, [53, 54], GREEDY)]  # in the same batch, scores nothing
    done = 0
    while done < len(prompt):
        n = min(chunk, len(prompt) - done)
        d.step += 1
        counts = {"p": n, **({"plain": 20} if new else {})}
        result = runner.execute(StepPlan(d.step, new=new, num_scheduled_tokens=counts))
        assert set(result.prompt_logprobs) <= {"p"}
        if "p" in result.prompt_logprobs:
            start, tokens = result.prompt_logprobs["p"]
            scored.update({start + i: t for i, t in enumerate(tokens)})
        new, done = [], done + n
    runner.execute(StepPlan(d.step + 1, finished=["p", "plain"]))
    assert sorted(scored) == list(range(1, len(prompt)))  # every prompt token but the first, once
    for pos, tok in scored.items():
        assert tok.token_id == prompt[pos]
        assert abs(tok.logprob - ref[pos - 1, prompt[pos]].item()) < 1e-4
        assert tok.rank == int((ref[pos - 1] > ref[pos - 1, prompt[pos]]).sum()) + 1
        top = torch.topk(ref[pos - 1], 2)
        assert [t for t, _ in tok.top_logprobs] == top.indices.tolist()


def test_loading_a_model_does_not_import_torch_dynamo(tiny_model_dir):
    """Building the model on the meta device once ran two ops (the embedding's init, the RoPE frequencies)
    through torch._refs, whose first use imports torch._dynamo: ~3 s of every worker's start-up on 2 cores."""
    code = ("import sys; from services.engine.runner import ModelRunner; from services.engine.config import "
            f"EngineConfig; ModelRunner(EngineConfig(model={str(tiny_model_dir)!r})); "
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
