"""The beam search's rules on hand-made token tables (transformers' rules; tests/seawall/offline/test_beam_search.py
checks the whole search against transformers itself)."""

from __future__ import annotations

import math

import pytest

from services.common.beam_search import BeamParams, BeamSearch, Hypothesis, beam_params, hypothesis_text
from services.common.errors import InvalidArgument
from services.common.sampling_params import SamplingParams

END = 0


def lp(p: float) -> float:
    return math.log(p)


def test_the_first_step_opens_the_best_width_beams_from_the_prompt():
    search = BeamSearch(BeamParams(2, 5, end_token_ids=(END,)))
    search.advance([[(7, lp(0.5)), (8, lp(0.3)), (9, lp(0.2))]])
    assert [b.token_ids for b in search.running] == [[7], [8]]
    assert search.running[1].logprob == pytest.approx(lp(0.3))
    assert not search.done and not search.finished


def test_beams_continue_from_the_best_sums_whichever_beam_they_extend():
    search = BeamSearch(BeamParams(2, 5, end_token_ids=(END,)))
    search.advance([[(7, lp(0.5)), (8, lp(0.4))]])
    # 7 -> 3 (0.5 * 0.3), 8 -> 4 (0.4 * 0.9), 8 -> 5 (0.4 * 0.05): both new beams may come from one old beam
    search.advance([[(3, lp(0.3)), (2, lp(0.2))], [(4, lp(0.9)), (5, lp(0.05))]])
    assert [b.token_ids for b in search.running] == [[8, 4], [7, 3]]


def test_an_end_token_within_the_best_width_is_kept_as_a_hypothesis_and_the_beams_go_on_without_it():
    search = BeamSearch(BeamParams(2, 5, length_penalty=1.0, end_token_ids=(END,)))
    search.advance([[(END, lp(0.6)), (7, lp(0.3)), (8, lp(0.1))]])
    assert [b.token_ids for b in search.running] == [[7], [8]]
    assert search.finished == [Hypothesis([END], pytest.approx(lp(0.6)), pytest.approx(lp(0.6)), "stop")]


def test_an_end_token_below_the_best_width_is_dropped():
    search = BeamSearch(BeamParams(2, 5, end_token_ids=(END,)))
    search.advance([[(7, lp(0.5)), (8, lp(0.3)), (END, lp(0.2))]])
    assert search.finished == [] and [b.token_ids for b in search.running] == [[7], [8]]


def test_an_end_token_reached_below_the_best_width_is_dropped_while_the_beams_fill():
    search = BeamSearch(BeamParams(2, 5, end_token_ids=(END,)))
    search.advance([[(7, lp(0.5)), (8, lp(0.5))]])
    # [7, 3] 0.3, [7, END] 0.15, [8, END] 0.125 (rank 3: beyond the width), [8, 4] 0.1
    search.advance([[(3, lp(0.6)), (END, lp(0.3))], [(END, lp(0.25)), (4, lp(0.2))]])
    assert [b.token_ids for b in search.running] == [[7, 3], [8, 4]]
    assert [h.token_ids for h in search.finished] == [[7, END]]


def test_scores_divide_by_the_generated_length_to_the_length_penalty():
    for penalty in (0.0, 1.0, 2.0, -1.0):
        search = BeamSearch(BeamParams(2, 5, length_penalty=penalty, end_token_ids=(END,)))
        search.advance([[(7, lp(0.9)), (8, lp(0.1))]])
        search.advance([[(END, lp(0.8)), (3, lp(0.1))], [(4, lp(0.5)), (END, lp(0.5))]])
        (hyp,) = search.finished
        assert hyp.token_ids == [7, END]
        assert hyp.score == pytest.approx((lp(0.9) + lp(0.8)) / 2 ** penalty, rel=1e-6)


def test_the_last_allowed_token_finishes_the_best_width_candidates_by_length():
    search = BeamSearch(BeamParams(2, 2, end_token_ids=(END,)))
    search.advance([[(7, lp(0.6)), (8, lp(0.4))]])
    # [8, 4] 0.36, [7, END] 0.33, [7, 3] 0.27: the best two finish, by length and by their end token
    search.advance([[(END, lp(0.55)), (3, lp(0.45))], [(4, lp(0.9)), (5, lp(0.1))]])
    assert search.done and not search.running
    assert [(h.token_ids, h.finish_reason) for h in search.result()] == [([8, 4], "length"), ([7, END], "stop")]


def test_early_stopping_true_ends_once_width_hypotheses_are_kept():
    search = BeamSearch(BeamParams(1, 9, early_stopping=True, end_token_ids=(END,)))
    search.advance([[(END, lp(0.3)), (7, lp(0.7))]])  # the end ranks second: beyond the width of 1
    assert not search.done
    search.advance([[(END, lp(0.9)), (7, lp(0.1))]])
    assert search.done and search.result()[0].token_ids == [7, END]


def test_early_stopping_true_ends_even_where_an_open_beam_could_still_win():
    for early, done in ((True, True), (False, False)):
        search = BeamSearch(BeamParams(2, 9, early_stopping=early, end_token_ids=(END,)))
        search.advance([[(7, lp(0.5)), (END, lp(0.3)), (8, lp(0.2))]])
        # hypotheses [END] (log 0.3) and [7, END] (log 0.25 / 2); the open [7, 3] scores log 0.2 / 2, above the first
        search.advance([[(END, lp(0.5)), (3, lp(0.4))], [(4, lp(0.1)), (5, lp(0.05))]])
        assert len(search.finished) == 2 and search.done is done


def test_without_early_stopping_it_ends_when_no_open_beam_can_beat_the_worst_hypothesis():
    search = BeamSearch(BeamParams(1, 9, early_stopping=False, length_penalty=1.0, end_token_ids=(END,)))
    search.advance([[(END, lp(0.6)), (7, lp(0.4))]])
    # the hypothesis scores log 0.6; the open beam log 0.4 (over 1 token): it cannot catch up at this length
    assert search.done
    search = BeamSearch(BeamParams(1, 9, early_stopping=False, length_penalty=2.0, end_token_ids=(END,)))
    search.advance([[(7, lp(0.9)), (END, lp(0.1))]])
    search.advance([[(END, lp(0.5)), (7, lp(0.5))]])  # hypothesis log(.45) / 4; the open beam log(.45) / 4: a tie
    assert search.done


def test_never_with_a_positive_penalty_judges_open_beams_at_the_longest_length():
    args = dict(length_penalty=2.0, end_token_ids=(END,))
    for early, done in ((False, True), ("never", False)):
        search = BeamSearch(BeamParams(1, 9, early_stopping=early, **args))
        search.advance([[(END, lp(0.5)), (7, lp(0.45))]])
        assert search.done is done


def test_parameters_are_checked_and_say_what_to_send():
    with pytest.raises(InvalidArgument, match="beam width"):
        BeamParams(0, 4)
    with pytest.raises(InvalidArgument, match="early_stopping"):
        BeamParams(2, 4, early_stopping="sometimes")
    with pytest.raises(InvalidArgument, match="length_penalty"):
        BeamParams(2, 4, length_penalty=math.inf)
    with pytest.raises(InvalidArgument, match="n <= 18"):
        BeamParams(19, 4, end_token_ids=(1, 2))
    assert BeamParams(18, 4, end_token_ids=(1, 2)).top_needed == 20


def test_a_request_s_beam_reads_its_ends_and_length_and_refuses_what_it_cannot_honour():
    beam = beam_params(SamplingParams(max_tokens=50, stop_token_ids=(9, 1)), 3, 0.5, "never", (1, 2), room=20)
    assert beam == BeamParams(3, 20, 0.5, "never", (1, 2, 9))
    assert beam_params(SamplingParams(ignore_eos=True), 2, 1.0, False, (1,), 100).end_token_ids == ()
    for refused in (dict(top_p=0.5), dict(logprobs=2), dict(presence_penalty=1.0), dict(stop=("x",))):
        with pytest.raises(InvalidArgument, match=f"{next(iter(refused))} cannot be used with beam search"):
            beam_params(SamplingParams(**refused), 2, 1.0, False, (1,), 100)


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_a_hypothesis_s_text_leaves_its_end_token_out_as_an_output_would():
    params = SamplingParams()
    assert hypothesis_text(_Tokenizer().decode, Hypothesis([4, 5, 1], 0.0, 0.0, "stop"), params, (1,)) == "4 5"
    assert hypothesis_text(_Tokenizer().decode, Hypothesis([4, 5, 1], 0.0, 0.0, "length"), params, (1,)) == "4 5 1"
    kept = SamplingParams(include_stop_str_in_output=True)
    assert hypothesis_text(_Tokenizer().decode, Hypothesis([4, 1], 0.0, 0.0, "stop"), kept, (1,)) == "4 1"
