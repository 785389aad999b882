"""bench/group32_gemm.py (bench.gemv --group32): it times group32 against two int8 terms in alternated rounds, for the
op and the GEMM alone, the rescored output projection against plain group32, and the GEMM on L2-resident weights
against the int8 product ceiling, and records both medians, the median ratio and its range (the kernels' bits are
tests/kernels/test_kernels_cpu_group32.py's and test_kernels_linear_rescored.py's)."""

import pytest
import torch

from bench.group32_gemm import alternated_ratios, group32_section, rescored_section, resident_section
from salon.kernels.cpu.linear_two_terms import library


def test_rounds_alternate_which_runs_first():
    order: list[str] = []
    a, b = (lambda: order.append("a")), (lambda: order.append("b"))
    times = alternated_ratios(a, b, 3, min_seconds=0)
    # one untimed call each, one each to size the measurements (a call), then A B, B A, A B
    assert order == ["a", "b", "a", "b", "a", "b", "b", "a", "a", "b"]
    assert len(times[0]) == len(times[1]) == 3 and min(times[0] + times[1]) >= 0


@pytest.mark.skipif(library() is None, reason="needs x86-64 with AVX2 and cc")
def test_section_records_both_timings_the_median_ratio_and_its_range(capsys):
    result: dict = {}
    group32_section(
        result, 3, torch.Generator().manual_seed(0), projections=(("down", 64, 24),), ms=(1, 8, 64), layers=2
    )
    for kind in ("linear", "gemm"):
        for m in (1, 8, 64):
            key = f"group32_{kind}_m{m}_down"
            assert result[f"{key}_two_terms_ms"] > 0 and result[f"{key}_group32_ms"] > 0
            low, high = result[f"{key}_two_terms_over_group32_range"]
            assert 0 < low <= result[f"{key}_two_terms_over_group32_x"] <= high
    assert "gemm   M= 64 down" in capsys.readouterr().out


@pytest.mark.skipif(library() is None, reason="needs x86-64 with AVX2 and cc")
def test_rescored_section_records_both_timings_the_median_ratio_and_its_range(capsys):
    result: dict = {}
    rescored_section(result, 3, torch.Generator().manual_seed(0), shape=(64, 4000), copies=2)
    for m in (1, 8):
        key = f"rescored_m{m}_lm_head"
        assert result[f"{key}_ms"] > 0 and result[f"{key}_group32_ms"] > 0
        low, high = result[f"{key}_over_group32_range"]
        assert 0 < low <= result[f"{key}_over_group32_x"] <= high
    assert "M=8: rescored" in capsys.readouterr().out


@pytest.mark.skipif(library() is None, reason="needs x86-64 with AVX2 and cc")
def test_resident_section_records_the_gemms_rate_the_ceiling_and_their_ratio(capsys):
    result: dict = {}
    resident_section(result, 3, torch.Generator().manual_seed(0), shape=("down", 256, 512), ms=(1, 8))
    for m in (1, 8):
        key = f"group32_resident_m{m}_down"
        assert result[f"{key}_gmacs"] > 0 and result[f"{key}_ceiling_gmacs"] > 0
        low, high = result[f"{key}_of_ceiling_range"]
        assert 0 < low <= result[f"{key}_of_ceiling"] <= high
    assert "M=8:" in capsys.readouterr().out
