"""The request's token view: prompt + outputs read in place, as block hashing does."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.block_hash import extend_hashes
from services.common.sampling_params import SamplingParams
from services.scheduler.core.request import Request, TokenIds


@given(head=st.lists(st.integers(0, 9), max_size=12), tail=st.lists(st.integers(0, 9), max_size=12),
       start=st.integers(-30, 30), stop=st.integers(-30, 30), step=st.sampled_from([None, 1, 2, -1]))
def test_the_view_reads_like_the_concatenated_list(head, tail, start, stop, step):
    view, whole = TokenIds(head, tail), head + tail
    assert len(view) == len(whole)
    assert view[start:stop:step] == whole[start:stop:step]
    assert list(view) == whole
    for i in (start, stop):
        if -len(whole) <= i < len(whole):
            assert view[i] == whole[i]
        else:
            with pytest.raises(IndexError):
                view[i]


def test_block_hashes_over_the_view_equal_those_over_a_copy():
    req = Request("r", list(range(3, 43)), SamplingParams(), 0.0, output_token_ids=list(range(50, 75)))
    assert len(req.token_ids) == 65
    assert extend_hashes([], req.token_ids, 16, seed=7) == extend_hashes([], req.all_token_ids, 16, seed=7)
    # the view follows the request's lists: tokens that arrive later are seen
    view = req.token_ids
    req.output_token_ids.extend([1] * 7)
    assert len(view) == 72 and view[-1] == 1
