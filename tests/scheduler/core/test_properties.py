"""Hypothesis over every policy: random arrivals (of any priority, some added after newer ones), steps, time
jumps and aborts keep the core consistent, within its budgets, and every request that is not aborted finishes."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.sampling_params import SamplingParams
from services.scheduler.core.config import MLFQConfig
from services.scheduler.core.policies import POLICY_CLASSES, POLICY_NAMES
from services.scheduler.core.request import Request
from services.scheduler.core.step_time import StepTimeModel
from tests.scheduler.core.test_scheduler import create_scheduler, step

# A step of n tokens takes 10 ms + 1 ms per token: with tbt_target_s = 0.02 the derived budget tau is 10.
STEP_TIME = StepTimeModel(base_s=0.01, per_token_s=0.001, tile_tokens=1)
NUM_HOST = 16

ops = st.lists(
    st.one_of(
        # (add, prompt tokens, max tokens, priority, arrived this many requests earlier than it was added: a
        # mesh adds a request once its kvcache lookup came back, after newer ones maybe)
        st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 6), st.sampled_from([0, 0, 0, 1, -1]),
                  st.sampled_from([0, 0, 0, 1.5, 3.5])),
        st.tuples(st.just("step"), st.integers(1, 4)),
        st.tuples(st.just("wait"), st.sampled_from([0.05, 0.5, 5.0])),
        st.tuples(st.just("abort"), st.integers(0, 30)),
    ),
    min_size=1, max_size=30,
)
mlfq_configs = st.builds(
    MLFQConfig,
    base_quantum_s=st.sampled_from([None, 0.01]),
    num_levels=st.sampled_from([None, 3]),
    skip_join=st.booleans(),
    starvation_s=st.sampled_from([0.05, 0.3, math.inf]),
    starvation_check_steps=st.sampled_from([1, 3]),
    requeue_front=st.booleans(),
    swap_order=st.sampled_from(["enst", "priority"]),
    reserve_frac=st.sampled_from([0.0, 0.05, 0.3]),
    max_wait_ratio=st.sampled_from([None, 0.0, 0.5]),
    wait_credit=st.sampled_from(["fcfs", "none"]),
)


def _check_budgets(s, plan, before, budget):
    """``before``: (computed, known tokens, decoding) per running request when the plan was made."""
    cfg = s.config
    assert len(plan.num_scheduled_tokens) <= cfg.max_num_seqs
    assert plan.total_tokens <= (cfg.max_num_batched_tokens or math.inf)
    decodes = prompt = 0
    from_cache = {new.seq_id: new.num_computed_tokens for new in plan.new}  # prefix-cache hits at admission
    for rid, n in plan.num_scheduled_tokens.items():
        computed, known, decoding = before[rid]
        if rid in from_cache:  # (re)admitted in this step: preempted for recompute, maybe earlier in this step
            computed, decoding = from_cache[rid], False
        assert 1 <= n <= known - computed, f"{rid}: {n} tokens scheduled, {known - computed} uncomputed"
        if decoding:
            assert n == 1
            decodes += 1
        else:
            prompt += n
            if not POLICY_CLASSES[cfg.policy].chunked:
                assert computed + n == known, f"{cfg.policy} ran part of {rid}'s prompt"
    limit, decodes_count = budget
    # Decodes may exceed the step budget (they are never skipped for it, as in Sarathi-Serve); prompts not.
    assert prompt <= (max(0, limit - decodes) if decodes_count else limit)


def _budget(cfg):
    if not POLICY_CLASSES[cfg.policy].chunked:
        return math.inf, False
    if cfg.chunk_size is not None:
        return cfg.chunk_size, False
    return (cfg.derived_token_budget, True) if cfg.tbt_target_s is not None else (math.inf, False)


def _one_step(s, now, budget):
    plan_now = None if now is None else max(now, s.now)
    before = {r.request_id: (r.num_computed_tokens, r.num_tokens, r.is_decoding) for r in s.requests.values()}
    plan, events = step(s, now=plan_now)
    _check_budgets(s, plan, before, budget)
    if (window := s.config.sliding_window) is not None:  # no block a later query reads was freed
        assert all(r.num_dropped_blocks * 4 <= max(0, r.num_computed_tokens - window + 1) for r in s.running)
    still_live = [rid for rid in plan.num_scheduled_tokens if rid in s.requests]
    assert sum(s.queue_lengths()) == len(s.requests) - len(s.arriving) - len(still_live)
    return events


@settings(max_examples=300, deadline=None)
@given(
    policy=st.sampled_from(POLICY_NAMES),
    script=ops,
    chunk=st.one_of(st.none(), st.integers(1, 16)),
    tbt=st.sampled_from([None, 0.02, 0.05]),
    max_batched=st.sampled_from([None, 48, 64]),
    max_seqs=st.sampled_from([1, 2, 4, 256]),
    num_blocks=st.integers(12, 40),
    host=st.booleans(),
    mode=st.sampled_from([None, "swap", "recompute"]),
    mlfq=mlfq_configs,
    explicit_time=st.booleans(),
    window=st.sampled_from([None, None, 5, 9]),
)
def test_every_policy_stays_consistent_within_budget_and_finishes_everything(
        policy, script, chunk, tbt, max_batched, max_seqs, num_blocks, host, mode, mlfq, explicit_time, window):
    # With a window, the pool reserves the null block on top of the blocks the largest request may need.
    s = create_scheduler(num_blocks=num_blocks + (window is not None), block_size=4,
                         num_host_blocks=NUM_HOST if host else 0,
                         policy=policy, chunk_size=chunk, tbt_target_s=tbt, max_num_batched_tokens=max_batched,
                         max_num_seqs=max_seqs, preemption_mode=mode, step_time=STEP_TIME, mlfq=mlfq,
                         sliding_window=window)
    budget = _budget(s.config)
    added, aborted, finished = [], set(), set()
    now = 0.0 if explicit_time else None
    for op in script:
        if op[0] == "add":
            i = len(added)
            # Half the prompts share tokens, so cached blocks are shared, freed and evicted under pressure.
            tokens = [1] * op[1] if i % 2 else [i + 2] * op[1]
            s.add(Request(f"r{i}", tokens, SamplingParams(max_tokens=op[2]), i - op[4], priority=op[3]))
            added.append(f"r{i}")
        elif op[0] == "step":
            for _ in range(op[1]):
                finished |= {e.request_id for e in _one_step(s, now, budget) if e.finish_reason}
                now = None if now is None else now + 0.02
        elif op[0] == "wait" and now is not None:
            now += op[1]
        elif op[0] == "abort" and added:
            rid = added[op[1] % len(added)]
            if rid in s.requests:
                s.finish(rid)
                aborted.add(rid)
            s.check_integrity()
    for _ in range(3000):
        if not s.has_work:
            break
        finished |= {e.request_id for e in _one_step(s, now, budget) if e.finish_reason}
        now = None if now is None else now + 0.02
    assert not s.has_work, f"stalled: running {s.running}, waiting {list(s.waiting)}, swapped {list(s.swapped)}"
    assert finished == set(added) - aborted
    assert s.blocks.num_free == s.blocks.num_blocks and not s.requests
    if host:
        s.schedule()  # host blocks read by the last swap-ins are released one plan later
        assert s.host_blocks.num_free == NUM_HOST
