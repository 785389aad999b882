"""Side-by-side figures on a shared machine: two measurements paired round by round, a ratio per round.

Each round runs both sides once, A then B on even rounds and B then A on odd ones (A B, B A, A B, ...), so a
change of the machine's load, or what one side leaves in the caches for the next, falls on both alike. A ratio
is taken within each round, of that round's pair, never across rounds; the figure reported is the median of
the rounds' ratios with their range, and each side's median:

    {"median": 1.62, "min": 1.55, "max": 1.71, "rounds": 5, "a_median": ..., "b_median": ...}

(the side labels are the caller's: "salon_median", "peer_median"). A round where either side has no value
gives no ratio; a figure with no ratio at all is None, never a number made up.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TypeVar

A = TypeVar("A")
B = TypeVar("B")


def alternated_pairs(
    measure_a: Callable[[], A], measure_b: Callable[[], B], rounds: int, *, on_round: Callable | None = None
) -> list[tuple[A, B]]:
    """[(a, b)] of each round: A then B on even rounds, B then A on odd ones. on_round(index, a, b) after each."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    pairs = []
    for r in range(rounds):
        if r % 2 == 0:
            a = measure_a()
            b = measure_b()
        else:
            b = measure_b()
            a = measure_a()
        pairs.append((a, b))
        if on_round is not None:
            on_round(r, a, b)
    return pairs


def paired_ratio(
    pairs: Sequence[tuple[float | None, float | None]], labels: tuple[str, str] = ("a", "b"), digits: int = 3
) -> dict | None:
    """a / b of each pair: {"median", "min", "max", "rounds", "ratios", "<a>_median", "<b>_median"}; the rounds
    counted are those where both sides have a value (b > 0). None when no round has one."""
    kept = [(a, b) for a, b in pairs if a is not None and b is not None and b > 0]
    if not kept:
        return None
    ratios = [a / b for a, b in kept]
    return {
        "median": round(statistics.median(ratios), digits),
        "min": round(min(ratios), digits),
        "max": round(max(ratios), digits),
        "rounds": len(ratios),
        "ratios": [round(r, digits) for r in ratios],
        f"{labels[0]}_median": statistics.median(a for a, _ in kept),
        f"{labels[1]}_median": statistics.median(b for _, b in kept),
    }


def figure_ratios(
    pairs: Sequence[tuple[dict | None, dict | None]],
    keys: Sequence[str],
    labels: tuple[str, str] = ("a", "b"),
    digits: int = 3,
) -> dict[str, dict | None]:
    """paired_ratio of each key of dict-valued pairs (a side that measured nothing in a round is None):
    {key: ratio or None}."""
    return {
        key: paired_ratio(
            [(None if a is None else a.get(key), None if b is None else b.get(key)) for a, b in pairs], labels, digits
        )
        for key in keys
    }


def describe(name: str, ratio: dict | None, unit: str = "x") -> str:
    """One printed line: 'name: median 1.62x (1.55-1.71 over 5 rounds)', or that it was not measured."""
    if ratio is None:
        return f"{name}: not measured"
    return (
        f"{name}: median {ratio['median']:.3f}{unit} ({ratio['min']:.3f}-{ratio['max']:.3f} over "
        f"{ratio['rounds']} alternated rounds)"
    )
