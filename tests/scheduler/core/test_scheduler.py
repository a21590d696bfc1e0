"""The scheduler core driven with plain data: hand-built step results, no model."""

from __future__ import annotations

import pytest

from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken, StepResult
from services.scheduler.core.block_manager import BlockManager
from services.scheduler.core.policies import POLICY_CLASSES
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.core.scheduler import POLICIES, Scheduler, SchedulerConfig
from services.scheduler.core.step_time import StepTimeModel

EOS = 0


def create_scheduler(num_blocks=64, block_size=4, num_host_blocks=0, **overrides) -> Scheduler:
    host = BlockManager(num_host_blocks, block_size) if num_host_blocks else None
    window = overrides.get("sliding_window") is not None  # the pool then reserves the null block
    return Scheduler(SchedulerConfig(**overrides), BlockManager(num_blocks, block_size, reserve_null=window), host)


def create_requests(n, prompt_len=10, max_tokens=5, start=0, shared_prefix=0) -> list[Request]:
    """``n`` requests with distinct prompts, whose first ``shared_prefix`` tokens are the same."""
    return [Request(f"r{start + i}", [1] * shared_prefix + [100 * (start + i + 1) + t for t in range(prompt_len - shared_prefix)],
                    SamplingParams(max_tokens=max_tokens), arrival_time=float(start + i), eos_token_ids=(EOS,))
            for i in range(n)]


def step(s: Scheduler, token: int = 7, now: float | None = None):
    """One step (starting at ``now``, or on the logical clock) where every sampled sequence gets ``token``."""
    plan = s.schedule(now)
    known = {r.request_id: r.num_tokens for r in s.running}
    result = StepResult(plan.step_id)
    for rid, n in plan.num_scheduled_tokens.items():
        # What a worker samples (step.py): one token at the end of the known ones, one more per pass past it.
        if (k := s.requests[rid].num_computed_tokens + n - known[rid] + 1) > 0:
            result.sampled[rid] = [SampledToken(token)] * k
    events = s.on_result(plan, result)
    s.check_integrity()
    return plan, events


def test_decodes_run_first_and_prompts_are_chunked_within_the_budget():
    s = create_scheduler(chunk_size=8)
    for r in create_requests(2, prompt_len=10):
        s.add(r)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 8}
    plan, events = step(s)
    assert plan.num_scheduled_tokens == {"r0": 2, "r1": 6}  # r0's last chunk, then r1 starts
    assert [e.request_id for e in events] == ["r0"]
    plan, _ = step(s)
    assert list(plan.num_scheduled_tokens.items()) == [("r0", 1), ("r1", 4)]  # decode first


def test_first_sight_is_full_then_only_deltas():
    s = create_scheduler(chunk_size=8)
    s.add(create_requests(1, prompt_len=10)[0])
    plan, _ = step(s)
    assert [n.seq_id for n in plan.new] == ["r0"] and plan.new[0].block_ids == [0, 1]
    plan, _ = step(s)
    assert not plan.new and plan.continuing[0].new_block_ids == [2]
    # Decodes with room left in their last block: the sequence runs, with nothing else to tell the worker.
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 1} and not plan.new and not plan.continuing


def test_finish_by_length_and_eos_frees_blocks():
    s = create_scheduler()
    r = create_requests(1, max_tokens=3)[0]
    s.add(r)
    for _ in range(3):
        _, events = step(s)
    assert events[-1].finish_reason == "length" and r.status is RequestStatus.FINISHED
    assert s.blocks.num_free == s.blocks.num_blocks
    s.add(create_requests(1, start=1)[0])
    _, events = step(s, token=EOS)
    assert events[0].finish_reason == "stop"
    plan = s.schedule()
    assert plan.finished == ["r1"]  # the worker is told to drop it


def test_block_pressure_preempts_the_newest_for_recompute():
    s = create_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    a, b = create_requests(2, prompt_len=8, max_tokens=20)
    s.add(a)
    s.add(b)
    step(s)  # both prefill: 2 blocks each; decodes then need a 3rd and a 4th block
    dropped, preempted = [], []
    for _ in range(6):
        plan, _ = step(s)
        dropped += plan.finished
        preempted += s.preempted_in_plan
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    assert "r1" in dropped  # the worker was told to drop the preempted sequence's KV
    assert preempted == ["r1"] * b.num_preemptions  # what the last plan preempted, for the mesh's log


def test_abort_releases_blocks_and_tells_the_worker():
    s = create_scheduler()
    r = create_requests(1)[0]
    s.add(r)
    step(s)
    s.finish("r0")
    assert s.blocks.num_free == s.blocks.num_blocks
    assert s.schedule().finished == ["r0"]


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="chunk_size"):
        SchedulerConfig(chunk_size=0)


@pytest.mark.parametrize("recurrent", [False, True], ids=["kv", "recurrent"])
def test_swap_preemption_copies_kv_out_and_back_in_and_keeps_progress(recurrent):
    # Each request grows to 20 tokens (5 blocks); together they need 10 of the 8 blocks.
    s = create_scheduler(num_blocks=8, block_size=4, num_host_blocks=8, preemption_mode="swap",
                         recurrent_state=recurrent)
    a, b = create_requests(2, prompt_len=8, max_tokens=12)
    s.add(a)
    s.add(b)
    step(s)
    outs, ins, dropped, swapped = [], [], [], []
    for _ in range(60):
        if not s.has_work:
            break
        plan, _ = step(s)
        outs += plan.swap_out
        ins += plan.swap_in
        dropped += plan.finished
        swapped += plan.swapped_out
        if plan.swapped_out:  # a recurrent model's worker moves the state out with the blocks
            assert {s.requests[rid].status for rid in plan.swapped_out} == {RequestStatus.SWAPPED}
        if plan.swap_in:
            resumed = [c for c in plan.continuing if c.block_ids is not None]
            assert all(c.block_ids == s.requests[c.seq_id].block_ids for c in resumed if c.seq_id in s.requests)
    assert outs and ins and len(outs) == len(ins)
    assert swapped == (["r1"] * b.num_preemptions if recurrent else [])
    dropped += s.schedule().finished  # the plan after the last step drops the last finisher
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    assert dropped == ["r0", "r1"]  # the worker dropped each only once it had finished: swapped, never dropped
    assert a.status is b.status is RequestStatus.FINISHED and len(b.output_token_ids) == 12
    assert s.blocks.num_free == 8 and s.host_blocks.num_free == 8


def test_swap_falls_back_to_recompute_when_the_host_pool_is_full():
    s = create_scheduler(num_blocks=6, block_size=4, num_host_blocks=1, preemption_mode="swap")
    a, b = create_requests(2, prompt_len=8, max_tokens=12)
    s.add(a)
    s.add(b)
    dropped = []
    while s.has_work:
        plan, _ = step(s)
        dropped += plan.finished
        assert not plan.swap_out
    assert "r1" in dropped and b.num_preemptions >= 1


def test_a_shared_prefix_is_served_from_the_cache_after_it_is_computed():
    s = create_scheduler(block_size=4, chunk_size=64)
    first, second = create_requests(2, prompt_len=14, shared_prefix=9)
    s.add(first)
    step(s)  # computes 14 tokens: blocks 0 and 1 (tokens 0..7) are full and shared-prefix only
    s.add(second)
    plan, _ = step(s)
    new = {n.seq_id: n for n in plan.new}
    assert new["r1"].num_computed_tokens == 8 and new["r1"].block_ids[:2] == first.block_ids[:2]
    assert plan.num_scheduled_tokens["r1"] == 6
    assert s.prefix_stats.hit_blocks == 2 and second.num_prefix_hit_tokens == 8


def test_finished_requests_leave_their_blocks_cached_until_evicted():
    s = create_scheduler(num_blocks=8, block_size=4)
    a = create_requests(1, prompt_len=9, max_tokens=1)[0]
    s.add(a)
    step(s)
    assert a.status is RequestStatus.FINISHED and s.blocks.num_cached == 3  # two full blocks, the partly filled last
    again = Request("again", a.prompt_token_ids, SamplingParams(max_tokens=1), 1.0)
    s.add(again)
    plan, _ = step(s)
    assert plan.new[0].num_computed_tokens == 8  # two full blocks reused, one token computed
    assert s.blocks.num_free == 8


def test_a_request_scoring_its_prompt_computes_it_all_though_its_blocks_are_cached():
    s = create_scheduler(num_blocks=8, block_size=4)
    a = create_requests(1, prompt_len=9, max_tokens=1)[0]
    s.add(a)
    step(s)
    scored = Request("scored", a.prompt_token_ids, SamplingParams(max_tokens=1, prompt_logprobs=0), 1.0)
    s.add(scored)
    plan, _ = step(s)
    assert plan.new[0].num_computed_tokens == 0 and plan.num_scheduled_tokens["scored"] == 9
    assert scored.num_prefix_hit_tokens == 0


def test_a_fully_cached_prompt_still_computes_its_last_token():
    s = create_scheduler(block_size=4)
    a = create_requests(1, prompt_len=8, max_tokens=1)[0]
    s.add(a)
    step(s)
    s.add(Request("b", a.prompt_token_ids, SamplingParams(max_tokens=1), 1.0))
    plan, _ = step(s)
    assert plan.new[0].num_computed_tokens == 4 and plan.num_scheduled_tokens["b"] == 4


def test_a_running_prompt_short_of_blocks_preempts_a_newer_request():
    s = create_scheduler(num_blocks=4, block_size=4, chunk_size=8, enable_prefix_caching=False)
    old, new, newest = create_requests(3, prompt_len=12, max_tokens=8)
    for r in (old, new, newest):
        s.add(r)
    # A state block pressure leads to: old prefilling (4 of 12 computed, 1 block), new waiting for a
    # recompute, newest running a prompt chunk with the other 3 blocks.
    s.waiting.clear()
    for r, computed, blocks in ((old, 4, 1), (newest, 8, 3)):
        r.block_ids = s.blocks.allocate(blocks)
        r.num_computed_tokens = computed
        r.status = RequestStatus.RUNNING
        s.running.append(r)
        s._on_worker.add(r.request_id)
        s._sent_blocks[r.request_id] = blocks
    s.waiting.append(new)
    plan = s.schedule()
    assert plan.num_scheduled_tokens == {"r0": 8}  # newest gave way to the older prompt
    assert newest.status is RequestStatus.WAITING and "r2" in plan.finished
    s.check_integrity()


def test_vllm_policy_runs_whole_prompts_first_and_stalls_decodes_meanwhile():
    s = create_scheduler(policy="vllm", chunk_size=4)  # chunk_size is ignored: prompts run whole
    a, b = create_requests(2, prompt_len=10, max_tokens=5)
    s.add(a)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 10}
    s.add(b)
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r1": 10}  # prefill-only step: r0's decode waits
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"r0": 1, "r1": 1}  # no prompt waiting: decode-only step


def test_vllm_policy_does_not_chunk_a_prompt_larger_than_the_token_budget():
    s = create_scheduler(policy="vllm", max_num_batched_tokens=8)
    s.add(create_requests(1, prompt_len=10)[0])
    assert s.schedule().num_scheduled_tokens == {}


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="sarathi, vllm, fcfs, fastserve, fastserve\\+sarathi"):
        SchedulerConfig(policy="lifo")


def test_policies_come_from_the_registry_and_pick_their_preemption_mode():
    assert POLICIES == tuple(POLICY_CLASSES) == ("sarathi", "vllm", "fcfs", "fastserve", "fastserve+sarathi")
    for name in POLICIES:
        s = create_scheduler(policy=name)
        assert s.policy.name == name
        assert s.preemption_mode == ("swap" if name.startswith("fastserve") else "recompute")
    assert create_scheduler(policy="fastserve", preemption_mode="recompute").preemption_mode == "recompute"


def test_the_logical_clock_advances_by_the_modeled_step_and_time_never_goes_back():
    s = create_scheduler(step_time=StepTimeModel(base_s=0.01, per_token_s=0.001, tile_tokens=1))
    s.add(create_requests(1, prompt_len=10)[0])
    step(s)
    assert s.now == 0.0
    step(s)  # the first step ran 10 prompt tokens
    assert s.now == pytest.approx(0.02)
    step(s, now=5.0)
    assert s.now == 5.0
    with pytest.raises(ValueError, match="monotonic"):
        s.schedule(now=4.0)


def test_queue_lengths_count_requests_not_in_the_latest_plan():
    s = create_scheduler(max_num_seqs=2)
    for r in create_requests(3):
        s.add(r)
    assert s.queue_lengths() == [3]
    step(s)
    assert s.queue_lengths() == [1]


def test_samples_tells_whether_a_plan_needs_its_result_before_the_next_one():
    s = create_scheduler(chunk_size=4, policy="sarathi")
    s.add(create_requests(1, prompt_len=10)[0])
    plans = []
    while len(plans) < 5:
        plan = s.schedule()
        plans.append((plan, s.samples(plan), s.samples_a_decode(plan)))
        if not s.samples(plan):
            # Known outcome: applied when sent, and the next plan is made at once (the mesh's pipelining).
            assert s.on_result(plan, StepResult(plan.step_id)) == []
            s.check_integrity()
            continue
        result = StepResult(plan.step_id)
        for rid, n in plan.num_scheduled_tokens.items():
            req = s.requests[rid]
            if req.num_computed_tokens + n == req.num_tokens:
                result.sampled[rid] = [SampledToken(7)]
        s.on_result(plan, result)
        s.check_integrity()
    # 10-token prompts at 4 tokens a step: chunks 4+4 run ahead, the 2-token last chunk samples, decodes sample.
    assert [sampled for _, sampled, _ in plans] == [False, False, True, True, True]
    # Only the decodes are decodes: the last chunk samples a first token ("prompts" plans ahead of it).
    assert [decode for _, _, decode in plans] == [False, False, False, True, True]
    assert s.requests["r0"].output_token_ids == [7, 7, 7]
