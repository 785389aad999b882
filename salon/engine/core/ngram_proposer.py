"""Draft tokens from a request's own context (prompt lookup, as vLLM's n-gram proposer).

A dialogue repeats itself: names, quoted lines, code, the phrasing of earlier turns. For n from
max_ngram down to min_ngram, the proposer looks for the most recent earlier occurrence of the
context's last n tokens and proposes the (at most k) tokens that followed it:

    context  ... a b c d e ... x y a b c   (n = 3: "a b c" occurred before, followed by "d e ...")
    drafts                                  d e ...

The scheduler verifies the drafts in the request's next step (speculative decoding, see
scheduler.py); a draft costs one more token of that step and is worthless unless the model
would have produced it, so nothing is proposed without a match.

Per request, an index maps every n-gram of the context to the end of its latest occurrence. It is
built once and extended by the tokens appended since (a context only grows: rejected drafts are
never appended), so a proposal costs O(new tokens), not O(context).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class _ContextIndex:
    # Per n (index n - min_ngram): n-gram -> end position (exclusive) of its latest occurrence that
    # is followed by at least one token.
    latest_end: list[dict[tuple[int, ...], int]]
    # n-grams ending at positions <= num_indexed are in latest_end.
    num_indexed: int = 0


@dataclass
class NgramProposer:
    num_draft_tokens: int
    min_ngram: int = 2
    max_ngram: int = 4
    _indexes: dict[str, _ContextIndex] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min ({self.min_ngram}) <= max ({self.max_ngram})")

    def propose(self, key: str, context: Sequence[int], max_tokens: int | None = None) -> list[int]:
        """Up to min(num_draft_tokens, max_tokens) tokens that followed the latest earlier occurrence
        of the longest matching suffix n-gram of context; [] when no suffix of min_ngram tokens recurs.
        key names the context (a request id): its index is kept until forget(key)."""
        k = self.num_draft_tokens if max_tokens is None else min(self.num_draft_tokens, max_tokens)
        if k <= 0 or len(context) <= self.min_ngram:
            return []
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = _ContextIndex([{} for _ in range(self.min_ngram, self.max_ngram + 1)])
        end = len(context)
        # Index the n-grams ending before the context's end: the suffix itself is not an earlier occurrence.
        for e in range(max(index.num_indexed + 1, self.min_ngram), end):
            for n in range(self.min_ngram, min(self.max_ngram, e) + 1):
                index.latest_end[n - self.min_ngram][tuple(context[e - n : e])] = e
        index.num_indexed = max(index.num_indexed, end - 1)
        for n in range(min(self.max_ngram, end - 1), self.min_ngram - 1, -1):
            found = index.latest_end[n - self.min_ngram].get(tuple(context[end - n :]))
            if found is not None:
                return list(context[found : found + k])
        return []

    def forget(self, key: str) -> None:
        self._indexes.pop(key, None)


def propose_reference(context: Sequence[int], k: int, min_ngram: int, max_ngram: int) -> list[int]:
    """The same rule by a plain scan over the context (the index's reference in tests)."""
    end = len(context)
    for n in range(min(max_ngram, end - 1), min_ngram - 1, -1):
        suffix = list(context[end - n :])
        for e in range(end - 1, n - 1, -1):
            if list(context[e - n : e]) == suffix:
                return list(context[e : e + k])
    return []
