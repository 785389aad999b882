"""The CPU W8A8 fast path against the integer reference, on awkward shapes, and its batch invariance."""

import pytest
import torch

from salon.kernels.cpu.w8a8_gemm import (
    SMALL_M_ROWS,
    VNNI_ROW_BLOCK,
    cpu_isas,
    int8_acc_c,
    int8_acc_c_blocked,
    w8a8_gemm_cpu,
)
from salon.kernels.w8a8_gemm import w8a8_gemm_ref

SHAPES = [
    (1, 1, 1),
    (1, 7, 33),
    (3, 5, 17),
    (4, 9, 16),
    (5, 640, 2048),
    (1, 1536, 640),
    (15, 33, 1040),
    (16, 31, 1025),
    (40, 100, 2100),
    (1, 3, 4099),
    (7, 2048, 1024),
]


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


ISAS = cpu_isas()
# Shapes that hit every edge of the C kernels: K not a multiple of 64 (masked tail) or 32, rows not a multiple
# of 4, weight rows not a multiple of the 4-row block, one element, blocks of rows past VNNI_ROW_BLOCK.
C_SHAPES = SHAPES + [(2, 6, 64), (9, 4, 128), (4, 1, 63), (6, 11, 191), (VNNI_ROW_BLOCK + 5, 7, 96)]


@pytest.mark.parametrize("isa", ["vnni", "avx2"])
@pytest.mark.parametrize("m,n,k", C_SHAPES)
def test_each_c_kernel_is_exact(isa, m, n, k):
    if isa not in ISAS:
        pytest.skip(f"this CPU has no {isa}")
    a, _, w, _ = _operands(m, n, k, seed=m * 7 + n * 3 + k)
    a[0, : k // 2] = -128  # the most negative int8 (uint8 0 after the +128 of the VNNI path)
    exact = (a.to(torch.int64) @ w.to(torch.int64).T).to(torch.int32)
    assert torch.equal(int8_acc_c_blocked(a, w, isa), exact)


@pytest.mark.parametrize("isa", ["vnni", "avx2"])
@pytest.mark.parametrize("value", [-128, -127, 127])
def test_extreme_values_do_not_saturate(isa, value):
    if isa not in ISAS:
        pytest.skip(f"this CPU has no {isa}")
    a = torch.full((3, 2048), value, dtype=torch.int8)
    w = torch.full((5, 2048), -127, dtype=torch.int8)
    assert torch.all(int8_acc_c(a, w, isa) == 2048 * value * -127)


def test_this_x86_cpu_runs_a_c_kernel():
    """The engine's speed on CPUs rests on these kernels: on an x86 machine with a C compiler, one must load."""
    import platform
    import shutil

    if platform.machine() != "x86_64" or shutil.which("cc") is None:
        pytest.skip("not x86-64 with a C compiler")
    assert ISAS, "x86-64 without AVX2"
    assert int8_acc_c(torch.ones((1, 3), dtype=torch.int8), torch.ones((2, 3), dtype=torch.int8)) is not None


@pytest.mark.parametrize("geglu", [False, True])
def test_epilogues_match_reference(geglu):
    a, sa, w, sw = _operands(6, 64, 80, seed=3)
    bias = torch.randn(64)
    residual = torch.randn(6, 32 if geglu else 64)
    got = w8a8_gemm_cpu(a, sa, w, sw, bias=bias, residual=residual, geglu=geglu)
    assert torch.equal(got, w8a8_gemm_ref(a, sa, w, sw, bias=bias, residual=residual, geglu=geglu))


def test_row_result_independent_of_batch():
    a, sa, w, sw = _operands(3 * SMALL_M_ROWS, 300, 1500, seed=11)
    full = w8a8_gemm_cpu(a, sa, w, sw)  # float path without VNNI
    for rows in (1, 3, SMALL_M_ROWS - 1):  # C path
        assert torch.equal(w8a8_gemm_cpu(a[:rows], sa[:rows], w, sw), full[:rows])


def test_large_weights_take_the_blocked_c_path_at_any_batch():
    """The output projection's size: 70 rows (over SMALL_M_ROWS) go through the C kernel in row blocks."""
    from salon.kernels.cpu.w8a8_gemm import LARGE_WEIGHT_ELEMENTS

    n, k = LARGE_WEIGHT_ELEMENTS // 640 + 3, 640
    a, sa, w, sw = _operands(SMALL_M_ROWS + 6, n, k, seed=21)
    exact = (a.to(torch.int64) @ w.to(torch.int64).T).to(torch.float32) * sa[:, None] * sw[None, :]
    got = w8a8_gemm_cpu(a, sa, w, sw)
    assert torch.equal(got, exact)
    assert torch.equal(w8a8_gemm_cpu(a[5:9], sa[5:9], w, sw), got[5:9])
