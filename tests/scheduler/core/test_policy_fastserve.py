"""``fastserve`` and ``fastserve+sarathi``: skip-join MLFQ, demotion, starvation promotion, token-level
preemption, swap decisions (reactive and proactive), and the stall-free variant's step composition.

Steps are timed by a step-time model of 1 ms per token and no fixed cost, so with the default (profiled)
base quantum q[i] = 2**i ms and a job whose first step has n tokens joins level ceil(log2 n).
"""

from __future__ import annotations

import math

import pytest

from services.common.sampling_params import SamplingParams
from services.scheduler.core.config import MLFQConfig, SchedulerConfig
from services.scheduler.core.policies.mlfq import MLFQ
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.core.step_time import StepTimeModel
from tests.scheduler.core.test_scheduler import create_scheduler, step

MS_PER_TOKEN = StepTimeModel(base_s=0.0, per_token_s=0.001, tile_tokens=1)
NO_RESERVE = MLFQConfig(reserve_frac=0.0)


def job(rid: str, prompt_len: int, arrival: float, max_tokens: int = 20) -> Request:
    token = 10 + sum(map(ord, rid))  # distinct prompts: no prefix-cache hits between jobs
    return Request(rid, [token] * prompt_len, SamplingParams(max_tokens=max_tokens), arrival)


def fastserve(policy="fastserve", mlfq=NO_RESERVE, **overrides):
    overrides.setdefault("num_blocks", 64)
    overrides.setdefault("block_size", 4)
    return create_scheduler(policy=policy, step_time=MS_PER_TOKEN, mlfq=mlfq, **overrides)


def levels(s) -> dict[str, int]:
    return {rid: j.level for rid, j in s.policy.mlfq.jobs.items()}


# --- the queue ---------------------------------------------------------------------------------------------


def test_skip_join_picks_the_first_level_whose_quantum_covers_the_first_step():
    s = fastserve()
    for i, n in enumerate((1, 2, 4, 5, 16, 17)):
        s.add(job(f"p{n}", n, float(i)))
    assert levels(s) == {"p1": 0, "p2": 1, "p4": 2, "p5": 3, "p16": 4, "p17": 5}
    plain = fastserve(mlfq=MLFQConfig(skip_join=False))
    plain.add(job("p17", 17, 0.0))
    assert levels(plain) == {"p17": 0}


def test_skip_join_under_chunking_looks_at_the_first_chunk_only():
    s = fastserve("fastserve+sarathi", chunk_size=4)
    s.add(job("long", 100, 0.0))
    assert levels(s) == {"long": 2}


def test_levels_are_bounded_when_asked():
    s = fastserve(mlfq=MLFQConfig(num_levels=3))
    s.add(job("long", 100, 0.0))
    assert levels(s) == {"long": 2}


def test_a_job_is_demoted_each_time_it_uses_up_its_quantum():
    s = fastserve()
    s.add(job("a", 4, 0.0, max_tokens=30))  # level 2: quantum 4 ms
    seen = []
    for _ in range(14):
        step(s)
        seen.append(levels(s)["a"])
    # The 4-token prefill uses level 2's quantum; then 8 one-token decodes level 3's (8 ms); then level 4.
    # Each step is charged at the next schedule(), hence the one-step lag.
    assert seen == [2, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4]


@pytest.mark.parametrize(("front", "expected"), [(False, ["b", "a"]), (True, ["a", "b"])])
def test_a_demoted_job_joins_the_back_of_its_new_queue_or_the_front(front, expected):
    s = fastserve(mlfq=MLFQConfig(requeue_front=front, reserve_frac=0.0), max_num_seqs=1)
    s.add(job("b", 8, 0.0))  # level 3
    s.add(job("a", 4, 1.0))  # level 2: runs first, then is demoted to level 3 where b waits
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"a": 4}
    plan, _ = step(s)
    assert levels(s) == {"a": 3, "b": 3}
    assert list(plan.num_scheduled_tokens) == expected[:1]
    order = [r.request_id for r in s.policy.mlfq.order(s.requests.values())]
    assert order == expected


def test_a_starving_job_is_promoted_to_level_zero():
    mlfq = MLFQConfig(starvation_s=1.0, reserve_frac=0.0)
    s = fastserve(mlfq=mlfq, max_num_seqs=1)
    s.add(job("short", 2, 0.0, max_tokens=50))  # level 1
    s.add(job("long", 16, 1.0))  # level 4: waits behind the short job
    step(s, now=0.0)
    step(s, now=0.5)
    assert levels(s)["long"] == 4
    plan, _ = step(s, now=1.0)  # "long" joined at 0.0 and never ran: starved for 1 s
    assert levels(s)["long"] == 0 and plan.num_scheduled_tokens == {"long": 16}


def test_starvation_is_checked_every_so_many_steps():
    s = fastserve(mlfq=MLFQConfig(starvation_s=1.0, starvation_check_steps=3, reserve_frac=0.0), max_num_seqs=1)
    s.add(job("short", 2, 0.0, max_tokens=50))
    s.add(job("long", 16, 1.0))
    step(s, now=5.0)
    step(s, now=6.0)
    assert levels(s)["long"] == 4  # starved, but checked only at every third step
    step(s, now=7.0)
    assert levels(s)["long"] == 0


def test_enst_is_the_work_ahead_over_the_batch_or_the_time_to_promotion():
    m = MLFQ(MLFQConfig(base_quantum_s=1.0, starvation_s=100.0), MS_PER_TOKEN)
    reqs = [job(rid, 1, 0.0) for rid in "abcd"]
    for r, level in zip(reqs, (0, 0, 1, 3), strict=True):
        m.join(r, 1, now=0.0)
        m.jobs[r.request_id].level = level
    m.jobs["a"].served = 0.25
    enst = m.enst(reqs, now=0.0, batch_slots=2)
    # a: nothing ahead. b: a's 0.75 s left. c: a and b also run level 0 out, then nothing between: (0.75+1)/2.
    # d: a and b run levels 1 and 2 (2 + 4 s each) after their level-0 rest; c its 2 s at level 1, 4 at 2.
    assert enst == pytest.approx({"a": 0.0, "b": 0.375, "c": 0.875, "d": (0.75 + 1 + 12 + 6) / 2})
    m.jobs["d"].last_run = -99.5  # promoted in 0.5 s
    assert m.enst(reqs, now=0.0, batch_slots=2)["d"] == pytest.approx(0.5)


def test_queue_lengths_count_jobs_waiting_for_a_turn_per_level():
    s = fastserve(max_num_seqs=1)
    for i, n in enumerate((2, 2, 16)):
        s.add(job(f"j{i}", n, float(i)))
    assert s.queue_lengths() == [0, 2, 0, 0, 1]
    step(s)
    assert s.queue_lengths() == [0, 1, 0, 0, 1]
    bounded = fastserve(mlfq=MLFQConfig(num_levels=8))
    assert bounded.queue_lengths() == [0] * 8


def test_the_queue_follows_requests_in_and_out():
    s = fastserve()
    for i in range(3):
        s.add(job(f"j{i}", 5, float(i)))
    step(s)
    s.finish("j0")
    s.hand_off("j1")
    s.check_integrity()
    assert set(levels(s)) == {"j2"}
    s.drain()  # (the pools are abandoned with a dead worker: no integrity check after)
    assert not levels(s)


def test_released_code_preset_and_validation():
    assert MLFQConfig().starvation_s == 3.0 and MLFQConfig.paper().starvation_s == 0.3
    code = MLFQConfig.released_code()
    assert (code.base_quantum_s, code.starvation_s, code.starvation_check_steps, code.requeue_front,
            code.swap_order) == (0.01, 3.0, 1000, True, "priority")
    assert MLFQ(MLFQConfig(), StepTimeModel()).base == pytest.approx(0.02015)  # the one-token step
    with pytest.raises(ValueError, match="swap_order"):
        MLFQConfig(swap_order="lifo")
    with pytest.raises(ValueError, match="quantum_ratio"):
        SchedulerConfig(policy="fastserve", mlfq=MLFQConfig(quantum_ratio=1.0))


# --- a step ------------------------------------------------------------------------------------------------


def test_a_higher_priority_arrival_takes_the_slot_and_the_lower_job_keeps_its_kv():
    s = fastserve(max_num_seqs=1)
    long = job("long", 16, 0.0, max_tokens=6)
    s.add(long)
    step(s)
    blocks = list(long.block_ids)
    s.add(job("short", 2, 1.0, max_tokens=3))
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"short": 2}  # token-level preemption: long loses its turn
    assert long.status is RequestStatus.RUNNING and long.block_ids == blocks and not plan.finished
    ran = []
    while s.has_work:
        plan, _ = step(s)
        ran += list(plan.num_scheduled_tokens)
    assert ran == ["short", "short"] + ["long"] * 5  # short finishes first, then long resumes
    assert s.preemptions == {"swap": 0, "recompute": 0} and long.num_preemptions == 0


def test_block_pressure_swaps_out_the_lowest_priority_job_behind():
    s = fastserve(num_blocks=10, num_host_blocks=16, max_num_seqs=2)
    s.add(job("low1", 20, 0.0))
    s.add(job("low2", 12, 1.0))
    step(s)  # 8 of 10 blocks
    s.add(job("high", 8, 2.0))
    plan, _ = step(s)  # high takes the 2 free blocks; low2's decode needs one more: low1 is behind it
    assert plan.num_scheduled_tokens == {"high": 8, "low2": 1}
    assert [r.request_id for r in s.swapped] == ["low1"] and len(plan.swap_out) == 5
    assert s.preemptions == {"swap": 1, "recompute": 0}


@pytest.mark.parametrize(("order", "victim"), [("enst", "low2"), ("priority", "low1")])
def test_a_job_about_to_be_promoted_is_not_swapped_out_under_enst(order, victim):
    mlfq = MLFQConfig(swap_order=order, starvation_s=0.010, reserve_frac=0.0)
    s = fastserve(mlfq=mlfq, num_blocks=11, num_host_blocks=16, max_num_seqs=1)
    s.add(job("low1", 20, 0.0))  # level 5
    step(s, now=0.0)
    s.add(job("low2", 12, 1.0))  # level 4: takes the only slot from now on; low1 idles with its KV
    for k in range(1, 9):
        step(s, now=k / 1000)
    assert levels(s) == {"low1": 5, "low2": 4} and s.blocks.num_free == 1
    s.add(job("high", 8, 2.0))  # needs 2 blocks: one low job must go to host
    plan, _ = step(s, now=0.009)
    assert plan.num_scheduled_tokens == {"high": 8}
    # low1 last ran at 1 ms and is promoted at 11 ms, before low2's turn comes back (ENST 2 ms vs 10 ms);
    # by priority alone low1 (level 5) is the one behind low2 (level 4).
    assert [r.request_id for r in s.swapped] == [victim]


def test_without_host_room_a_higher_priority_job_drops_only_a_newer_arrivals_kv():
    def two_running():
        s = fastserve(num_blocks=8, max_num_seqs=2, preemption_mode="recompute")
        s.add(job("old", 20, 0.0))
        s.add(job("newer", 12, 2.0))
        step(s)  # 8 of 8 blocks
        return s

    s = two_running()
    s.add(job("newest", 4, 3.0))  # level 2, ahead of both, but it arrived last: it waits for blocks
    plan, _ = step(s)
    assert "newest" not in plan.num_scheduled_tokens
    s = two_running()
    s.add(job("mid", 4, 1.0))  # arrived before "newer" (added late): newer's KV is dropped for it
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"mid": 4, "old": 1}
    assert s.requests["newer"].status is RequestStatus.WAITING and "newer" in plan.finished
    assert s.preemptions == {"swap": 0, "recompute": 1} and s.requests["old"].num_preemptions == 0


def test_proactive_swapping_keeps_the_reserve_free_and_brings_jobs_back_before_their_turn():
    s = fastserve(mlfq=MLFQConfig(reserve_frac=0.3), num_blocks=16, num_host_blocks=16, max_num_seqs=2)
    reserve = 5  # ceil(0.3 * 16)
    s.add(job("b", 12, 0.0, max_tokens=3))  # level 4
    s.add(job("c", 16, 1.0, max_tokens=3))  # level 4
    step(s)
    for i in (1, 2, 3):
        s.add(job(f"a{i}", 8, 1.0 + i, max_tokens=6))  # level 3: they take the two slots from b and c
    back_early = []
    while s.has_work:
        swapped = {r.request_id for r in s.swapped}
        plan, _ = step(s)
        idle = [r for r in s.running if r.request_id not in plan.num_scheduled_tokens]
        if plan.swap_out:  # only idle jobs are swapped out ahead of need, never one that runs in this step
            assert not {r.request_id for r in s.swapped} & set(plan.num_scheduled_tokens)
        assert s.blocks.num_free >= reserve or not idle or plan.swap_in
        back_early += [rid for rid in swapped - {r.request_id for r in s.swapped} if rid in s.requests
                       and rid not in plan.num_scheduled_tokens]
    assert back_early == ["b", "c"]  # each swapped back in one step before its turn came
    assert s.preemptions == {"swap": 2, "recompute": 0} and s.blocks.num_free == 16


def test_proactive_swap_out_never_drops_kv_when_the_host_is_full():
    s = fastserve(mlfq=MLFQConfig(reserve_frac=0.5), num_blocks=10, num_host_blocks=1, max_num_seqs=1)
    s.add(job("a", 4, 0.0))
    s.add(job("b", 16, 1.0))
    step(s)
    step(s)
    assert s.preemptions == {"swap": 0, "recompute": 0}


def test_a_whole_prompt_over_the_budget_waits_while_lower_priority_decodes_run():
    s = fastserve(max_num_batched_tokens=10)
    s.add(job("dec", 8, 0.0, max_tokens=30))
    step(s)
    s.add(job("big", 9, 1.0))  # level 4, ahead of dec (demoted to 4 after its prefill... then 5)
    s.add(job("tiny", 2, 2.0))  # level 1
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"tiny": 2, "dec": 1}  # big (9 tokens) does not fit after tiny
    plan, _ = step(s)
    assert plan.num_scheduled_tokens["big"] == 9


def test_fastserve_sarathi_runs_decodes_first_then_chunks_in_mlfq_order():
    s = fastserve("fastserve+sarathi", chunk_size=6)
    s.add(job("d", 4, 0.0, max_tokens=30))
    step(s)
    s.add(job("long", 20, 1.0))  # first chunk 6 tokens: level 3
    s.add(job("short", 3, 2.0))  # level 2: its prompt goes first despite arriving last
    plan, _ = step(s)
    assert list(plan.num_scheduled_tokens.items()) == [("d", 1), ("short", 3), ("long", 3)]


def test_fastserve_sarathi_counts_decodes_against_a_derived_budget():
    step_time = StepTimeModel(base_s=0.0, per_token_s=0.001, tile_tokens=1)
    s = create_scheduler(policy="fastserve+sarathi", tbt_target_s=0.008, step_time=step_time, mlfq=NO_RESERVE)
    assert s.config.derived_token_budget == 8
    for i in range(3):
        s.add(job(f"d{i}", 2, float(i), max_tokens=30))
    step(s)
    s.add(job("p", 20, 5.0))
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"d0": 1, "d1": 1, "d2": 1, "p": 5}


def test_fastserve_sarathi_gives_a_slot_its_first_choice_cannot_use_to_the_next_in_order():
    s = fastserve("fastserve+sarathi", num_blocks=6, max_num_seqs=1, preemption_mode="recompute")
    s.add(job("old", 20, 0.0, max_tokens=3))
    step(s)  # 5 of 6 blocks
    s.add(job("young", 5, 1.0, max_tokens=2))  # level 3, ahead of old; needs 2 blocks, may not drop old's KV
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == {"old": 1}  # the slot is not left empty
    while s.has_work:
        step(s)
    assert s.preemptions == {"swap": 0, "recompute": 0}


def test_skip_join_makes_short_jobs_finish_sooner_than_fcfs():
    def mean_finish_step(policy):
        s = create_scheduler(policy=policy, step_time=MS_PER_TOKEN, mlfq=NO_RESERVE, max_num_seqs=1)
        s.add(job("long", 32, 0.0, max_tokens=20))
        for i in range(4):
            s.add(job(f"s{i}", 2, 1.0 + i, max_tokens=2))
        done, k = {}, 0
        while s.has_work:
            k += 1
            _, events = step(s)
            done.update({e.request_id: k for e in events if e.finish_reason})
        return sum(done.values()) / len(done)

    assert mean_finish_step("fastserve") < mean_finish_step("fcfs")
    assert math.isfinite(mean_finish_step("fastserve+sarathi"))
