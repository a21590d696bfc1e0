"""The batched sampler: greedy, penalties, truncation, seeded reproducibility and logprobs."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.sampling_params import SamplingParams
from services.engine.sampler import Sampler, SamplingRow, _apply_penalties, step_seed

sampler = Sampler()


def row(prompt=(), output=(), **params) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), list(prompt), list(output))


def random_rows(n: int, vocab: int, gen: torch.Generator) -> list[SamplingRow]:
    """A mixed batch: greedy, sampled, seeded and unseeded rows with assorted filters and penalties."""
    rows = []
    for i in range(n):
        out = torch.randint(0, vocab, (i % 5,), generator=gen).tolist()
        rows.append(row(
            prompt=torch.randint(0, vocab, (3,), generator=gen).tolist(), output=out,
            temperature=[0.0, 0.7, 1.0, 1.3][i % 4], top_k=[0, 5, 50][i % 3], top_p=[1.0, 0.8][i % 2],
            min_p=[0.0, 0.1][(i // 2) % 2], seed=None if i % 3 == 0 else 1000 + i,
            repetition_penalty=[1.0, 1.3][i % 2], presence_penalty=[0.0, 0.4][(i // 3) % 2],
            logprobs=[None, 2][i % 2],
        ))
    return rows


# --- greedy ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_equals_argmax(dtype):
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = sampler(logits, [row(temperature=0.0) for _ in range(6)])
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 6


def test_greedy_rows_in_a_mixed_batch_take_the_argmax():
    logits = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    rows = [row(temperature=0.0) if i % 2 == 0 else row(temperature=1.0, seed=i) for i in range(8)]
    out = sampler(logits, rows)
    assert out.token_ids[::2] == logits[::2].argmax(-1).tolist()


def test_logit_bias_moves_the_argmax_and_leaves_logprobs_raw():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(4))
    low = int(logits[0].argmin())
    rows = [row(temperature=0.0, logit_bias=((low, 100.0),), logprobs=1),  # the least likely token wins
            row(temperature=0.0),  # untouched beside it
            row(temperature=0.0, logit_bias=tuple(sorted((t, -100.0) for t in logits[2].topk(3).indices.tolist())))]
    out = sampler(logits, rows)
    assert out.token_ids[0] == low and out.token_ids[1] == int(logits[1].argmax())
    assert out.token_ids[2] == int(logits[2].topk(4).indices[3])  # the top 3 pushed down: the 4th
    raw = torch.log_softmax(logits[0], -1)
    assert out.logprobs[0].logprob == pytest.approx(float(raw[low])) and out.logprobs[0].rank == 50


def test_allowed_token_ids_bound_every_draw_and_the_argmax():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 64, generator=gen)
    allowed = (3, 17, 40)
    greedy = sampler(logits, [row(temperature=0.0, allowed_token_ids=allowed)])
    assert greedy.token_ids == [max(allowed, key=lambda t: float(logits[0, t]))]
    rows = [row(temperature=1.5, allowed_token_ids=allowed, seed=i) for i in range(40)] + [row(temperature=1.5)] * 40
    out = sampler(logits.expand(80, -1).contiguous(), rows)
    assert set(out.token_ids[:40]) <= set(allowed) and len(set(out.token_ids[:40])) > 1
    assert not set(out.token_ids[40:]) <= set(allowed)  # rows without the constraint draw from everything
    # Both at once: the bias applies within the allowed set.
    both = sampler(logits, [row(temperature=0.0, allowed_token_ids=allowed, logit_bias=((3, 100.0), (5, 100.0)))])
    assert both.token_ids == [3]


def _bitmask(tokens, vocab: int) -> torch.Tensor:
    words = torch.zeros(1, -(-vocab // 32), dtype=torch.int64)
    for t in tokens:
        words[0, t // 32] |= 1 << (t % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # bit 31 is the sign bit


def test_a_grammar_mask_bounds_greedy_and_sampled_rows_and_never_allows_tokens_past_its_words():
    logits = torch.randn(4, 70, generator=torch.Generator().manual_seed(6))  # 70 > 64: a third word, padded
    allowed = [2, 31, 33, 63]
    mask = _bitmask(allowed, 64)[:, :2]  # a tokenizer of 64 tokens under a model vocabulary of 70
    def masked(**params) -> SamplingRow:
        return SamplingRow(SamplingParams(**params), [], [], token_mask=mask)

    rows = [masked(temperature=0.0), masked(temperature=1.0, seed=1), row(temperature=0.0),
            masked(temperature=2.0, seed=2)]
    out = sampler(logits, rows)
    assert out.token_ids[0] == max(allowed, key=lambda t: float(logits[0, t]))
    assert {out.token_ids[1], out.token_ids[3]} <= set(allowed)
    assert out.token_ids[2] == int(logits[2].argmax())
    draws = sampler(logits[3:].expand(64, -1).contiguous(),
                    [masked(temperature=3.0, seed=s) for s in range(64)]).token_ids
    assert set(draws) == set(allowed)  # every allowed token drawn, bit 31 included, nothing else


def test_empty_batch_and_shape_mismatch():
    assert sampler(torch.empty(0, 10), []).token_ids == []
    with pytest.raises(ValueError, match=r"logits must be \[num_rows=2, vocab\], got \(3, 10\)"):
        sampler(torch.zeros(3, 10), [row(), row()])


@pytest.mark.parametrize("temperature", [1e-6, 1e-3, 1e-2])
def test_temperature_to_zero_approaches_greedy(temperature):
    # Distinct logits at least 0.5 apart: at T <= 1e-2 every other token has probability < e^-50.
    logits = torch.randperm(50, generator=torch.Generator().manual_seed(2)).float()[None, :] * 0.5
    logits = logits.repeat(20, 1)
    rows = [row(temperature=temperature, seed=s) for s in range(20)]
    assert sampler(logits, rows).token_ids == [int(logits[0].argmax())] * 20


# --- penalties -------------------------------------------------------------------------------------------


def test_penalties_match_hand_computation():
    logits = torch.tensor([[2.0, -1.0, 0.5, -0.5, 1.0, 0.0]])
    r = row(prompt=[0, 1], output=[2, 2, 3], repetition_penalty=2.0, presence_penalty=0.5,
            frequency_penalty=0.25)
    _apply_penalties(logits, [r])
    # repetition over {0,1,2,3}: 2/2, -1*2, 0.5/2, -0.5*2; then token 2 (count 2): 0.25 - 0.5 - 0.5,
    # token 3 (count 1): -1 - 0.25 - 0.5; tokens 4 and 5 untouched.
    expected = torch.tensor([[1.0, -2.0, -0.75, -1.75, 1.0, 0.0]])
    torch.testing.assert_close(logits, expected)


def test_penalties_only_touch_their_rows():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(3))
    before = logits.clone()
    rows = [row(output=[1, 2]), row(output=[1, 2], frequency_penalty=1.0), row(prompt=[5], repetition_penalty=1.5)]
    _apply_penalties(logits, rows)
    torch.testing.assert_close(logits[0], before[0])
    assert not torch.equal(logits[1], before[1]) and not torch.equal(logits[2], before[2])


def test_penalty_changes_greedy_choice():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    assert sampler(logits, [row(temperature=0, output=[0])]).token_ids == [0]
    assert sampler(logits, [row(temperature=0, output=[0], presence_penalty=0.2)]).token_ids == [1]
    assert sampler(logits, [row(temperature=0, prompt=[0], repetition_penalty=1.1)]).token_ids == [1]


@pytest.mark.oracle
def test_repetition_penalty_matches_hugging_face():
    from transformers import RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(4)
    for penalty in (0.5, 1.2, 2.0):
        logits = torch.randn(1, 300, generator=gen) * 3
        prompt = torch.randint(0, 300, (12,), generator=gen).tolist()
        output = torch.randint(0, 300, (7,), generator=gen).tolist()
        ours = logits.clone()
        _apply_penalties(ours, [row(prompt=prompt, output=output, repetition_penalty=penalty)])
        theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + output]), logits.clone())
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_rows_whose_constraints_rule_out_every_token_are_reported_greedy_or_sampled():
    logits = torch.randn(6, 64, generator=torch.Generator().manual_seed(7))
    grammar = SamplingRow(SamplingParams(temperature=0.0, allowed_token_ids=(5, 6)), [], [],
                          token_mask=_bitmask([7, 8], 64))  # the grammar allows neither allowed token
    rows = [
        grammar,
        row(temperature=0.0, allowed_token_ids=(0,), min_tokens=1),  # only eos allowed, and eos is held back
        row(temperature=1.0, seed=3, allowed_token_ids=(0, 1), min_tokens=1, stop_token_ids=(1,)),
        row(temperature=0.0, allowed_token_ids=(0, 9), min_tokens=1),  # 9 is still possible
        row(temperature=0.0),
        row(temperature=0.7, top_k=2, allowed_token_ids=(0,), output=[4]),  # min_tokens reached: eos possible
    ]
    out = sampler(logits, rows, eos_token_ids=(0,))
    assert out.no_token == [0, 1, 2]
    assert out.token_ids[3:] == [9, int(logits[4].argmax()), 0]
    assert sampler(logits, [row(temperature=0.0)] * 6).no_token == []


def test_bad_words_ban_a_words_last_token_where_the_output_ends_with_the_rest():
    logits = torch.zeros(4, 16)
    logits[:, 9] = 5.0  # 9 is everyone's argmax
    words = ((9,), (3, 4, 9)), ((3, 4, 9),), ((3, 4, 9),), ((2, 9),)
    outputs = [[], [7, 3, 4], [3, 4, 7], [2]]
    rows = [SamplingRow(SamplingParams(temperature=0.0, bad_words=("w",)), [], out, bad_words=w)
            for out, w in zip(outputs, words, strict=True)]
    out = sampler(logits, rows)
    # Banned everywhere (one token), after "3 4" (the output ends so), not after "3 4 7", and after "2".
    assert [t != 9 for t in out.token_ids] == [True, True, False, True]
    only = SamplingRow(SamplingParams(temperature=0.0, allowed_token_ids=(9,), bad_words=("w",)), [], [],
                       bad_words=((9,),))
    assert sampler(logits[:1], [only]).no_token == [0]  # the one allowed token is a bad word


# --- min_tokens ------------------------------------------------------------------------------------------


def test_min_tokens_suppresses_eos_and_stop_ids():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])  # eos=0 best, stop id 1 next, then 2
    eos = (0,)

    def pick(output, **kw):
        return sampler(logits, [row(output=output, temperature=0, **kw)], eos).token_ids[0]

    assert pick([], min_tokens=2, stop_token_ids=(1,)) == 2
    assert pick([7], min_tokens=2) == 1
    assert pick([7, 7], min_tokens=2, stop_token_ids=(1,)) == 0
    assert pick([], min_tokens=1, ignore_eos=True) == 1  # eos suppressed regardless, as in vLLM
    assert pick([], min_tokens=1, stop_token_ids=(10_000,)) == 1  # ids outside the vocab are skipped


# --- truncation: top-k / top-p / min-p -------------------------------------------------------------------


def allowed_tokens(logits: list[float], p: SamplingParams, tol: float = 1e-4) -> set[int]:
    """Reference (float64, generous at the boundaries): tokens top-k, top-p and min-p all keep."""
    z = torch.tensor(logits, dtype=torch.float64) / p.temperature
    vocab = len(logits)
    keep = torch.ones(vocab, dtype=torch.bool)
    if 0 < p.top_k < vocab:
        keep &= z >= z.sort(descending=True).values[p.top_k - 1]
    if p.top_p < 1.0:
        probs = z.masked_fill(~keep, -math.inf).softmax(-1)
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs
        last = int((before < p.top_p + tol).sum()) - 1
        keep &= z >= z[order[max(last, 0)]] - tol
    if p.min_p > 0.0:
        keep &= (z - z[keep].max()).exp() >= p.min_p * (1 - tol) - tol
    return set(torch.nonzero(keep).flatten().tolist())


def _randn_logits(seed: int, vocab: int, scale: float) -> list[float]:
    return (torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * scale).tolist()


# Hand-picked float lists find ties and extremes; randn lists give the spread that makes filters bite.
LOGITS = st.one_of(
    st.lists(st.floats(-8, 8, allow_nan=False, width=32), min_size=2, max_size=48),
    st.builds(_randn_logits, st.integers(0, 2**32), st.integers(2, 200), st.sampled_from([0.5, 1.0, 3.0])),
)


@settings(max_examples=200, deadline=None)
@given(
    logits=LOGITS,
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.8]),
    top_k=st.one_of(st.sampled_from([-1, 0]), st.integers(1, 60)),
    top_p=st.one_of(st.just(1.0), st.floats(0.01, 1.0)),
    min_p=st.sampled_from([0.0, 0.05, 0.3, 0.9]),
    seed=st.integers(0, 2**63 - 1),
)
def test_truncation_never_samples_outside_the_allowed_set(logits, temperature, top_k, top_p, min_p, seed):
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    allowed = allowed_tokens(logits, SamplingParams(**params))
    # 16 seeded draws (different steps) and 16 unseeded draws of the same row, in one batch.
    rows = [row(output=[0] * i, seed=seed, **params) for i in range(16)] + [row(**params)] * 16
    out = sampler(torch.tensor([logits] * 32), rows)
    assert set(out.token_ids) <= allowed


def test_truncation_holds_per_row_in_a_mixed_batch():
    """Rows with different filters share one batch (and the full-sort path); each keeps its own set."""
    gen = torch.Generator().manual_seed(10)
    filters = [dict(top_k=3), dict(top_p=0.5), dict(), dict(top_k=20, top_p=0.3), dict(min_p=0.5),
               dict(top_k=1, min_p=0.1), dict(temperature=0.0)]
    for trial in range(20):
        logits = torch.randn(len(filters), 100, generator=gen) * 2
        rows = [row(seed=trial * 10 + i, **f) for i, f in enumerate(filters)]
        out = sampler(logits, rows)
        for i, f in enumerate(filters):
            if f.get("temperature") == 0.0:
                assert out.token_ids[i] == int(logits[i].argmax())
            else:
                assert out.token_ids[i] in allowed_tokens(logits[i].tolist(), rows[i].params)


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(10, 30, generator=torch.Generator().manual_seed(5))
    for params in (dict(top_k=1), dict(top_p=1e-6)):
        out = sampler(logits, [row(seed=s, **params) for s in range(10)])
        assert out.token_ids == logits.argmax(-1).tolist()


def test_sampling_frequencies_follow_the_distribution():
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, -10.0])
    probs = logits.softmax(-1)
    torch.manual_seed(0)  # the unseeded draw uses the default generator
    unseeded = sampler(logits.repeat(20_000, 1), [row()] * 20_000).token_ids
    seeded = sampler(logits.repeat(4_000, 1), [row(seed=s) for s in range(4_000)]).token_ids
    for draws, tol in ((unseeded, 0.015), (seeded, 0.03)):
        counts = Counter(draws)
        freq = torch.tensor([counts[t] / len(draws) for t in range(5)])
        torch.testing.assert_close(freq, probs, atol=tol, rtol=0)


# --- seeds -----------------------------------------------------------------------------------------------


def test_seeded_row_is_the_same_alone_and_in_any_batch():
    gen = torch.Generator().manual_seed(6)
    vocab = 500
    target = row(prompt=[1, 2, 3], output=[4, 5], temperature=0.9, top_p=0.95, top_k=100, seed=1234,
                 repetition_penalty=1.1, logprobs=3)
    target_logits = torch.randn(vocab, generator=gen) * 2
    alone = sampler(target_logits[None, :], [target])
    for trial in range(5):
        others = random_rows(7, vocab, gen)
        pos = trial % 8
        rows = others[:pos] + [target] + others[pos:]
        logits = torch.randn(8, vocab, generator=gen) * 2
        logits[pos] = target_logits
        out = sampler(logits, rows)
        assert out.token_ids[pos] == alone.token_ids[0]
        assert out.logprobs[pos] == alone.logprobs[0]
    assert sampler(target_logits[None, :], [target]).token_ids == alone.token_ids  # and across calls


def test_seeded_draws_depend_on_seed_and_step():
    logits = torch.zeros(1, 1000)  # uniform: the draw is pure noise
    def draw(seed, step):
        return sampler(logits, [row(seed=seed, output=[0] * step)]).token_ids[0]
    assert draw(7, 3) == draw(7, 3)
    assert len({draw(7, step) for step in range(20)}) > 15
    assert len({draw(seed, 0) for seed in range(20)}) > 15


def test_step_seed_is_63_bit_and_spread():
    seeds = {step_seed(s, k) for s in (0, 1, 2**63 - 1) for k in range(100)}
    assert len(seeds) == 300
    assert all(0 <= x < 2**63 for x in seeds)


def test_seeded_sampling_is_reproducible_across_processes():
    code = (
        "import torch\n"
        "from services.engine.sampler import Sampler, SamplingRow\n"
        "from services.common.sampling_params import SamplingParams\n"
        "logits = torch.arange(200, dtype=torch.float32).sin()[None, :] * 3\n"
        "rows = [SamplingRow(SamplingParams(seed=s, top_p=0.9), [1], [2] * s) for s in range(10)]\n"
        "print(Sampler()(logits.repeat(10, 1), rows).token_ids)\n"
    )
    logits = torch.arange(200, dtype=torch.float32).sin()[None, :] * 3
    rows = [row(prompt=[1], output=[2] * s, seed=s, top_p=0.9) for s in range(10)]
    here = sampler(logits.repeat(10, 1), rows).token_ids
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert there.stdout.strip() == str(here)


# --- logprobs --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_are_of_the_raw_distribution(dtype):
    gen = torch.Generator().manual_seed(8)
    logits = (torch.randn(4, 80, generator=gen) * 3).to(dtype)
    rows = [
        row(temperature=0, logprobs=5),
        row(temperature=0.5, top_k=3, seed=1, logprobs=0, repetition_penalty=1.5, prompt=[1, 2]),
        row(temperature=1.0, logprobs=None),
        row(temperature=2.0, seed=2, logprobs=20, presence_penalty=1.0, output=[3, 4]),
    ]
    out = sampler(logits, rows)
    ref = torch.log_softmax(logits.float(), dim=-1)
    assert out.logprobs[2] is None
    for i in (0, 1, 3):
        lp = out.logprobs[i]
        n = rows[i].params.logprobs
        assert lp is not None and lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(float(ref[i, lp.token_id]), abs=1e-6)
        assert lp.rank == 1 + int((ref[i] > ref[i, lp.token_id]).sum())
        assert len(lp.top) == n
        assert [t for t, _ in lp.top] == ref[i].topk(n).indices.tolist() if n else lp.top == []
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        for token, value in lp.top:
            assert value == pytest.approx(float(ref[i, token]), abs=1e-6)
    assert out.logprobs[0].rank == 1  # greedy without penalties takes the best token


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_seeded_rows_are_batch_invariant_and_filters_hold():
    gen = torch.Generator().manual_seed(9)
    vocab = 32_000
    target = row(prompt=[1, 2], output=[3], temperature=0.8, top_k=50, top_p=0.9, min_p=0.02, seed=77,
                 frequency_penalty=0.5, logprobs=4)
    target_logits = (torch.randn(vocab, generator=gen) * 3).cuda()
    alone = sampler(target_logits[None, :], [target])
    logits = (torch.randn(16, vocab, generator=gen) * 3).cuda()
    logits[5] = target_logits
    rows = random_rows(16, vocab, gen)
    rows[5] = target
    out = sampler(logits, rows)
    assert out.token_ids[5] == alone.token_ids[0]
    assert out.logprobs[5] == alone.logprobs[0]
    assert alone.token_ids[0] in set(target_logits.topk(50).indices.tolist())
    greedy = [i for i, r in enumerate(rows) if r.params.is_greedy and not r.params.has_penalties]
    assert [out.token_ids[i] for i in greedy] == logits[greedy].argmax(-1).tolist()
