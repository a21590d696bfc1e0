"""Sampled tokens' logprobs in the OpenAI API's two shapes: the completions API's parallel lists and the chat
API's list of token objects. Shared by the HTTP API (also per streamed chunk) and ``seawall run-batch``.

``text`` turns one token id into its text (``TokenTexts``). A token that holds part of a multi-byte character
decodes to U+FFFD on its own, as in vLLM and OpenAI's own responses; the chat shape's ``bytes`` carry what
that text encodes to. With ``as_ids`` (vLLM's ``return_tokens_as_token_ids``) tokens are named
``token_id:ID`` instead, which says exactly which token where texts cannot (part of a character, several
tokens with one text); offsets and ``bytes`` still follow the texts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tokenizers import Tokenizer

from services.common.step import SampledToken


class TokenTexts:
    """Token id → its text, decoded once per id: a response repeats the same top candidates at many positions."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return text


def token_id_name(token_id: int) -> str:
    """A token as vLLM's ``return_tokens_as_token_ids`` names it."""
    return f"token_id:{token_id}"


def completion_logprobs(tokens: Sequence[SampledToken], text: Callable[[int], str], offset: int = 0,
                        as_ids: bool = False) -> dict[str, Any]:
    """``/v1/completions``' ``logprobs`` object. ``offset``: characters of the choice's text before these tokens
    (a streamed chunk continues its choice's ``text_offset``). ``top_logprobs_ids`` (Seawall's, as
    ``return_token_ids``) keeps the candidates' ids, which texts alone can confuse."""
    texts = [text(t.token_id) for t in tokens]
    offsets = []
    for piece in texts:
        offsets.append(offset)
        offset += len(piece)
    name = token_id_name if as_ids else text
    return {
        "tokens": [token_id_name(t.token_id) for t in tokens] if as_ids else texts,
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{name(tid): lp for tid, lp in t.top_logprobs} for t in tokens],
        "text_offset": offsets,
        "top_logprobs_ids": [[[tid, lp] for tid, lp in t.top_logprobs] for t in tokens],
    }


def chat_logprobs(tokens: Sequence[SampledToken], text: Callable[[int], str], as_ids: bool = False) -> dict[str, Any]:
    """``/v1/chat/completions``' ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    def entry(token_id: int, logprob: float | None) -> dict[str, Any]:
        piece = text(token_id)
        return {"token": token_id_name(token_id) if as_ids else piece, "logprob": logprob,
                "bytes": list(piece.encode())}

    return {"content": [{**entry(t.token_id, t.logprob),
                         "top_logprobs": [entry(tid, lp) for tid, lp in t.top_logprobs]} for t in tokens]}


def echoed_completion_logprobs(prompt_ids: Sequence[int], scores: Sequence[SampledToken],
                               tokens: Sequence[SampledToken], text: Callable[[int], str],
                               as_ids: bool = False) -> dict[str, Any]:
    """``completion_logprobs`` of an echoed completion: the prompt's tokens first, then ``tokens``. The prompt's
    first token has no score (nothing comes before it: null entries, as OpenAI has them), the others ``scores``
    (positions 1, 2, ...)."""
    head = completion_logprobs([SampledToken(prompt_ids[0]), *scores] if prompt_ids else [], text, as_ids=as_ids)
    if prompt_ids:
        head["top_logprobs"][0] = head["top_logprobs_ids"][0] = None
    tail = completion_logprobs(tokens, text, sum(len(text(t)) for t in echoed_ids(prompt_ids, scores)), as_ids)
    return {key: head[key] + tail[key] for key in head}


def echoed_ids(prompt_ids: Sequence[int], scores: Sequence[SampledToken]) -> list[int]:
    """The prompt tokens an echoed completion's logprobs list: its first, then those ``scores`` score."""
    return [prompt_ids[0], *(s.token_id for s in scores)] if prompt_ids else []


def vllm_prompt_logprobs(prompt_ids: Sequence[int], scores: Sequence[SampledToken],
                         text: Callable[[int], str]) -> list[dict[str, dict[str, Any]] | None]:
    """A choice's ``prompt_logprobs`` as vLLM returns them (a request's ``prompt_logprobs: k``): per prompt
    position, None for the first, then ``{token id: {logprob, rank, decoded_token}}`` for the prompt's token and
    the k most likely ones."""
    out: list[dict[str, dict[str, Any]] | None] = [None] if prompt_ids else []
    for score in scores:
        entry = {str(tid): {"logprob": lp, "rank": rank, "decoded_token": text(tid)}
                 for rank, (tid, lp) in enumerate(score.top_logprobs, 1)}
        entry[str(score.token_id)] = {"logprob": score.logprob, "rank": score.rank,
                                      "decoded_token": text(score.token_id)}
        out.append(entry)
    return out
