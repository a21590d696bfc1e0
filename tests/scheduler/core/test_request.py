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


def test_an_activated_loras_hashes_are_the_base_models_until_the_block_it_starts_in():
    from services.common.block_hash import SwitchedSeed, salted_seed
    from services.common.step import LoraRef

    tokens, seed = list(range(100, 180)), 7
    base = extend_hashes([], tokens, 16, seed)
    lora = LoraRef("a", "/a")
    activated = Request("r", tokens, SamplingParams(), 0.0, lora=lora, lora_from=37)
    assert activated.hash_salt == "" and activated.activated_salt == "lora|a|/a|from|37"
    switched = extend_hashes([], tokens, 16, SwitchedSeed(seed, 37 // 16, activated.activated_salt))
    assert switched[:2] == base[:2] and not set(switched[2:]) & set(base)
    elsewhere = extend_hashes([], tokens, 16, SwitchedSeed(seed, 2, "lora|a|/a|from|40"))
    assert elsewhere[:2] == base[:2] and not set(elsewhere[2:]) & set(switched)  # another start: other KV
    # Never invoked: the base model's blocks; a plain adapter's: its own from the first.
    assert Request("r", tokens, SamplingParams(), 0.0, lora=lora, lora_from=None).activated_salt == ""
    plain = Request("r", tokens, SamplingParams(), 0.0, lora=lora)
    assert plain.hash_salt == "lora|a|/a" and not plain.activated_salt
    assert extend_hashes([], tokens, 16, salted_seed(seed, plain.hash_salt))[0] != base[0]
