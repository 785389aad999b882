"""Greedy top-1 of salon/kernels/cpu/argmax.c against torch.argmax: random rows, ties, NaN, infinities, tails."""

from __future__ import annotations

import math

import pytest
import torch

from salon.kernels.cpu.argmax import argmax_rows_cpu

pytestmark = pytest.mark.skipif(argmax_rows_cpu(torch.zeros(1, 1)) is None, reason="needs x86-64 with AVX2 and cc")


def _check(x: torch.Tensor) -> None:
    assert argmax_rows_cpu(x) == torch.argmax(x, dim=-1).tolist()


@pytest.mark.parametrize(
    "m,n", [(1, 1), (1, 7), (2, 8), (3, 9), (1, 15), (5, 16), (4, 17), (8, 1000), (1, 262_144), (7, 262_147)]
)
def test_random_rows(m, n):
    _check(torch.randn(m, n, generator=torch.Generator().manual_seed(m * 31 + n)))


@pytest.mark.parametrize("n", [1, 5, 8, 9, 33, 1024, 1031])
def test_ties_take_the_first_index(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, 3, (64, n), generator=g).to(torch.float32)  # many ties in every row, across lanes
    _check(x)
    _check(torch.zeros(3, n))
    _check(torch.full((2, n), -math.inf))


@pytest.mark.parametrize("where", [0, 3, 7, 8, 500, 1030])
def test_nan_counts_as_largest_and_the_first_nan_wins(where):
    x = torch.randn(2, 1031, generator=torch.Generator().manual_seed(where))
    x[0, where] = math.nan
    x[1, where] = math.inf
    x[1, 1030] = math.nan
    x[1, where // 2 + 1030 // 2] = math.nan
    _check(x)


def test_maximum_in_the_tail_and_in_the_first_lanes():
    x = torch.zeros(3, 21)
    x[0, 20], x[1, 0], x[2, 7] = 1.0, 1.0, 1.0
    _check(x)


def test_strided_rows():
    x = torch.randn(6, 300, generator=torch.Generator().manual_seed(5))
    _check(x[::2, :257])


def test_declines_other_layouts():
    assert argmax_rows_cpu(torch.zeros(4, 4, dtype=torch.float64)) is None
    assert argmax_rows_cpu(torch.zeros(4, 4).T) is None
    assert argmax_rows_cpu(torch.zeros(4)) is None


@pytest.mark.parametrize("threads", [2, 3])
def test_rows_split_over_threads_keep_torchs_answer(threads):
    """8 rows of 262,147 (above ARGMAX_PARALLEL_FLOATS: each row split into one column range per thread): the
    maximum in either range, a tie across the split (the earlier index wins), a NaN only in the later range (it
    wins), a NaN in both (the first), all -inf, and a short call that stays on one thread."""
    n = 262_147
    x = torch.randn(8, n, generator=torch.Generator().manual_seed(threads))
    half = n // threads
    x[0, 5] = 10.0
    x[1, n - 1] = 10.0
    x[2, 7], x[2, half + 3] = 9.0, 9.0
    x[3, half + 1] = math.nan
    x[4, 3], x[4, n - 2] = math.nan, math.nan
    x[5] = -math.inf
    x[6, half - 1], x[6, half] = 11.0, 11.0  # the two ranges' boundary
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check(x)
        _check(x[:, :1000])
        _check(x[::3])
    finally:
        torch.set_num_threads(before)
