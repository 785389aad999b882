"""The AVX2 W8A8 GEMV (salon/kernels/cpu/w8a8_gemv.c) against the plain reference, bit for bit, and its place in
the CPU GEMM: a row's result is the same whether it goes through the GEMV or through the large-M paths."""

from __future__ import annotations

import platform
import shutil

import pytest
import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.w8a8_gemm import SMALL_M_ROWS, w8a8_gemm_cpu
from salon.kernels.cpu.w8a8_gemv import GEMV_MAX_ROWS, library, w8a8_gemv_scaled
from salon.kernels.w8a8_gemm import w8a8_gemm_ref

pytestmark = pytest.mark.skipif(library() is None, reason="needs x86-64 with AVX2 and cc")


def _operands(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    return a, torch.rand(m, generator=g) + 1e-3, w, torch.rand(n, generator=g) + 1e-3


def _exact(a, sa, w, sw):
    return (a.to(torch.int64) @ w.to(torch.int64).T).to(torch.float32) * sa[:, None] * sw[None, :]


def _random_shapes(count: int, seed: int) -> list[tuple[int, int, int]]:
    """Seeded shapes: M in 1..8 (one pass over a weight tile) and beyond (several), N and K with tails of every
    kind (odd, < 32, between 32 and 64)."""
    g = torch.Generator().manual_seed(seed)
    shapes = []
    for i in range(count):
        m = i % 8 + 1 if i % 2 else int(torch.randint(9, GEMV_MAX_ROWS + 1, (1,), generator=g))
        n = int(torch.randint(1, 300, (1,), generator=g))
        k = int(torch.randint(1, 700, (1,), generator=g))
        shapes.append((m, n, k))
    return shapes


EDGE_SHAPES = [
    (1, 1, 1),
    (1, 1, 31),
    (2, 3, 32),
    (3, 2, 33),
    (4, 5, 63),
    (5, 4, 64),
    (6, 7, 65),
    (7, 1, 127),
    (8, 9, 128),
    (8, 3, 4099),
    (1, 1536, 640),
    (4, 640, 2048),
    (8, 2048, 640),
    (9, 33, 64),
    (16, 17, 200),
    (17, 70, 576),
    (GEMV_MAX_ROWS, 35, 700),
    (GEMV_MAX_ROWS - 1, 3072, 576),
]


@pytest.mark.parametrize("m,n,k", EDGE_SHAPES + _random_shapes(48, seed=16))
def test_gemv_matches_reference_bitwise(m, n, k):
    a, sa, w, sw = _operands(m, n, k, seed=m * 10007 + n * 101 + k)
    got = w8a8_gemv_scaled(a, sa, w, sw)
    assert got is not None
    assert torch.equal(got, w8a8_gemm_ref(a, sa, w, sw))
    assert torch.equal(got, _exact(a, sa, w, sw))


@pytest.mark.parametrize("a_value,w_value", [(127, -128), (-127, -128), (127, 127), (-127, 127)])
def test_extreme_values_do_not_saturate(a_value, w_value):
    """|w| = 128 and |a| = 127 is the largest product pair vpmaddubsw sums: 2 * 128 * 127 < 2^15."""
    m, n, k = GEMV_MAX_ROWS, 5, 4096
    a = torch.full((m, k), a_value, dtype=torch.int8)
    w = torch.full((n, k), w_value, dtype=torch.int8)
    ones_m, ones_n = torch.ones(m), torch.ones(n)
    assert torch.equal(w8a8_gemv_scaled(a, ones_m, w, ones_n), torch.full((m, n), float(k * a_value * w_value)))


def test_declines_activations_of_minus_128_and_the_gemm_stays_exact():
    a, sa, w, sw = _operands(3, 17, 100, seed=5)
    a[1, 50] = -128
    assert w8a8_gemv_scaled(a, sa, w, sw) is None
    assert torch.equal(w8a8_gemm_cpu(a, sa, w, sw), _exact(a, sa, w, sw))


def test_declines_what_it_does_not_handle():
    a, sa, w, sw = _operands(GEMV_MAX_ROWS + 1, 4, 16, seed=6)
    assert w8a8_gemv_scaled(a, sa, w, sw) is None  # too many rows
    assert w8a8_gemv_scaled(a[:2], sa[:2].double(), w, sw) is None  # float64 scales
    assert w8a8_gemv_scaled(a[:2, ::2], sa[:2], w[:, ::2], sw) is None  # strided columns


def test_strided_rows_of_activations_are_read_where_they_lie():
    a, sa, w, sw = _operands(8, 33, 70, seed=7)
    rows = a[::2]  # row stride 140, contiguous columns
    assert torch.equal(w8a8_gemv_scaled(rows, sa[::2].contiguous(), w, sw), _exact(rows, sa[::2], w, sw))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_split_does_not_change_results(threads):
    a, sa, w, sw = _operands(5, 2, 200, seed=8)  # fewer weight rows than threads, too
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = w8a8_gemv_scaled(a, sa, w, sw)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got, _exact(a, sa, w, sw))


@pytest.mark.parametrize("geglu", [False, True])
def test_gemm_epilogues_after_the_gemv_match_reference(geglu):
    a, sa, w, sw = _operands(4, 64, 80, seed=9)
    bias, residual = torch.randn(64), torch.randn(4, 32 if geglu else 64)
    got = w8a8_gemm_cpu(a, sa, w, sw, bias=bias, residual=residual, geglu=geglu)
    assert torch.equal(got, w8a8_gemm_ref(a, sa, w, sw, bias=bias, residual=residual, geglu=geglu))


def test_row_results_do_not_depend_on_the_path_the_batch_takes():
    """Rows of one call and of a batch of 3 * GEMV_MAX_ROWS (GEMV calls of GEMV_MAX_ROWS rows without VNNI,
    the VNNI kernel with it) equal the same rows in batches the GEMV declines for an activation of -128: of
    SMALL_M_ROWS - 1 rows (the AVX2 int16 GEMM) and of 2 * SMALL_M_ROWS (the float path)."""
    a, sa, w, sw = _operands(3 * GEMV_MAX_ROWS, 300, 1500, seed=11)
    full = w8a8_gemm_cpu(a, sa, w, sw, geglu=True)
    for start, rows in ((0, 1), (3, 4), (10, GEMV_MAX_ROWS)):
        part = w8a8_gemm_cpu(a[start : start + rows], sa[start : start + rows], w, sw, geglu=True)
        assert torch.equal(part, full[start : start + rows])
    for rows in (SMALL_M_ROWS - 1, 2 * SMALL_M_ROWS):
        declined = torch.cat([a[:rows], torch.full((1, a.shape[1]), -128, dtype=torch.int8)])
        assert w8a8_gemv_scaled(declined, torch.cat([sa[:rows], sa[:1]]), w, sw) is None
        got = w8a8_gemm_cpu(declined, torch.cat([sa[:rows], sa[:1]]), w, sw, geglu=True)
        assert torch.equal(got[:rows], full[:rows])


def test_this_x86_cpu_runs_the_gemv_for_decode():
    """Without VNNI, decode-sized GEMMs go through the GEMV here: it loads and takes an engine-like call."""
    if platform.machine() != "x86_64" or shutil.which("cc") is None or "avx2" not in native.cpu_flags():
        pytest.skip("not x86-64 with AVX2 and a C compiler")
    a, sa, w, sw = _operands(1, 640, 2048, seed=12)
    assert w8a8_gemv_scaled(a, sa, w, sw) is not None
