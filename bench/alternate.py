"""Same-run A/B on a noisy machine: several measurements taken in alternation, best of each.

Each round runs every measurement once, in the given order on even rounds and reversed on odd ones, so a
change of the machine's load, or what one leaves in the caches for the next, falls on all of them alike;
each keeps its best value over the rounds (the least disturbed one: the highest rate, the shortest time).
The kernel microbenchmarks (bench.gemv, bench.grammar) read their ratios off these bests.

A side-by-side figure (salon against the peer, or against a baseline of its own) is instead a ratio per round,
of that round's pair, reported as the median of the rounds' ratios and their range:
salon.loadgen.alternation (alternated_pairs, paired_ratio, figure_ratios), shared with `salon bench`.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def best_alternated(
    measures: dict[str, Callable[[], float]], rounds: int, higher_is_better: bool = False
) -> dict[str, float]:
    """{label: the best value measure() returned over `rounds` alternated rounds} (the lowest, or the highest
    with higher_is_better)."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    pick = max if higher_is_better else min
    best: dict[str, float] = {}
    labels = list(measures)
    for r in range(rounds):
        for label in labels if r % 2 == 0 else reversed(labels):
            value = measures[label]()
            best[label] = value if label not in best else pick(best[label], value)
    return best


def best_seconds(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """{label: the shortest wall time of fn} over `rounds` alternated rounds, after one untimed call of each
    (first-call costs: builds, page faults, cold caches)."""
    for fn in fns.values():
        fn()
    return best_alternated({label: seconds(fn) for label, fn in fns.items()}, rounds)


def seconds(fn: Callable[[], object]) -> Callable[[], float]:
    """A measure of fn: the wall seconds one call takes."""

    def measure() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return measure


def shortest_seconds(fn: Callable[[], object], calls: int) -> float:
    """The shortest wall time of `calls` calls of fn, one after another (the least disturbed)."""
    measure = seconds(fn)
    return min(measure() for _ in range(calls))
