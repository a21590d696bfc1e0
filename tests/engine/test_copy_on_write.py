"""A request forked mid-decode on the real engine: with copy-on-write of the partial last block, the sampled
branch writes its own KV, and the greedy parent stays token-identical to transformers. (Without the copy both
branches would write the same slots of one block, and the parent would read the child's KV.)"""

from __future__ import annotations

import pytest
import torch

from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.engine.runner import ModelRunner
from services.scheduler.core.block_manager import BlockManager
from services.scheduler.core.request import Request
from services.scheduler.core.scheduler import Scheduler, SchedulerConfig

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")


def test_both_branches_of_a_fork_match_transformers(tiny_model_dir):
    runner = ModelRunner(EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32",
                                      kv_cache_bytes=8 * 2**20, swap_bytes=0))
    core = Scheduler(SchedulerConfig(max_model_len=runner.max_model_len), BlockManager(runner.kv.num_blocks, 16))
    prompt = torch.randint(3, 4096, (21,), generator=torch.Generator().manual_seed(5)).tolist()
    greedy = SamplingParams(max_tokens=12, temperature=0)
    core.add(Request("p", prompt, greedy, 0.0))

    def step():
        plan = core.schedule()
        core.on_result(plan, runner.execute(plan))
        return plan

    for _ in range(4):  # the prompt, then 3 decodes: 24 tokens computed, the second block half full
        step()
    assert core.requests["p"].num_computed_tokens % 16
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    assert core.fork("p", Request("c", [], sampled, 0.0))
    # The child's reference: the same history recomputed from scratch, sampled with the same per-token seeds.
    history = list(core.requests["p"].output_token_ids)
    core.add(Request("ref", prompt, sampled, 0.0, output_token_ids=list(history)))
    assert step().copy  # the copy rode in the next plan
    parent, child, ref_child = core.requests["p"], core.requests["c"], core.requests["ref"]
    while core.has_work:
        step()
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)
    expected = ref[0, len(prompt):].tolist()
    assert parent.output_token_ids == expected[: len(parent.output_token_ids)]
    assert child.output_token_ids[:4] == parent.output_token_ids[:4]  # the shared history
    assert child.output_token_ids[4:] != parent.output_token_ids[4:]  # then the branches diverge
    assert child.output_token_ids == ref_child.output_token_ids  # the copied block held the right KV
