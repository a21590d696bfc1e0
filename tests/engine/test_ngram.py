"""N-gram drafts (services/engine/ngram.py): the longest suffix seen before, its latest occurrence, the tokens
that followed (as a loop past the end), and an index that grows with the sequence as a fresh one would be."""

from __future__ import annotations

import random

import pytest

from services.engine.ngram import MAX_N, MIN_N, NgramIndex


def _brute_force(tokens: list[int], k: int) -> list[int]:
    end = len(tokens)
    for n in range(min(MAX_N, end - 1), MIN_N - 1, -1):
        for e in range(end - 1, n - 1, -1):
            if tokens[e - n:e] == tokens[end - n:]:
                drafts = list(tokens[e:e + k])
                while len(drafts) < k:
                    drafts.append(drafts[len(drafts) - (end - e)])
                return drafts
    return []


def test_drafts_follow_the_latest_earlier_occurrence_of_the_suffix():
    tokens = [1, 2, 3, 9, 1, 2, 3, 4, 5, 6, 1, 2, 3]
    assert NgramIndex().propose(tokens, 3) == [4, 5, 6]  # (1, 2, 3) ended at 3 and at 7: the latest wins


def test_a_longer_match_beats_a_later_shorter_one():
    tokens = [7, 8, 9, 1, 5, 0, 8, 9, 2, 7, 8, 9]
    # (8, 9) last occurred at 8 (followed by 2), but (7, 8, 9) occurred at 3 (followed by 1).
    assert NgramIndex().propose(tokens, 2) == [1, 5]


def test_a_match_that_reaches_the_end_continues_as_a_loop():
    assert NgramIndex().propose([5, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]
    assert NgramIndex().propose([4, 4, 4], 4) == [4, 4, 4, 4]


def test_no_draft_without_an_earlier_match_of_min_n_tokens():
    assert NgramIndex().propose([1, 2, 3, 4, 5, 6], 3) == []
    assert NgramIndex().propose([1, 2, 3, 1], 3) == []  # one token matches; MIN_N is 2
    assert NgramIndex().propose([1, 2], 3) == []
    assert NgramIndex().propose([1, 2, 1, 2], 0) == []


@pytest.mark.parametrize("seed", range(20))
def test_the_growing_index_drafts_what_a_scan_of_the_whole_sequence_does(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5, 50])  # small vocabularies repeat often
    tokens = [rng.randrange(vocab) for _ in range(5)]
    index = NgramIndex()
    for _ in range(150):
        k = rng.randrange(1, 6)
        assert index.propose(tokens, k) == _brute_force(tokens, k), tokens
        tokens.extend(rng.randrange(vocab) for _ in range(rng.choice([1, 1, 1, 3])))
