"""Prefix caching for a model with recurrent state, in the core: a prompt's step saves its state where its last
full block ends, and a later request takes cached blocks only as far as a saved state, starting from it."""

from __future__ import annotations

from services.common.block_hash import extend_hashes
from services.common.sampling_params import SamplingParams
from services.common.step import SampledToken, StepResult
from services.scheduler.core.request import Request
from tests.scheduler.core.test_scheduler import EOS, create_scheduler, step

PROMPT = list(range(1, 24))  # 23 tokens, blocks of 4: the last full block a repeat could take ends at 20


def _req(rid: str, tokens: list[int] = PROMPT) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=3), 0.0, eos_token_ids=(EOS,))


def _recurrent(**overrides):
    return create_scheduler(recurrent_state=True, enable_prefix_caching=True, **overrides)


def test_the_step_passing_the_prompts_last_full_block_saves_the_state_there():
    s = _recurrent(state_checkpoints=2, chunk_size=8)
    s.add(_req("a"))
    saves = [step(s)[0].state_saves for _ in range(3)]  # chunks 0-8, 8-16, 16-23
    assert saves == [{}, {}, {"a": (4, 0)}]  # 4 tokens into the chunk from 16: after token 20
    assert len(s.checkpoints) == 1


def test_a_repeat_takes_the_blocks_up_to_the_saved_state_and_starts_from_it():
    s = _recurrent(state_checkpoints=2)
    s.add(_req("a"))
    while s.has_work:
        step(s)
    s.add(_req("b"))
    plan, _ = step(s)
    (new,) = plan.new
    assert (new.num_computed_tokens, new.state_checkpoint) == (20, 0) and plan.num_scheduled_tokens == {"b": 3}
    assert not plan.state_saves  # already saved
    # A longer prompt sharing those blocks resumes there as well; one sharing fewer finds no state to resume.
    s.add(_req("c", PROMPT + [50, 51, 52, 53, 54]))
    s.add(_req("d", PROMPT[:14] + [60] * 9))
    plan, _ = step(s)
    assert {n.seq_id: (n.num_computed_tokens, n.state_checkpoint) for n in plan.new} == {"c": (20, 0), "d": (0, None)}
    assert s.prefix_stats.hit_blocks == 10


def test_without_checkpoints_or_a_recurrent_model_nothing_is_saved_and_blocks_alone_are_shared():
    off = _recurrent(state_checkpoints=0)
    for rid in ("a", "b"):
        off.add(_req(rid))
        while off.has_work:
            plan, _ = step(off)
            assert not plan.state_saves and all(n.num_computed_tokens == 0 for n in plan.new)
    plain = create_scheduler(enable_prefix_caching=True, state_checkpoints=4)  # KV is all of a prefix's state
    for rid in ("a", "b"):
        plain.add(_req(rid))
        plan, _ = step(plain)
        assert not plan.state_saves and plan.new[0].state_checkpoint is None
    assert plan.new[0].num_computed_tokens == 20


def test_a_state_saved_in_a_plan_is_not_taken_by_a_sequence_that_plan_adds():
    """The worker restores a new sequence's state before the plan's forward pass, which saves: a request
    admitted beside the saving step starts from zeros; one admitted in the next plan takes the state."""
    s = _recurrent(state_checkpoints=1, max_num_batched_tokens=26)
    s.add(_req("a"))
    s.add(_req("b"))
    plan, _ = step(s)
    assert plan.state_saves == {"a": (20, 0)} and plan.num_scheduled_tokens == {"a": 23, "b": 3}
    assert plan.new[1].num_computed_tokens == 0 and plan.new[1].state_checkpoint is None


def test_a_request_handed_off_arrives_with_its_state_not_the_senders_checkpoint():
    prefill, decode = _recurrent(state_checkpoints=2), _recurrent(state_checkpoints=2)
    prefill.add(_req("a"))
    while prefill.has_work:
        step(prefill)
    moved = _req("b")
    prefill.add(moved)
    step(prefill)  # resumed from the checkpoint, the first token sampled
    assert moved.state_checkpoint == 0
    prefill.hand_off("b")
    decode.reserve_arrival(moved)
    decode.arrive("b")
    plan, _ = step(decode)
    assert plan.new[0].state_checkpoint is None and plan.new[0].num_computed_tokens == 23


def test_decodes_save_the_state_of_each_block_they_fill_in_place_of_the_one_before():
    """Past its prompt, a request saves where its outputs fill a block (a next turn goes on from there), each
    save taking the slot of its previous one: the prompt's state stays beside the latest."""
    s = _recurrent(state_checkpoints=4)
    s.add(Request("a", list(PROMPT), SamplingParams(max_tokens=8), 0.0, eos_token_ids=(EOS,)))
    saves = [step(s)[0].state_saves for _ in range(7)]
    assert saves == [{"a": (20, 0)}, {"a": (1, 1)}, {}, {}, {}, {"a": (1, 1)}, {}]  # after 20, 24, then 28
    assert len(s.checkpoints) == 2
    with_turn = _req("b", PROMPT + [7] * 6)  # the prompt, its outputs so far, then more: takes blocks up to 28
    s.add(with_turn)
    plan, _ = step(s)
    assert (plan.new[0].num_computed_tokens, plan.new[0].state_checkpoint) == (28, 1)


def test_a_decode_planned_before_its_token_arrived_saves_under_the_request_until_the_block_is_known():
    """Planned ahead (expect), a decode runs a token the core has not seen: the block it fills has no hash yet,
    so its state is held under (request, block) and counts once the token arrives and the block is cached."""
    s = _recurrent(state_checkpoints=4)
    s.add(Request("a", list(PROMPT), SamplingParams(max_tokens=8), 0.0, eos_token_ids=(EOS,)))
    prompt_plan = s.schedule()
    s.expect(prompt_plan)  # its first token is in flight
    decode_plan = s.schedule()
    s.expect(decode_plan)
    assert decode_plan.state_saves == {"a": (1, 1)} and len(s.checkpoints) == 1  # the prompt's state only
    s.on_result(prompt_plan, StepResult(prompt_plan.step_id, sampled={"a": [SampledToken(7)]}))
    assert len(s.checkpoints) == 2
    s.add(_req("b", PROMPT + [7, 9]))
    plan = s.schedule()
    assert (plan.new[0].num_computed_tokens, plan.new[0].state_checkpoint) == (24, 1)


def test_a_prompt_parting_from_a_cached_one_saves_its_state_where_they_part_for_the_next_to_share():
    """Prompts sharing a system prompt: the second finds the first's blocks cached but no state after them (a
    branch point), computes them and saves the state there; the third resumes from it (Marconi)."""
    system = list(range(100, 112))  # 3 blocks
    s = _recurrent(state_checkpoints=4)
    s.add(_req("a", system + [1, 2, 3, 4, 5, 6, 7]))
    plan, _ = step(s)
    assert plan.state_saves == {"a": (16, 0)}  # its prompt's end only: no other prompt cached yet
    while s.has_work:
        step(s)
    s.add(_req("b", system + [8, 9, 10, 11, 12, 13, 14]))
    plan, _ = step(s)
    assert plan.new[0].num_computed_tokens == 0 and s.requests["b"].state_branch == 12
    (at, slot), = plan.state_saves.values()  # where it parts from a (its prompt's end falls in the same step)
    assert at == 12
    while s.has_work:
        step(s)
    s.add(_req("c", system + [15, 16, 17, 18, 19]))
    plan, _ = step(s)
    (new,) = plan.new
    assert (new.num_computed_tokens, new.state_checkpoint) == (12, slot) and s.requests["c"].state_branch == 0
    assert plan.state_saves["c"][0] == 4  # on from there, its own prompt's end (16)


def test_a_branch_point_and_the_prompts_end_in_different_chunks_save_both():
    system = list(range(100, 112))
    s = _recurrent(state_checkpoints=4, chunk_size=8)
    s.add(_req("a", system + [1, 2, 3, 4, 5, 6, 7]))
    while s.has_work:
        step(s)
    s.add(_req("b", system + [8, 9, 10, 11, 12, 13, 14]))
    saves = [step(s)[0].state_saves for _ in range(3)]  # chunks 0-8, 8-16, 16-19
    # The branch at 12 and the prompt's end at 16 in one chunk: the branch, 4 tokens into it.
    assert [{rid: at for rid, (at, _) in save.items()} for save in saves] == [{}, {"b": 4}, {}]
    s2 = _recurrent(state_checkpoints=4, chunk_size=14)
    s2.add(_req("a", system + [1, 2, 3, 4, 5, 6, 7]))
    while s2.has_work:
        step(s2)
    s2.add(_req("b", system + [8, 9, 10, 11, 12, 13, 14]))
    saves = [step(s2)[0].state_saves for _ in range(2)]  # chunks 0-14, 14-19: both points, two slots
    assert [save["b"][0] for save in saves] == [12, 2] and saves[0]["b"][1] != saves[1]["b"][1]


def test_a_multi_step_decode_saves_in_the_pass_that_fills_a_block():
    """Passes of one plan fill a block with tokens the plan's own passes sample: the save is after that many of
    the step's tokens, held under the request until those tokens arrive, then under the block's hash."""
    s = _recurrent(state_checkpoints=4, num_decode_steps=3)
    s.add(Request("a", list(PROMPT), SamplingParams(max_tokens=12), 0.0, eos_token_ids=(EOS,)))
    saves = [step(s)[0].state_saves for _ in range(4)]  # the prompt; decodes from 23, 26, 29
    assert [{rid: at for rid, (at, _) in save.items()} for save in saves] == [{"a": 20}, {"a": 1}, {"a": 2}, {"a": 3}]
    req = s.requests["a"]
    assert req.latest_state_save == req.block_hashes[7]  # the block ending at 32, bound once its tokens came
    assert s.checkpoints.covered(req.block_hashes[:8]) == 8


def test_without_a_prefix_cache_saved_states_still_count_for_kvcache_but_nothing_is_taken_here():
    """With the workers' prefix caches off, kvcache stores a hybrid's blocks with the state saved after the last
    of them (dual_path.py), so its states must count there too: the prompt's, and a decode's once its token
    arrived (planned ahead, it was held under the request). No request takes them on this worker."""
    s = create_scheduler(recurrent_state=True, enable_prefix_caching=False, state_checkpoints=4)
    a = Request("a", list(PROMPT), SamplingParams(max_tokens=8), 0.0, eos_token_ids=(EOS,))
    s.add(a)
    prompt_plan = s.schedule()
    s.expect(prompt_plan)
    assert prompt_plan.state_saves == {"a": (20, 0)} and len(s.checkpoints) == 1  # after token 20
    decode_plan = s.schedule()
    s.expect(decode_plan)
    assert decode_plan.state_saves == {"a": (1, 1)} and len(s.checkpoints) == 1  # block 6's last token in flight
    s.on_result(prompt_plan, StepResult(prompt_plan.step_id, sampled={"a": [SampledToken(7)]}))
    assert len(s.checkpoints) == 2
    hashes = extend_hashes(a.block_hashes, a.token_ids, 4, s.seed_of(a))
    assert s.checkpoints.covered(hashes[:5]) == 5 and s.checkpoints.covered(hashes[:6]) == 6
    s.add(_req("b", PROMPT + [7, 9]))
    plan = s.schedule()
    assert (plan.new[0].num_computed_tokens, plan.new[0].state_checkpoint) == (0, None)
