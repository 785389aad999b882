"""The n-gram proposer: its incremental index proposes exactly what a plain scan of the context does."""

from __future__ import annotations

import random

import pytest

from salon.engine.core.ngram_proposer import NgramProposer, propose_reference


def test_fixed_contexts():
    p = NgramProposer(3, min_ngram=2, max_ngram=3)
    # "7 8 9" occurred before, followed by 1 2 3; the most recent occurrence wins.
    assert p.propose("a", [5, 7, 8, 9, 4, 4, 7, 8, 9, 1, 2, 3, 6, 7, 8, 9]) == [1, 2, 3]
    # No suffix of 2 tokens recurs: nothing.
    assert p.propose("b", [1, 2, 3, 4, 5]) == []
    # The longest match wins over a more recent shorter one: "1 2 3" (n = 3) before "2 3" (n = 2).
    assert p.propose("c", [1, 2, 3, 40, 41, 9, 2, 3, 50, 51, 1, 2, 3]) == [40, 41, 9]
    # At most max_tokens, and a match near the end proposes what there is.
    assert p.propose("d", [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], max_tokens=1) == [3]
    assert p.propose("e", [6, 6, 6]) == [6]
    assert NgramProposer(0).propose("f", [1, 2, 1, 2]) == []
    with pytest.raises(ValueError):
        NgramProposer(3, min_ngram=3, max_ngram=2)


@pytest.mark.parametrize("seed", range(20))
def test_incremental_index_matches_the_reference_scan(seed):
    rng = random.Random(seed)
    k, lo = rng.randint(1, 6), rng.randint(1, 3)
    hi = lo + rng.randint(0, 3)
    p = NgramProposer(k, lo, hi)
    vocab = rng.choice([3, 5, 12])
    context = [rng.randrange(vocab) for _ in range(rng.randint(0, 30))]
    for _ in range(60):  # the context grows by 1..5 tokens between proposals, as accepted drafts do
        room = rng.choice([None, 1, 3, 10])
        want = propose_reference(context, k if room is None else min(k, room), lo, hi)
        assert p.propose("r", context, room) == want, (context, k, lo, hi, room)
        context += [rng.randrange(vocab) for _ in range(rng.randint(1, 5))]
    p.forget("r")
    assert p.propose("r", context) == propose_reference(context, k, lo, hi)
