"""bench.gemv --int16's section (bench/int16_gemm.py): it times the int16 GEMM against the two-term GEMM on a
layer's gate_up and down weights and records each pair and their ratio (the kernel's bits are
tests/kernels/test_kernels_cpu_w16a8_grouped.py's)."""

import pytest
import torch

from bench.int16_gemm import int16_section
from salon.kernels.cpu.w16a8_grouped import library


@pytest.mark.skipif(library() is None, reason="needs x86-64 with AVX2 and cc")
def test_section_records_both_timings_and_the_ratio(capsys):
    gen = torch.Generator().manual_seed(0)
    w = lambda n, k: (torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen), None, None)  # noqa: E731
    layer = [None, None, w(64, 96), w(24, 128)]
    result: dict = {}
    int16_section(layer, 1, gen, result, 2, tokens=(1, 5))
    for t in (1, 5):
        for label in ("gate_up", "down"):
            key = f"int16_t{t}_{label}"
            assert result[f"{key}_two_terms_ms"] > 0 and result[f"{key}_int16_ms"] > 0
            assert result[f"{key}_speedup_x"] > 0
    assert "T=  5 down" in capsys.readouterr().out
