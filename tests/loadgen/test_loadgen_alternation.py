"""salon/loadgen/alternation.py: two sides measured in rounds whose order alternates (A B, B A, A B, ...), a
ratio per round of that round's pair, reported as the median and range of the rounds' ratios."""

import pytest

from salon.loadgen.alternation import alternated_pairs, describe, figure_ratios, paired_ratio


def _scripted(calls: list[str], label: str, values: list):
    it = iter(values)

    def measure():
        calls.append(label)
        return next(it)

    return measure


def test_each_round_runs_both_sides_the_order_alternating():
    calls: list[str] = []
    seen = []
    pairs = alternated_pairs(
        _scripted(calls, "A", [10.0, 12.0, 9.0, 20.0, 11.0]),
        _scripted(calls, "B", [5.0, 4.0, 9.0, 8.0, 2.0]),
        rounds=5,
        on_round=lambda r, a, b: seen.append((r, a, b)),
    )
    assert calls == list("ABBAABBAAB")
    assert pairs == [(10.0, 5.0), (12.0, 4.0), (9.0, 9.0), (20.0, 8.0), (11.0, 2.0)]
    assert seen == [(r, a, b) for r, (a, b) in enumerate(pairs)]
    with pytest.raises(ValueError, match="rounds"):
        alternated_pairs(lambda: 1.0, lambda: 1.0, rounds=0)


def test_the_ratio_of_each_rounds_pair_never_across_rounds():
    # Ratios per round: 2, 3, 1, 2.5, 5.5 -> median 2.5, range 1..5.5. The best of each side (20 / 2 = 10), or the
    # medians' ratio (11 / 5 = 2.2), would pair values of different rounds.
    pairs = [(10.0, 5.0), (12.0, 4.0), (9.0, 9.0), (20.0, 8.0), (11.0, 2.0)]
    r = paired_ratio(pairs, ("salon", "peer"))
    assert r == {
        "median": 2.5,
        "min": 1.0,
        "max": 5.5,
        "rounds": 5,
        "ratios": [2.0, 3.0, 1.0, 2.5, 5.5],
        "salon_median": 11.0,
        "peer_median": 5.0,
    }
    # An even number of rounds: the median is the mean of the middle two ratios (2 and 3).
    assert paired_ratio(pairs[:4])["median"] == 2.25
    assert describe("decode", r) == "decode: median 2.500x (1.000-5.500 over 5 alternated rounds)"


def test_a_round_without_both_values_gives_no_ratio_and_none_at_all_is_none():
    r = paired_ratio([(6.0, 3.0), (None, 2.0), (4.0, None), (1.0, 0.0), (9.0, 2.0)])
    assert (r["median"], r["min"], r["max"], r["rounds"], r["ratios"]) == (3.25, 2.0, 4.5, 2, [2.0, 4.5])
    assert paired_ratio([(None, 2.0), (1.0, None)]) is None
    assert describe("prefill", None) == "prefill: not measured"


def test_figure_ratios_of_dict_measures():
    pairs = [
        ({"x": 4.0, "y": 1.0}, {"x": 2.0}),
        ({"x": 9.0, "y": 2.0}, {"x": 3.0, "y": 4.0}),
        ({"x": 2.0, "y": 3.0}, None),  # the peer measured nothing this round
    ]
    got = figure_ratios(pairs, ("x", "y", "z"), ("salon", "peer"))
    assert got["x"]["ratios"] == [2.0, 3.0] and got["x"]["median"] == 2.5 and got["x"]["peer_median"] == 2.5
    assert got["y"]["ratios"] == [0.5] and got["y"]["rounds"] == 1
    assert got["z"] is None
