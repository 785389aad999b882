"""The group32 recipe's rescored output projection (salon.kernels.linear_rescored): its guarantee (the largest output
is the two-term maximum, at the two-term argmax) on seeded random rows with outlier channels, ties and a NaN; the
CPU family's C call bit for bit against the reference (packed and row-major weights, one to three threads, every row
count the call takes, short last blocks, fewer groups than OUTLIER_GROUPS), its composition, the chunks of larger
calls, and the Triton family's composition in Triton's interpreter; the argmax each path gives against the output's
(ties across blocks and threads, a row with a NaN)."""

from __future__ import annotations

import math

import pytest
import torch

from salon.kernels.backend import triton_ops
from salon.kernels.cpu.linear_two_terms import (
    SUM2_MAX_ROWS,
    composed_rescored,
    linear_rescored_c,
    linear_rescored_cpu,
)
from salon.kernels.cpu.w8a8_grouped import keep_rows, library
from salon.kernels.linear_rescored import OUTLIER_GROUPS, bound_factors, linear_rescored_ref, row_bounds
from salon.kernels.linear_two_terms import linear_group32_ref, linear_two_terms_ref
from salon.kernels.quantize import quantize_two_terms_ref
from salon.kernels.w8a8_group32 import quantize_group32_ref

needs_vnni = pytest.mark.skipif(library("vnni") is None, reason="needs AVX-512 VNNI and cc")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def case(m: int, n: int, k: int, seed: int, outliers: bool = True):
    """Rows with a few outlier channels (a hidden state's: one group up to 30x the others), weights over binades."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    if outliers:
        for r in range(m):
            cols = torch.randint(0, k, (1 + r % 3,), generator=g)
            x[r, cols] *= 30.0 * torch.rand(len(cols), generator=g) + 1.0
    w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    w_scale = (torch.rand(n, k // 32, generator=g) + 0.05) * 2.0 ** torch.randint(-8, -5, (n, k // 32), generator=g)
    return x, w_q, w_scale, row_bounds(w_q, w_scale)


@pytest.mark.parametrize("seed", range(12))
def test_the_largest_output_is_the_two_term_maximum_at_its_argmax(seed):
    m, n, k = 6, 3000, 640 if seed % 2 else 96
    x, w_q, w_scale, bounds = case(m, n, k, seed)
    if seed % 3 == 0:  # a tie for the two-term maximum: the same weight row twice, and near-duplicates
        w_q[n - 1], w_scale[n - 1] = w_q[7], w_scale[7]
        w_q[n // 2] = w_q[7]
        bounds = row_bounds(w_q, w_scale)
    e = linear_two_terms_ref(x, w_q, w_scale)
    a = linear_group32_ref(x, w_q, w_scale)
    out = linear_rescored_ref(x, w_q, w_scale, bounds)
    assert torch.equal(out.argmax(-1), e.argmax(-1))
    assert torch.equal(out.amax(-1), e.amax(-1))
    kept = out != e  # rows left at their group32 value: each below the two-term maximum
    assert torch.all(torch.where(kept, a, -math.inf) < e.amax(-1, keepdim=True))
    assert torch.all((out == a) | (out == e))
    rescored = (out == e) & (a != e)
    assert 0 < rescored.sum() < m * n // 10  # a few rows, not all of them (the outlier groups' bound)


def test_the_bound_holds_the_group32_error_on_every_row():
    x, w_q, w_scale, bounds = case(8, 5000, 640, seed=3)
    _, s32 = quantize_group32_ref(x)
    _, s2 = quantize_two_terms_ref(x)
    alpha, beta = bound_factors(s32, s2[8:])
    t = alpha[:, None] * bounds[0][None, :] + beta[:, None] * bounds[1][None, :]
    err = (linear_group32_ref(x, w_q, w_scale) - linear_two_terms_ref(x, w_q, w_scale)).abs()
    assert torch.all(err <= t)
    assert err.max() > 0.01 * t.max()  # not vacuous


def test_row_bounds_and_factors_are_the_contracts():
    w_q = torch.tensor([[1, -2] * 16 + [-127] * 32, [0] * 64], dtype=torch.int8)
    w_scale = torch.tensor([[0.5, 0.25], [1.0, 1.0]])
    assert torch.equal(row_bounds(w_q, w_scale), torch.tensor([[24.0 + 1016.0, 0.0], [1016.0, 0.0]]))
    s32 = torch.tensor([[8.0, 1.0, 2.0, 7.0, 3.0, 4.0, 6.0, 5.0, 0.5]])  # 9 groups: the cap is the 7th largest, 2.0
    alpha, beta = bound_factors(s32, torch.tensor([0.25]))
    assert alpha.item() == (2.0 + 0.25) * 0.515625
    assert beta.item() == (6 + 5 + 4 + 3 + 2 + 1) * 0.515625
    few = torch.tensor([[3.0, 1.0]])  # fewer groups than OUTLIER_GROUPS: no cap, every group in beta
    assert OUTLIER_GROUPS > 2
    alpha, beta = bound_factors(few, torch.tensor([0.5]))
    assert (alpha.item(), beta.item()) == (0.5 * 0.515625, 4.0 * 0.515625)


def test_a_row_with_a_nan_is_not_rescored():
    x, w_q, w_scale, bounds = case(3, 200, 64, seed=1)
    x[1, 5] = math.nan
    out = linear_rescored_ref(x, w_q, w_scale, bounds)
    assert same_bits(out[1], linear_group32_ref(x, w_q, w_scale)[1])
    if library("vnni") is not None:  # the other rows' bits (a NaN input's are not the C kernels' contract)
        got = linear_rescored_c(x, w_q, w_scale, bounds)
        assert same_bits(got[0::2], out[0::2])


@needs_vnni
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(
    "m, n, k",
    [(1, 262, 640), (2, 1000, 64), (5, 4099, 96), (8, 20000, 640), (16, 333, 32), (17, 700, 128), (32, 50, 160)],
)
def test_the_c_call_is_the_reference_bit_for_bit(m, n, k, threads):
    x, w_q, w_scale, bounds = case(m, n, k, seed=m * 100 + k)
    want = linear_rescored_ref(x, w_q, w_scale, bounds)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = linear_rescored_c(x, w_q, w_scale, bounds)
    finally:
        torch.set_num_threads(before)
    assert got is not None
    assert same_bits(got, want)
    for i in (0, m - 1):  # a row alone gives the bits it had in the batch
        assert same_bits(linear_rescored_c(x[i : i + 1], w_q, w_scale, bounds), want[i : i + 1])


@needs_vnni
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m, n, k", [(1, 262, 640), (5, 4099, 96), (8, 20000, 640), (32, 50, 160)])
def test_the_c_calls_argmax_is_the_outputs_first_largest(m, n, k, threads):
    """From the rescored rows alone, ties included: the weight row holding the two-term maximum copied into a later
    block, the same block, and the last row (another thread's range), so that the largest value is several rows'."""
    x, w_q, w_scale, bounds = case(m, n, k, seed=m * 7 + k)
    top = int(linear_two_terms_ref(x[:1], w_q, w_scale).argmax())
    for row in {min(top + 2, n - 1) if top % 16 < 14 else top, n - 1, (top + 16 * 3) % n}:
        w_q[row], w_scale[row] = w_q[top], w_scale[top]
    bounds = row_bounds(w_q, w_scale)
    want = linear_rescored_ref(x, w_q, w_scale, bounds)
    assert (want[0] == want[0].max()).sum() > 1  # a tie for the first row's largest value
    argmax = torch.full((m,), -7, dtype=torch.int64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = linear_rescored_c(x, w_q, w_scale, bounds, argmax)
    finally:
        torch.set_num_threads(before)
    assert same_bits(got, want)
    assert argmax.tolist() == want.argmax(-1).tolist()


def test_the_ops_argmax_is_the_outputs_on_every_path():
    """The CPU op (its C call where it runs: chunks of SUM2_MAX_ROWS rows), its composition and the reference, each
    against its own output; a row with an infinite input, whose output holds a NaN, which the C call leaves to the
    caller (-1), gets the output's argmax (torch's: the first NaN)."""
    x, w_q, w_scale, bounds = case(SUM2_MAX_ROWS + 3, 300, 64, seed=5)
    x[SUM2_MAX_ROWS + 1, 3] = math.inf
    for op in (linear_rescored_cpu, composed_rescored, linear_rescored_ref):
        argmax = torch.full((x.shape[0],), -7, dtype=torch.int64)
        out = op(x, w_q, w_scale, bounds, argmax)
        assert out[SUM2_MAX_ROWS + 1].isnan().any()
        assert argmax.tolist() == out.argmax(-1).tolist(), op
    if library("vnni") is not None:
        argmax = torch.full((3,), -7, dtype=torch.int64)
        out = linear_rescored_c(x[SUM2_MAX_ROWS:], w_q, w_scale, bounds, argmax)
        assert argmax.tolist() == [out[0].argmax().item(), -1, out[2].argmax().item()]


@needs_vnni
def test_row_major_weights_give_the_packed_ones_bits():
    x, w_q, w_scale, bounds = case(4, 1500, 192, seed=9)
    keep_rows(w_q)  # never packed: the row-major tile
    assert same_bits(linear_rescored_c(x, w_q, w_scale, bounds), linear_rescored_ref(x, w_q, w_scale, bounds))


def test_larger_calls_and_declined_ones_compose_with_the_same_bits():
    x, w_q, w_scale, bounds = case(SUM2_MAX_ROWS + 7, 300, 64, seed=4)
    want = linear_rescored_ref(x, w_q, w_scale, bounds)
    assert same_bits(linear_rescored_cpu(x, w_q, w_scale, bounds), want)  # in chunks of SUM2_MAX_ROWS
    assert same_bits(composed_rescored(x, w_q, w_scale, bounds), want)
    assert linear_rescored_c(x, w_q, w_scale, bounds) is None  # more rows than one call takes
    assert linear_rescored_c(x[:2], w_q, w_scale, bounds[:, :-1].contiguous()) is None  # bounds of another shape


def test_the_triton_familys_composition_is_the_reference():
    x, w_q, w_scale, bounds = case(3, 40, 64, seed=6)
    op = triton_ops().linear_rescored
    assert op.__name__ == "linear_rescored_triton"
    assert same_bits(op(x, w_q, w_scale, bounds), linear_rescored_ref(x, w_q, w_scale, bounds))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_triton_familys_op_on_cuda_is_the_reference():
    """Compiled, on Gemma's projection width and a quarter of its vocabulary: the CUDA op's bits are the CPU
    reference's (the Triton group32 and two-term ops keep their references' bits; the selection is IEEE arithmetic)."""
    x, w_q, w_scale, bounds = case(8, 65536, 640, seed=12)
    got = triton_ops().linear_rescored(x.cuda(), w_q.cuda(), w_scale.cuda(), bounds.cuda())
    want = linear_rescored_ref(x, w_q, w_scale, bounds)
    assert same_bits(got.cpu(), want)
    assert torch.equal(got.argmax(-1).cpu(), linear_two_terms_ref(x, w_q, w_scale).argmax(-1))
