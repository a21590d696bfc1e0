"""Checks a request must pass before it is queued: what the model cannot run, or no pool can ever hold."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.errors import InvalidArgument, ResourceExhausted
from services.common.sampling_params import SamplingParams


def room(prompt_len: int, max_model_len: int, pool_tokens: int | None) -> int:
    """What a request may generate when it sets no limit (a chat's default, as vLLM's): the context left after
    the prompt, or, where less, what the pool holds after it (``pool_tokens``, the smallest pool it may land
    in; None where any context fits, as a sliding window's pool): a larger default would be refused as never
    fitting. At least 1: a prompt with no room left is refused by ``validate_request``, saying so."""
    limit = max_model_len if pool_tokens is None else min(max_model_len, pool_tokens)
    return max(limit - prompt_len, 1)


def validate_request(prompt_token_ids: Sequence[int], params: SamplingParams, vocab_size: int, max_model_len: int,
                     block_size: int, pool_blocks: int | None, whole_prompt_limit: int | None = None,
                     window_blocks: int | None = None) -> None:
    """Raises InvalidArgument for what the model or the scheduling policy cannot run, ResourceExhausted for what
    no pool can hold.

    ``pool_blocks``: blocks of the smallest pool the request may land in (None: not known yet).
    ``whole_prompt_limit``: ``SchedulerConfig.whole_prompt_limit``.
    ``window_blocks``: ``SchedulerConfig.window_blocks`` (a sliding-window model holds no more than that).
    """
    n = len(prompt_token_ids)
    if n == 0:
        raise InvalidArgument("prompt is empty; send at least one token")
    bad = next((t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidArgument(f"prompt token id {bad!r} is outside the vocabulary [0, {vocab_size})")
    params.check_vocab(vocab_size)
    if n >= max_model_len:
        raise InvalidArgument(f"prompt has {n} tokens; the model's context is {max_model_len}, leaving no room to "
                              "generate: shorten the prompt")
    worst = min(n + params.max_tokens, max_model_len)
    if whole_prompt_limit is not None and worst > whole_prompt_limit:
        # It would wait forever: vLLM refuses such a configuration at start; this refuses only what cannot fit.
        raise InvalidArgument(
            f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) may need {worst} tokens in one step: the "
            "scheduling policy runs a prompt whole (and a preempted request's prompt and output again), and a step "
            f"holds at most {whole_prompt_limit} (--max-num-batched-tokens): lower max_tokens or shorten the "
            "prompt, or serve with a larger --max-num-batched-tokens or a chunking policy (sarathi)")
    if pool_blocks is None:
        return
    # A request that cannot finish even alone in the pool would preempt itself forever: refuse it now.
    need = -(-worst // block_size)
    if window_blocks is not None:
        need = min(need, window_blocks)
    if need > pool_blocks:
        raise ResourceExhausted(
            f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) needs {need} KV blocks; the pool holds "
            f"{pool_blocks}: lower max_tokens or give the workers more KV memory (--kv-cache-bytes)")


MAX_CACHE_SALT_LEN = 1024


def check_cache_salt(salt: object) -> str:
    """vLLM's ``cache_salt`` as given (None: no salt): a non-empty string, so that an empty one is not mistaken
    for isolation it does not give."""
    if salt is None:
        return ""
    if not isinstance(salt, str) or not salt:
        raise InvalidArgument(f"cache_salt must be a non-empty string, got {salt!r}")
    if len(salt) > MAX_CACHE_SALT_LEN:
        raise InvalidArgument(f"cache_salt has {len(salt)} characters; at most {MAX_CACHE_SALT_LEN}")
    return salt
