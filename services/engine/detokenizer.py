"""Turns a request's output tokens into text one token at a time, and ends it on a stop string.

Text moves through three regions of ``text`` (all offsets are characters)::

    text:  | released (sent to the client) | held back | <- next delta appended here
           0                            released      len(text)

A character is held back only while it could be the start of a stop string; it is released as soon as
the text after it rules that out, so a client never sees part of a stop string. When a stop string
appears, ``text`` is cut before it (after it with ``include_stop_str_in_output``), the rest of ``text``
up to the cut is released and ``finished_by_stop_string`` names the match.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from services.common.sampling_params import SamplingParams

try:  # tokenizers >= 0.21
    from tokenizers.decoders import DecodeStream
except ImportError:  # pragma: no cover - exercised by monkeypatching DecodeStream to None in tests
    DecodeStream = None

# Prompt tokens used to prime the decoder, so a first output token like "▁Hello" keeps its space.
_MIN_PRIME, _MAX_PRIME = 4, 24


class IncrementalDetokenizer:
    """One request's output text. Not thread-safe; one instance per request.

    ``prompt_token_ids`` (optional) primes the decoder with the prompt's last few tokens: SentencePiece
    style decoders drop the leading space of the first decoded token otherwise.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        params: SamplingParams,
        skip_special_tokens: bool | None = None,
        prompt_token_ids: Sequence[int] = (),
    ) -> None:
        self._params = params
        if skip_special_tokens is None:  # the request's own choice
            skip_special_tokens = params.skip_special_tokens
        self._max_stop = max((len(s) for s in params.stop), default=0)
        prefix = _prompt_suffix(tokenizer, prompt_token_ids)
        if DecodeStream is not None:
            self._decoder: _StreamDecoder | _OffsetDecoder = _StreamDecoder(tokenizer, skip_special_tokens, prefix)
        else:
            self._decoder = _OffsetDecoder(tokenizer, skip_special_tokens, prefix)
        # The text is kept as a settled head (pieces no search or release will touch again) and a short tail:
        # appending to one ever-growing string copied it whole on every token (7.4 us a token at 20k+ tokens
        # against 2.5 us at the start). Offsets below are into the whole text.
        self._head: list[str] = []
        self._base = 0  # characters in the head
        self._tail = ""
        self._released = 0
        # Stop strings must start at or after this offset: text decoded before min_tokens is not searched.
        self._floor = 0
        self.num_tokens = 0
        self.finished_by_stop_string: str | None = None

    @property
    def text(self) -> str:
        """The output text so far, held-back text included; cut at the stop string once one matched."""
        if len(self._head) > 1:
            self._head = ["".join(self._head)]
        return "".join(self._head) + self._tail

    @property
    def _length(self) -> int:
        return self._base + len(self._tail)

    @property
    def finished(self) -> bool:
        return self.finished_by_stop_string is not None

    def push(self, token_id: int) -> str:
        """Append one output token; return the text that became final (possibly ""), for streaming.

        After a stop string matched (``finished`` is True) the request is over: pushing is a caller bug.
        """
        if self.finished_by_stop_string is not None:
            raise RuntimeError(
                f"push() after the output finished on stop string {self.finished_by_stop_string!r}"
            )
        self.num_tokens += 1
        delta = self._step(token_id)
        self._settle()
        return delta

    def push_stop_token(self) -> None:
        """The token that ended the output as a stop token (an eos, or one of ``stop_token_ids``): counted, its
        text left out, as vLLM leaves it out (the request's ``include_stop_str_in_output`` keeps it: ``push``)."""
        self.num_tokens += 1

    def _step(self, token_id: int) -> str:
        old_len = self._length
        self._tail += self._decoder.step(token_id)
        if not self._params.stop:
            return self._release(self._length)
        if self.num_tokens < self._params.min_tokens:
            self._floor = self._length
            return self._release(self._length)

        match = self._find_stop(max(self._floor, old_len - self._max_stop + 1))
        if match is not None:
            start, stop = match
            end = start + len(stop) if self._params.include_stop_str_in_output else start
            assert end >= self._released, f"stop string {stop!r} at {start} overlaps released text"
            self._tail = self._tail[: end - self._base]
            self.finished_by_stop_string = stop
            return self._release(end)
        if self._params.include_stop_str_in_output:
            return self._release(self._length)
        return self._release(self._length - self._held_back())

    def _settle(self) -> None:
        """Moves text into the head once nothing will read it again: released, and too far back for the next
        token to complete a stop string that starts in it."""
        keep_from = min(self._released, self._length - self._max_stop + 1)
        if keep_from > self._base:
            cut = keep_from - self._base
            self._head.append(self._tail[:cut])
            self._tail = self._tail[cut:]
            self._base = keep_from

    def flush(self) -> str:
        """Release the held-back text; call once the request finished for any other reason."""
        return self._release(self._length)

    def _release(self, end: int) -> str:
        delta = self._tail[self._released - self._base : end - self._base]
        self._released = max(self._released, end)
        return delta

    def _find_stop(self, start: int) -> tuple[int, str] | None:
        """The earliest stop string occurrence starting at or after ``start``; ties go to the first listed."""
        best: tuple[int, str] | None = None
        for stop in self._params.stop:
            idx = self._tail.find(stop, max(start - self._base, 0))
            if idx != -1 and (best is None or idx + self._base < best[0]):
                best = (idx + self._base, stop)
        return best

    def _held_back(self) -> int:
        """Length of the longest unreleased suffix of ``text`` that is a proper prefix of a stop string."""
        pending = self._length - max(self._released, self._floor)
        for n in range(min(pending, self._max_stop - 1), 0, -1):
            suffix = self._tail[-n:]
            if any(stop.startswith(suffix) for stop in self._params.stop):
                return n
        return 0


class _StreamDecoder:
    """``tokenizers.decoders.DecodeStream``: buffers bytes of a UTF-8 character split across tokens."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool, prefix: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        for token_id in prefix:
            self._stream.step(tokenizer, token_id)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._tokenizer, token_id) or ""


class _OffsetDecoder:
    """Fallback for tokenizers without DecodeStream: decode a short window and diff against its prefix.

    ``ids[:read]`` has been emitted; ``ids[:prefix]`` is dropped context. A delta is emitted only once
    the window decodes to more text that does not end in U+FFFD (an incomplete UTF-8 character).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool, prefix: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prefix)
        self._read = len(self._ids)

    def step(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._tokenizer.decode(self._ids[: self._read], skip_special_tokens=self._skip)
        after = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        del self._ids[: self._read]
        self._read = len(self._ids)
        return after[len(before) :]


def _prompt_suffix(tokenizer: Tokenizer, prompt_token_ids: Sequence[int]) -> Sequence[int]:
    """The shortest prompt tail of at least 4 tokens that decodes to whole characters (vLLM's choice)."""
    if len(prompt_token_ids) <= _MIN_PRIME:
        return prompt_token_ids
    for n in range(_MIN_PRIME, min(len(prompt_token_ids), _MAX_PRIME) + 1):
        suffix = prompt_token_ids[-n:]
        if "\ufffd" not in tokenizer.decode(list(suffix), skip_special_tokens=False):
            return suffix
    return ()
