"""The CPU W8A8 fast path against the integer reference, on awkward shapes, and its batch invariance."""

import pytest
import torch

from kernels.cpu.w8a8_gemm import SMALL_M_ROWS, int8_acc_c, w8a8_gemm_cpu
from kernels.w8a8_gemm import w8a8_gemm_ref

SHAPES = [(1, 1, 1), (1, 7, 33), (3, 5, 17), (4, 9, 16), (5, 640, 2048), (1, 1536, 640), (15, 33, 1040),
          (16, 31, 1025), (40, 100, 2100), (1, 3, 4099), (7, 2048, 1024)]


def _operands(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    return a, torch.rand(m, generator=g) + 1e-3, w, torch.rand(n, generator=g) + 1e-3


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_integer_reference_bitwise(m, n, k):
    a, sa, w, sw = _operands(m, n, k, seed=m * 1000 + n + k)
    exact = (a.to(torch.int64) @ w.to(torch.int64).T).to(torch.float32) * sa[:, None] * sw[None, :]
    assert torch.equal(w8a8_gemm_cpu(a, sa, w, sw), exact)
    assert torch.equal(w8a8_gemm_cpu(a, sa, w, sw), w8a8_gemm_ref(a, sa, w, sw))


def test_extreme_values_do_not_saturate():
    a = torch.full((3, 2048), -127, dtype=torch.int8)
    w = torch.full((5, 2048), -127, dtype=torch.int8)
    acc = int8_acc_c(a, w)
    if acc is None:
        pytest.skip("no C compiler / AVX2 here")
    assert torch.all(acc == 2048 * 127 * 127)


@pytest.mark.parametrize("geglu", [False, True])
def test_epilogues_match_reference(geglu):
    a, sa, w, sw = _operands(6, 64, 80, seed=3)
    bias = torch.randn(64)
    residual = torch.randn(6, 32 if geglu else 64)
    got = w8a8_gemm_cpu(a, sa, w, sw, bias=bias, residual=residual, geglu=geglu)
    assert torch.equal(got, w8a8_gemm_ref(a, sa, w, sw, bias=bias, residual=residual, geglu=geglu))


def test_row_result_independent_of_batch():
    a, sa, w, sw = _operands(3 * SMALL_M_ROWS, 300, 1500, seed=11)
    full = w8a8_gemm_cpu(a, sa, w, sw)  # float path
    for rows in (1, 3, SMALL_M_ROWS - 1):  # C path
        assert torch.equal(w8a8_gemm_cpu(a[:rows], sa[:rows], w, sw), full[:rows])


def test_large_weights_take_the_blocked_c_path_at_any_batch():
    """The output projection's size: 70 rows (over SMALL_M_ROWS) go through the C kernel in row blocks."""
    from kernels.cpu.w8a8_gemm import LARGE_WEIGHT_ELEMENTS

    n, k = LARGE_WEIGHT_ELEMENTS // 640 + 3, 640
    a, sa, w, sw = _operands(SMALL_M_ROWS + 6, n, k, seed=21)
    exact = (a.to(torch.int64) @ w.to(torch.int64).T).to(torch.float32) * sa[:, None] * sw[None, :]
    got = w8a8_gemm_cpu(a, sa, w, sw)
    assert torch.equal(got, exact)
    assert torch.equal(w8a8_gemm_cpu(a[5:9], sa[5:9], w, sw), got[5:9])
