"""Multi-turn workloads: Mooncake replay as token ids that share exactly the trace's prefix blocks, synthetic
agentic sessions, and the independent prefix-hit count (checked against the trace's own block ids and the
scheduler's block hashes)."""

from __future__ import annotations

import json
import math

import pytest

from seawall.workloads import multiturn as mt
from seawall.workloads.multiturn import (
    AgenticConfig,
    MooncakeReplayConfig,
    MultiTurnRequest,
    TokenSeq,
    agentic_sessions,
    block_token_ids,
    mooncake_conversation,
    prefix_hits,
    session_plans,
    structural_hits,
)
from services.common.block_hash import extend_hashes, hash_seed
from services.common.errors import InvalidArgument

TRACE = mt.trace_dir() / mt.MOONCAKE_FILE


def _raw(limit: int, offset: int = 0) -> list[dict]:
    with TRACE.open() as f:
        return [json.loads(line) for _, line in zip(range(offset + limit), f, strict=False)][offset:]


# --- token ids --------------------------------------------------------------------------------------------


def test_block_tokens_are_deterministic_in_range_and_prefix_consistent():
    a = block_token_ids("mc:7", 512)
    assert a == block_token_ids("mc:7", 512) and len(a) == 512
    assert all(3 <= t < 4096 for t in a)
    assert block_token_ids("mc:7", 100) == a[:100]  # a partial block is a prefix of the full one
    assert block_token_ids("mc:8", 512) != a and block_token_ids("mc:7", 512, seed=1) != a
    small = block_token_ids("mc:7", 2000, vocab_size=5)
    assert set(small) == {3, 4}
    assert block_token_ids("x", 0) == ()
    with pytest.raises(InvalidArgument):
        block_token_ids("x", 4, vocab_size=3)


def test_token_seq_is_a_lazy_sequence():
    seq = TokenSeq([("a", 5), ("b", 3), ("empty", 0)])
    flat = list(block_token_ids("a", 5)) + list(block_token_ids("b", 3))
    assert len(seq) == 8 and list(seq) == flat and seq.tolist() == flat
    assert seq[0] == flat[0] and seq[-1] == flat[-1] and seq[5] == flat[5] and seq[2:6] == flat[2:6]
    with pytest.raises(IndexError):
        seq[8]
    longer = seq.extend([("c", 2)])
    assert len(longer) == 10 and longer.tolist()[:8] == flat and len(seq) == 8
    assert seq == flat and seq == TokenSeq([("a", 5), ("b", 3)]) and seq != longer


# --- Mooncake replay ----------------------------------------------------------------------------------------


def test_mooncake_prompts_share_exactly_the_trace_prefix_blocks():
    raw = _raw(300)
    reqs = mooncake_conversation(MooncakeReplayConfig(limit=300))
    assert len(reqs) == 300
    for rec, req in zip(raw, reqs, strict=True):
        assert req.prompt_len == rec["input_length"] and req.max_tokens == rec["output_length"]
        assert req.hash_ids == tuple(rec["hash_ids"]) and req.arrival_s == rec["timestamp"] / 1000
    pairs = 0
    for i in range(len(reqs)):
        for j in range(i):
            a, b = raw[i]["hash_ids"], raw[j]["hash_ids"]
            k = next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            if k < 2:
                continue
            pairs += 1
            ta, tb = reqs[i].prompt_token_ids.tolist(), reqs[j].prompt_token_ids.tolist()
            common = next((n for n, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
            full = min(k * 512, len(ta), len(tb))
            assert ta[:full] == tb[:full]
            if full < min(len(ta), len(tb)):  # the next block differs (ids are random: all 512 equal is impossible)
                assert ta[full:full + 512] != tb[full:full + 512] and common < full + 512
    assert pairs > 10


def test_mooncake_scaled_blocks_and_lengths():
    raw = _raw(200)
    reqs = mooncake_conversation(MooncakeReplayConfig(limit=200, block_tokens=16, time_scale=0.5, vocab_size=100))
    for rec, req in zip(raw, reqs, strict=True):
        partial = rec["input_length"] - 512 * (len(rec["hash_ids"]) - 1)
        assert req.prompt_len == 16 * (len(rec["hash_ids"]) - 1) + math.ceil(partial * 16 / 512)
        assert req.max_tokens == max(1, math.ceil(rec["output_length"] / 32))
        assert req.arrival_s == pytest.approx(rec["timestamp"] / 1000 * 0.5)
        assert req.block_tokens == 16 and max(req.prompt_token_ids) < 100
    same = [r for r in reqs if r.hash_ids[0] == 0]
    assert all(r.prompt_token_ids[:16] == same[0].prompt_token_ids[:16] for r in same)  # block 0 everywhere


def test_the_whole_trace_fits_the_builtin_context_at_16_tokens_per_block():
    reqs = mooncake_conversation(MooncakeReplayConfig(block_tokens=16))
    assert len(reqs) == 12031
    assert max(r.prompt_len + r.max_tokens for r in reqs) <= 4096
    capped = mooncake_conversation(MooncakeReplayConfig(limit=500, max_model_len=1024, block_tokens=16))
    assert capped and all(r.prompt_len + r.max_tokens <= 1024 for r in capped) and len(capped) < 500


def test_mooncake_sessions_are_inferred_from_shared_prefixes():
    reqs = mooncake_conversation(MooncakeReplayConfig(limit=2000, offset=3000))
    by_id = {r.request_id: r for r in reqs}
    later = [r for r in reqs if r.turn > 1]
    assert len(later) > 300 and reqs[0].request_id == "mc-3000"
    for r in later:
        prev = by_id[r.prev_request_id]
        assert r.session_id == prev.session_id and r.turn == prev.turn + 1
        shared = next((n for n, (x, y) in enumerate(zip(r.hash_ids, prev.hash_ids, strict=False)) if x != y),
                      min(len(r.hash_ids), len(prev.hash_ids)))
        assert shared >= 2 and r.shared_prefix_tokens == min(shared * 512, r.prompt_len, prev.prompt_len)
    assert all(r.shared_prefix_tokens == 0 and r.prev_request_id is None for r in reqs if r.turn == 1)


def test_spreading_a_timestamp_slot():
    assert mt._spread_times([0.0, 0.0, 0.0, 3.0], 3.0) == [0.0, 1.0, 2.0, 3.0]
    reqs = mooncake_conversation(MooncakeReplayConfig(limit=40, spread_s=3.0))
    times = [r.arrival_s for r in reqs]
    assert times == sorted(times) and len(set(times)) == len(times)


# --- hit accounting ---------------------------------------------------------------------------------------


def _raw_hits(raw: list[dict]) -> list[int]:
    """Straight from the trace file: the leading run of hash ids seen before as full 512-token blocks."""
    seen: set[int] = set()
    out = []
    for rec in raw:
        full = rec["input_length"] // 512
        ids = rec["hash_ids"][:full]
        k = next((n for n, h in enumerate(ids) if h not in seen), len(ids))
        out.append(512 * k)
        seen.update(ids)
    return out


def _scheduler_hash_hits(reqs, block_size: int) -> list[int]:
    """The scheduler's chained BLAKE2b block hashes (services/common/block_hash.py) over the same token ids."""
    seen: set[int] = set()
    out = []
    for r in reqs:
        hashes = extend_hashes([], r.prompt_token_ids.tolist(), block_size, hash_seed("m", block_size))
        k = next((n for n, h in enumerate(hashes) if h not in seen), len(hashes))
        out.append(block_size * k)
        seen.update(hashes)
    return out


@pytest.mark.parametrize(("block_tokens", "offset"), [(512, 3000), (16, 0)])
def test_hit_accounting_matches_independent_counts_on_the_replayed_trace(block_tokens, offset):
    raw = _raw(150, offset)
    reqs = mooncake_conversation(MooncakeReplayConfig(limit=150, offset=offset, block_tokens=block_tokens))
    counted = prefix_hits(reqs, block_tokens)
    assert counted.per_request == structural_hits(reqs, block_tokens).per_request
    assert counted.per_request == _scheduler_hash_hits(reqs, block_tokens)
    if block_tokens == 512:
        assert counted.per_request == _raw_hits(raw)
    assert counted.prompt_tokens == sum(r.prompt_len for r in reqs)
    assert counted.hit_tokens == sum(counted.per_request) > 0
    assert 0.02 < counted.hit_rate < 0.6


def test_whole_trace_hit_rate_matches_the_trace_notes():
    reqs = mooncake_conversation(MooncakeReplayConfig())
    stats = structural_hits(reqs, 512)
    # bench/traces notes: 0.374 counting a partly filled last block when its id was seen; full blocks only: 0.3734
    assert stats.hit_rate == pytest.approx(0.3734, abs=5e-4)
    assert stats.per_request == _raw_hits(_raw(12031))


def _req(rid: str, segments, prev=None, output=None) -> MultiTurnRequest:
    return MultiTurnRequest(rid, "s", 1, TokenSeq(segments), 4, 0.0, 0, prev,
                            output_token_ids=None if output is None else TokenSeq(output))


def test_a_block_hits_only_after_the_same_prefix():
    bs = 4
    reqs = [_req("a", [("A", 4), ("B", 4), ("C", 4)]),
            _req("b", [("A", 4), ("B", 4), ("C", 4), ("D", 3)]),  # 12 hit; a partial block never hits
            _req("c", [("X", 4), ("B", 4), ("C", 4)]),  # B and C were seen, but after A: no hit
            _req("d", [("A", 4), ("X", 4), ("C", 4)]),  # only A
            _req("e", [("A", 4), ("B", 4), ("C", 4), ("D", 4)]),  # D was partial before: 12
            _req("f", [("A", 2)])]  # shorter than a block
    stats = prefix_hits(reqs, bs)
    assert stats.per_request == [0, 12, 0, 4, 12, 0]
    assert stats.hit_tokens == 28 and stats.prompt_tokens == 12 + 15 + 12 + 12 + 16 + 2
    with pytest.raises(InvalidArgument):
        prefix_hits(reqs, 0)


def test_outputs_count_only_when_asked():
    first = _req("a", [("P", 8)], output=[("O", 8)])
    second = _req("b", [("P", 8), ("O", 8), ("Q", 4)], prev="a")
    assert prefix_hits([first, second], 4).per_request == [0, 8]
    assert prefix_hits([first, second], 4, count_outputs=True).per_request == [0, 16]


# --- agentic sessions ---------------------------------------------------------------------------------------


def test_each_turn_is_the_previous_context_plus_a_short_append():
    reqs = agentic_sessions(AgenticConfig(sessions=3, turns=6, first_prompt_len=300, append_len=20, output_len=10,
                                          max_len=4096, seed=5))
    by_id = {r.request_id: r for r in reqs}
    assert len(reqs) == 18 and {r.session_id for r in reqs} == {"s0", "s1", "s2"}
    for r in reqs:
        assert r.max_tokens == len(r.output_token_ids) and r.arrival_s == 0.0
        if r.turn == 1:
            assert r.prev_request_id is None and r.shared_prefix_tokens == 0
            continue
        prev = by_id[r.prev_request_id]
        ctx = prev.prompt_token_ids.tolist() + prev.output_token_ids.tolist()
        tokens = r.prompt_token_ids.tolist()
        assert prev.session_id == r.session_id and prev.turn == r.turn - 1
        assert tokens[:len(ctx)] == ctx and 10 <= len(tokens) - len(ctx) <= 30
        assert r.shared_prefix_tokens == len(ctx)
    firsts = [r.prompt_token_ids.tolist()[:16] for r in reqs if r.turn == 1]
    assert len({tuple(f) for f in firsts}) == 3  # sessions share nothing


@pytest.mark.parametrize("preset", [None, "32k", "48k", "64k"])
def test_agentic_hit_rate_is_at_least_95_percent(preset):
    cfg = AgenticConfig(sessions=24) if preset is None else AgenticConfig.preset(preset, sessions=24)
    reqs = agentic_sessions(cfg)
    assert structural_hits(reqs, 64, count_outputs=True).hit_rate >= 0.95
    assert max(r.prompt_len + r.max_tokens for r in reqs) <= cfg.max_len


def test_scaled_sessions_fit_the_builtin_model_and_counts_agree_on_tokens():
    cfg = AgenticConfig(sessions=4, turns=40, seed=3).scaled(1 / 16)
    assert cfg.max_len == 4096 and cfg.append_len == 27
    reqs = agentic_sessions(cfg)
    assert max(r.prompt_len + r.max_tokens for r in reqs) <= 4096
    for outputs in (False, True):
        counted = prefix_hits(reqs, 16, count_outputs=outputs)
        assert counted.per_request == structural_hits(reqs, 16, count_outputs=outputs).per_request
        assert counted.hit_rate >= 0.95


def test_sessions_arrive_as_configured_and_are_deterministic():
    cfg = AgenticConfig(sessions=200, turns=2, first_prompt_len=100, append_len=10, output_len=5, max_len=1000,
                        session_arrival="poisson", session_rate=4.0, think_s=1.5, seed=9)
    reqs = agentic_sessions(cfg)
    starts = sorted(r.arrival_s for r in reqs if r.turn == 1)
    assert (len(starts) - 1) / (starts[-1] - starts[0]) == pytest.approx(4.0, rel=0.2)
    by_id = {r.request_id: r for r in reqs}
    assert all(r.arrival_s == by_id[r.prev_request_id].arrival_s + 1.5 and r.think_s == 1.5
               for r in reqs if r.turn == 2)
    again = agentic_sessions(cfg)
    assert [r.prompt_token_ids.tolist() for r in again[:5]] == [r.prompt_token_ids.tolist() for r in reqs[:5]]
    other = agentic_sessions(AgenticConfig(sessions=2, turns=1, seed=10))
    assert other[0].prompt_token_ids.tolist()[:32] != agentic_sessions(
        AgenticConfig(sessions=2, turns=1, seed=11))[0].prompt_token_ids.tolist()[:32]


def test_sessions_end_before_max_len_and_bad_configs_say_what_to_fix():
    reqs = agentic_sessions(AgenticConfig(sessions=1, turns=100, first_prompt_len=100, append_len=50,
                                          output_len=50, max_len=600, jitter=0))
    assert [r.prompt_len + r.max_tokens for r in reqs] == [150, 250, 350, 450, 550]
    with pytest.raises(InvalidArgument, match="max_len"):
        agentic_sessions(AgenticConfig(first_prompt_len=5000, max_len=4096, jitter=0))
    with pytest.raises(InvalidArgument, match="session arrival"):
        agentic_sessions(AgenticConfig(session_arrival="gamma"))
    with pytest.raises(InvalidArgument, match="unknown agentic preset"):
        AgenticConfig.preset("8k")
    with pytest.raises(InvalidArgument):
        agentic_sessions(AgenticConfig(sessions=0))


def test_jsonl_export(tmp_path):
    reqs = agentic_sessions(AgenticConfig(sessions=2, turns=3).scaled(1 / 32))
    out = tmp_path / "w.jsonl"
    assert mt.write_jsonl(reqs, out) == len(reqs)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[1]["prompt_token_ids"] == reqs[1].prompt_token_ids.tolist()
    assert {"request_id", "session_id", "turn", "arrival_s", "max_tokens", "shared_prefix_tokens",
            "prev_request_id"} <= rows[0].keys()
    mt.write_jsonl(reqs, out, with_tokens=False)
    assert "prompt_token_ids" not in json.loads(out.read_text().splitlines()[0])


# --- closed-loop sessions -------------------------------------------------------------------------------------


def test_closed_loop_turns_embed_the_generated_output():
    plan = session_plans(AgenticConfig(sessions=1, turns=4, first_prompt_len=40, append_len=6, output_len=5,
                                       max_len=4096, jitter=0))[0]
    first = plan.first_turn()
    assert first.turn == 1 and first.prev_request_id is None and first.prompt_len == 40
    generated = [11, 12, 13]  # shorter than max_tokens: a model may stop early
    second = plan.next_turn(first, generated)
    tokens = list(second.prompt_token_ids)
    assert tokens[:40] == list(first.prompt_token_ids) and tokens[40:43] == generated
    assert tokens[43:] == plan.appends[0].tolist() and len(tokens) == 49
    assert second.shared_prefix_tokens == 43 and second.prev_request_id == first.request_id
    assert second.turn == 2 and second.max_tokens == 5 and second.request_id == "s0-t2"
    third = plan.next_turn(second, [7] * 5)
    assert list(third.prompt_token_ids)[:54] == tokens + [7] * 5 and third.shared_prefix_tokens == 54
    fourth = plan.next_turn(third, [])
    assert plan.next_turn(fourth, [1]) is None  # its turns ran out
    # What the cache can serve: the previous context, whole blocks only.
    hits = prefix_hits([first, second], 8).per_request
    assert hits == [0, 40]  # turn 1's prompt blocks; the generated tokens were never in a prompt before


def test_closed_loop_with_the_assumed_outputs_is_the_open_loop():
    cfg = AgenticConfig(sessions=3, turns=8, seed=4).scaled(1 / 16)
    open_loop = {r.request_id: r for r in agentic_sessions(cfg)}
    for plan in session_plans(cfg):
        turn = plan.first_turn()
        while turn is not None:
            want = open_loop.pop(turn.request_id)
            assert list(turn.prompt_token_ids) == want.prompt_token_ids.tolist()
            assert (turn.shared_prefix_tokens, turn.max_tokens, turn.arrival_s, turn.prev_request_id) == (
                want.shared_prefix_tokens, want.max_tokens, want.arrival_s, want.prev_request_id)
            turn = plan.next_turn(turn, want.output_token_ids.tolist())
    assert not open_loop


def test_closed_loop_ends_before_max_len_and_checks_the_session():
    plan, other = session_plans(AgenticConfig(sessions=2, turns=50, first_prompt_len=100, append_len=50,
                                              output_len=50, max_len=400, jitter=0))
    turn, lengths = plan.first_turn(), []
    while turn is not None:
        lengths.append(turn.prompt_len)
        turn = plan.next_turn(turn, [5] * 20)  # shorter outputs than planned: the session runs longer
    assert lengths == [100, 170, 240, 310]  # 380 + 50 would pass 400
    with pytest.raises(InvalidArgument, match="belongs to session"):
        other.next_turn(plan.first_turn(), [1])
