"""bench.gemv --grouped's vnni_prefill_prefetch baseline (bench/w8a8_grouped_vnni_prefill_prefetch.c: the engine's
VNNI kernel built with the prefill's prefetch at every size) computes what the engine's kernel computes, bit for
bit, on the same packed weights: the pair times a prefetch and nothing else."""

import pytest
import torch

from bench.gemv import _grouped_prefill_prefetch
from salon.kernels.cpu.w8a8_grouped import library, w8a8_grouped_scaled_cpu
from salon.kernels.w8a8_gemm import w8a8_epilogue_after_scales


@pytest.mark.skipif(library("vnni") is None, reason="needs AVX-512 VNNI and cc")
@pytest.mark.parametrize("m", [1, 2, 5, 16, 17, 70])
def test_the_baseline_gives_the_engine_kernels_bits(m):
    gen = torch.Generator().manual_seed(m)
    n, k = 40, 96
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    a_s = torch.rand(m, generator=gen) + 1e-3
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    s = torch.rand(n, k // 32, generator=gen) + 1e-3
    want = w8a8_epilogue_after_scales(w8a8_grouped_scaled_cpu(a, a_s, w, s), None, None, False)
    assert torch.equal(_grouped_prefill_prefetch(a, a_s, w, s), want)
