"""bad_words as token sequences: each word alone and, where the tokenizer writes it differently, after a space."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models

from services.common.errors import InvalidArgument
from services.engine.bad_words import bad_words_token_ids


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def test_a_word_counts_alone_and_after_a_space_when_that_is_another_token(tokenizer):
    def ids(text):
        return tuple(tokenizer.encode(text, add_special_tokens=False).ids)

    assert ids("the") != ids(" the") and len(ids(" the")) == 1  # this tokenizer marks a word's leading space
    assert bad_words_token_ids(tokenizer, ["the"]) == (ids("the"), ids(" the"))
    assert bad_words_token_ids(tokenizer, ["  the"]) == (ids("the"), ids(" the"))  # leading blanks do not count
    # " zebra" is a space token then "zebra": banning its last token after " " is the word alone's job.
    assert ids(" zebra")[1:] == ids("zebra")
    assert bad_words_token_ids(tokenizer, ["zebra"]) == (ids("zebra"),)
    assert bad_words_token_ids(tokenizer, ["hello world"]) == (ids("hello world"), ids(" hello world"))


def test_a_word_no_token_writes_is_refused():
    empty = Tokenizer(models.BPE())  # no vocabulary: nothing encodes
    with pytest.raises(InvalidArgument, match="'zebra' is no token"):
        bad_words_token_ids(empty, ["zebra"])
