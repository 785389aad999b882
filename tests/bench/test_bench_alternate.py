"""bench/alternate.py: the measurements run in alternation (the order reversed every other round) and each
keeps its own best value, the lowest or the highest."""

import random

import pytest

from bench.alternate import best_alternated, best_seconds, seconds


def test_rounds_alternate_the_order_and_each_keeps_its_own_best():
    calls: list[str] = []
    values = {"a": iter([5.0, 3.0, 4.0, 9.0]), "b": iter([1.0, 2.0, 0.5, 7.0]), "c": iter([6.0, 6.0, 8.0, 2.0])}

    def measure(label):
        def run():
            calls.append(label)
            return next(values[label])

        return run

    best = best_alternated({label: measure(label) for label in "abc"}, rounds=4)
    assert calls == list("abccbaabccba")
    assert best == {"a": 3.0, "b": 0.5, "c": 2.0}


def test_higher_is_better_keeps_the_highest_of_random_values():
    rng = random.Random(7)
    drawn: dict[str, list[float]] = {"x": [], "y": []}

    def draw(label):
        def run():
            drawn[label].append(rng.uniform(-10, 10))
            return drawn[label][-1]

        return run

    best = best_alternated({"x": draw("x"), "y": draw("y")}, rounds=25, higher_is_better=True)
    assert len(drawn["x"]) == len(drawn["y"]) == 25
    assert best == {"x": max(drawn["x"]), "y": max(drawn["y"])}


def test_no_round_is_refused_and_seconds_times_one_call():
    with pytest.raises(ValueError, match="rounds"):
        best_alternated({"a": lambda: 1.0}, rounds=0)
    ran = []
    elapsed = seconds(lambda: ran.append(1))()
    assert ran == [1] and 0.0 <= elapsed < 1.0


def test_best_seconds_calls_each_once_untimed_then_alternates():
    calls: list[str] = []
    best = best_seconds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3)
    assert calls == list("ababbaab")  # the untimed first calls, then the alternated rounds
    assert set(best) == {"a", "b"} and all(0.0 <= v < 1.0 for v in best.values())
