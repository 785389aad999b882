"""bench/linear_recipes.py: the two activation recipes (and the rescored output projection's variants) are measured
in alternated rounds (A B, then B A) on the same rotating weights and inputs, and a row's ratio is the median of the
rounds' ratios with their range; the calls run the Triton family's ops (here in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from bench import linear_recipes
from salon.kernels.backend import triton_ops


def test_rounds_alternate_and_each_round_gives_a_ratio(monkeypatch):
    order: list[str] = []
    times = {"two_terms": iter([4.0, 6.0, 3.0]), "group32": iter([2.0, 2.0, 3.0])}
    monkeypatch.setattr(linear_recipes, "time_ms", lambda fn, device: fn())

    def measure(recipe):
        def call():
            order.append(recipe)
            return next(times[recipe]) if len(order) > 2 else 0.0  # the first two: the untimed warm-up calls

        return call

    measured = linear_recipes.alternated_ms({r: measure(r) for r in linear_recipes.RECIPES}, 3, "cpu")
    assert order == ["two_terms", "group32", "two_terms", "group32", "group32", "two_terms", "two_terms", "group32"]
    assert measured == {"two_terms": [4.0, 6.0, 3.0], "group32": [2.0, 2.0, 3.0]}
    row = linear_recipes.row("o", 8, 1024, 640, measured, 5)
    assert row["two_terms_ms"] == 4.0 and row["group32_ms"] == 2.0
    assert row["two_terms_over_group32_median_x"] == 2.0 and row["two_terms_over_group32_range_x"] == [1.0, 3.0]


@pytest.mark.parametrize("norm", [True, False])
def test_calls_run_both_recipes_ops_on_the_same_rotating_weights(norm):
    calls, copies = linear_recipes.layer_calls(64, 40, norm, 2, 1 << 13, "cpu")
    assert set(calls) == set(linear_recipes.RECIPES) and copies >= 2
    outs = {recipe: [call() for _ in range(copies + 1)] for recipe, call in calls.items()}
    for got in outs.values():
        assert all(o.shape == (2, 40) for o in got)
        assert torch.equal(got[0], got[copies]) and not torch.equal(got[0], got[1])  # one weight a call, cycled
    ops = triton_ops()
    assert ops.linear_group32.__name__ == "linear_group32_triton"
    assert not torch.equal(outs["two_terms"][0], outs["group32"][0])  # two recipes, two results
    two, g32 = outs["two_terms"][0], outs["group32"][0]
    assert (two - g32).abs().max() < 0.05 * two.abs().max()  # the same Linear: close, about 8 bits against 14


def test_rescored_calls_run_the_one_read_op_its_composition_and_group32_on_the_same_weights():
    calls, copies = linear_recipes.rescored_calls(64, 40, 2, 1 << 13, "cpu")
    assert set(calls) == {"one_read", "composed", "group32"} and copies >= 2
    outs = {name: [call() for _ in range(copies + 1)] for name, call in calls.items()}
    for got in outs.values():
        assert all(o.shape == (2, 40) for o in got)
        assert torch.equal(got[0], got[copies]) and not torch.equal(got[0], got[1])  # one weight a call, cycled
    one, composed = outs["one_read"][0], outs["composed"][0]
    assert torch.equal(one.view(torch.int32), composed.view(torch.int32))  # the same op: the same bits
