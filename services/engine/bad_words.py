"""vLLM's ``bad_words``: words the output must not write, as the token sequences that would write them.

Each word counts as encoded alone ("word", which starts a text) and after a space (" word", in the middle of
one) when that is a different first token of the same length, vLLM's rule for tokenizers that mark a word's
leading space in its first token. The sampler bans a sequence's last token wherever the output ends with the
tokens before it (so a one-token word is banned everywhere); only the output counts, not the prompt, as in
vLLM. Both the scheduler (to refuse a word at intake) and the worker (to ban it) encode with the checkpoint's
tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from services.common.errors import InvalidArgument


def bad_words_token_ids(tokenizer: Tokenizer, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """The token sequences ``words`` stand for; raises InvalidArgument for a word that encodes to nothing."""
    out: list[tuple[int, ...]] = []
    for word in words:
        alone = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False).ids)
        if not alone:
            raise InvalidArgument(f"bad_words: {word!r} is no token of this model's tokenizer")
        out.append(alone)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False).ids)
        if spaced[0] != alone[0] and len(spaced) == len(alone):
            out.append(spaced)
    return tuple(out)
