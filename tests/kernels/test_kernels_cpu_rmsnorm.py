"""The RMSNorm contract (salon/kernels/rmsnorm.py) and its C kernel (salon/kernels/cpu/rmsnorm.c), bit for bit: row
lengths
around the 16 lanes, per-head [T, H, D] views of a wider tensor, the thread split, rows of zeros and of huge
or tiny values, batch invariance; and the contract against float64 (its order is fixed, its value is the
norm's). A reordered sum, a fused multiply-add or the textbook torch expression changes the bits (checked
against mutated kernels by hand)."""

from __future__ import annotations

import pytest
import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.rmsnorm import library, rmsnorm_cpu
from salon.kernels.rmsnorm import LANES, rmsnorm_ref, sum_of_squares

needs_kernel = pytest.mark.skipif(not native.simd_isas() or library() is None, reason="needs x86-64 with AVX2 and cc")


def _operands(shape, seed, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * scale
    w = torch.randn(shape[-1], generator=g) + 1
    return x, w


@needs_kernel
@pytest.mark.parametrize("k", [1, 3, 15, 16, 17, 31, 32, 37, 256, 640, 1000, 2048])
@pytest.mark.parametrize("rows", [1, 2, 7, 130])
def test_kernel_matches_contract_bitwise(k, rows):
    x, w = _operands((rows, k), seed=k * 1000 + rows)
    assert torch.equal(rmsnorm_cpu(x, w, 1e-6), rmsnorm_ref(x, w, 1e-6))


@needs_kernel
def test_per_head_views_of_a_wider_tensor_are_read_where_they_lie():
    """Gemma's q/k norms: [T, H, D] views of the qkv output (row stride wider than H * D)."""
    qkv, _ = _operands((9, 1536), seed=1)
    w = torch.randn(256, generator=torch.Generator().manual_seed(2)) + 1
    q = qkv[:, :1024].reshape(9, 4, 256)
    k = qkv[:, 1024:1280].reshape(9, 1, 256)
    for view in (q, k):
        assert view.stride(0) == 1536 and not view.is_contiguous()
        got = rmsnorm_cpu(view, w, 1e-6)
        assert got.is_contiguous() and torch.equal(got, rmsnorm_ref(view.contiguous(), w, 1e-6))


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_thread_count_and_batch_do_not_change_results(threads):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        x, w = _operands((512, 640), seed=3)  # enough rows for the parallel split
        full = rmsnorm_cpu(x, w, 1e-6)
        assert torch.equal(full, rmsnorm_ref(x, w, 1e-6))
        for i in (0, 1, 255, 511):
            assert torch.equal(rmsnorm_cpu(x[i : i + 1], w, 1e-6), full[i : i + 1])
    finally:
        torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("scale", [0.0, 1e-30, 1e-3, 1e15])
def test_extreme_rows(scale):
    x, w = _operands((5, 640), seed=4, scale=scale)
    x[2] = 0.0
    x[3, ::7] = 3e18  # squares near the float32 limit
    got, want = rmsnorm_cpu(x, w, 1e-6), rmsnorm_ref(x, w, 1e-6)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    assert torch.equal(got[2], torch.zeros(640))


def test_contract_is_the_norm_within_float32_rounding():
    x, w = _operands((33, 640), seed=5)
    x64 = x.double()
    want = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(rmsnorm_ref(x, w, 1e-6).double(), want, rtol=2e-6, atol=1e-6)


def test_contract_sums_in_its_own_order():
    """Squares 2^24 (x[0]), 1 (x[1], x[16], x[17]): lane 0 is 2^24 + 1 -> 2^24 (ties to even), lane 1 is 2, the
    tree gives 2^24 + 2; left to right would give 2^24, the exact sum is 2^24 + 3."""
    x = torch.zeros(1, 2 * LANES)
    x[0, 0] = 2.0**12
    x[0, 1] = x[0, LANES] = x[0, LANES + 1] = 1.0
    assert float(sum_of_squares(x)) == 2.0**24 + 2
    if library() is not None:  # and the kernel sums the same way
        w = torch.ones(2 * LANES)
        assert torch.equal(rmsnorm_cpu(x, w, 0.0), rmsnorm_ref(x, w, 0.0))
        s = (2.0**24 + 2) * torch.tensor(1 / 32, dtype=torch.float32)
        assert float(rmsnorm_cpu(x, w, 0.0)[0, 1]) == float(1 / torch.sqrt(s.double()).float())


@needs_kernel
def test_engine_op_family_takes_the_kernel():
    from salon.kernels.backend import select_ops

    assert select_ops("cpu").rmsnorm is rmsnorm_cpu
