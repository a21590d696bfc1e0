"""Planning ahead of results (``Scheduler.expect``): the same tokens as waiting for every result.

A simulated worker runs each plan as it is sent and samples a token that depends only on the request and
its position, as greedy decoding does; the pipelined driver hands each result to the core one plan late,
which is what the mesh does with two plans in flight.
"""

from __future__ import annotations

from collections import deque

import pytest

from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken, StepResult
from services.scheduler.core.block_manager import BlockManager
from services.scheduler.core.request import Request
from services.scheduler.core.scheduler import POLICIES, Scheduler, SchedulerConfig

EOS = 0


def _token(rid: str, index: int) -> int:
    i = int(rid[1:])
    return EOS if (i % 3 == 0 and index == 4 + i % 5) else 1 + (7 * i + 3 * index) % 50


def _execute(worker: dict, plan) -> StepResult:
    for rid in plan.finished:
        worker.pop(rid, None)
    for new in plan.new:
        worker[new.seq_id] = [new.num_computed_tokens, len(new.token_ids) - new.prompt_len, new.prompt_len]
    result = StepResult(plan.step_id)
    for rid, n in plan.num_scheduled_tokens.items():
        state = worker[rid]
        state[0] += n
        # Reaching the end of what it knows, it samples; past it (multi-step), one more per pass.
        for _ in range(state[0] - (state[2] + state[1]) + 1):
            result.sampled.setdefault(rid, []).append(SampledToken(_token(rid, state[1])))
            state[1] += 1
    return result


def _run(policy: str, pipelined: bool, num_blocks: int, num_host_blocks: int,
         decode_steps: int = 1) -> tuple[dict, Scheduler, int, int]:
    host = BlockManager(num_host_blocks, 4) if num_host_blocks else None
    s = Scheduler(SchedulerConfig(policy=policy, chunk_size=8, max_model_len=64, num_decode_steps=decode_steps),
                  BlockManager(num_blocks, 4), host)
    for i in range(12):
        s.add(Request(f"r{i}", [100 + i] * (3 + 5 * (i % 4)), SamplingParams(max_tokens=3 + i % 7),
                      arrival_time=float(i), eos_token_ids=(EOS,)))
    worker: dict = {}
    outputs: dict[str, list[int]] = {}
    in_flight: deque = deque()
    decodes_after_end = multi_step = 0
    steps = 0
    while s.has_work or in_flight:
        steps += 1
        assert steps < 2000, "no progress"
        if s.has_work and len(in_flight) < 2:
            plan = s.schedule()
            for rid, n in plan.num_scheduled_tokens.items():
                req = s.requests[rid]
                decodes_after_end += len(req.output_token_ids) + req.num_pending >= req.params.max_tokens
                # A multi-step decode samples n tokens: never past max_tokens.
                decodes_after_end += req.is_decoding and len(req.output_token_ids) + req.num_pending + n > \
                    req.params.max_tokens
                multi_step += req.is_decoding and n > 1
            result = _execute(worker, plan)
            if pipelined:
                s.expect(plan)
                in_flight.append((plan, result))
                if len(in_flight) < 2:
                    continue
                plan, result = in_flight.popleft()
        else:
            plan, result = in_flight.popleft()
        for event in s.on_result(plan, result):
            outputs.setdefault(event.request_id, []).append(event.token.token_id)
        s.check_integrity()
    assert not s.has_work and not in_flight
    return outputs, s, decodes_after_end, multi_step


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("num_blocks", "num_host_blocks"), [(64, 0), (8, 0), (8, 16)],
                         ids=["roomy", "recompute", "swap"])
def test_planning_ahead_gives_the_tokens_of_waiting_for_each_result(policy, num_blocks, num_host_blocks):
    expected, *_ = _run(policy, False, num_blocks, num_host_blocks)
    got, s, decodes_after_end, _ = _run(policy, True, num_blocks, num_host_blocks)
    assert got == expected
    assert any(out[-1] == EOS for out in got.values())  # stops one step late leave a sample to discard
    assert s.blocks.num_free == num_blocks  # every block came back
    assert decodes_after_end == 0  # a request whose last token is in flight is not scheduled again
    if num_blocks == 8:
        assert sum(s.preemptions.values()) > 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("pipelined", [False, True], ids=["waiting", "pipelined"])
@pytest.mark.parametrize(("num_blocks", "num_host_blocks"), [(64, 0), (8, 0), (8, 16)],
                         ids=["roomy", "recompute", "swap"])
def test_multi_step_decodes_give_the_tokens_of_single_steps(policy, pipelined, num_blocks, num_host_blocks):
    expected, *_ = _run(policy, False, num_blocks, num_host_blocks)
    got, s, decodes_after_end, multi_step = _run(policy, pipelined, num_blocks, num_host_blocks, decode_steps=4)
    assert got == expected  # tokens past a stop (EOS at a random pass) are dropped
    assert s.blocks.num_free == num_blocks  # blocks reserved ahead came back too
    assert decodes_after_end == 0
    if num_blocks == 64:  # a tight pool keeps requests queued, and then every step is a single pass
        assert multi_step > 0
