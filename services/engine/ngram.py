"""Draft tokens by n-gram lookup in a sequence's own tokens (prompt lookup decoding; vLLM's "ngram" method).

The longest suffix of the sequence, from ``MAX_N`` tokens down to ``MIN_N``, that occurred before is looked
up, and the tokens that followed its latest earlier occurrence are the drafts. Outputs that copy from the
prompt (code edits, summaries, retrieval answers) or repeat themselves verify several tokens per pass.

Each sequence keeps an index (n-gram -> where its latest occurrence ended) that grows with the tokens, so a
proposal costs the new tokens' n-grams and one lookup per n, not a scan of the context.
"""

from __future__ import annotations

from collections.abc import Sequence

# Longer matches predict better; a single token matches often but drafts poorly (vLLM's prompt_lookup_max
# and _min; these are the sizes its docs' example uses).
MAX_N = 4
MIN_N = 2


class NgramIndex:
    """For one sequence: every n-gram (``MIN_N`` <= n <= ``MAX_N``) of its tokens that ends before the newest
    token, with the end of its latest occurrence."""

    __slots__ = ("_ends", "_indexed")

    def __init__(self) -> None:
        self._ends: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in _ends

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """``k`` tokens that followed the latest earlier occurrence of the longest matching suffix of
        ``tokens`` (read as a loop where they run past the end); empty when no suffix of ``MIN_N`` or more
        tokens occurred before. ``tokens`` only grows between calls (a sequence rebuilt from scratch gets a
        new index)."""
        end = len(tokens)
        if k < 1 or end <= MIN_N:
            return []
        ends = self._ends
        # The suffix itself (ending at ``end``) is indexed only once a newer token follows it.
        for e in range(max(self._indexed, MIN_N), end):
            for n in range(MIN_N, min(MAX_N, e) + 1):
                ends[tuple(tokens[e - n:e])] = e
        self._indexed = end
        for n in range(min(MAX_N, end - 1), MIN_N - 1, -1):
            e = ends.get(tuple(tokens[end - n:end]))
            if e is not None:
                # Past the newest token the continuation is the drafts themselves: a loop of period end - e.
                drafts = list(tokens[e:e + k])
                while len(drafts) < k:
                    drafts.append(drafts[len(drafts) - (end - e)])
                return drafts
        return []
