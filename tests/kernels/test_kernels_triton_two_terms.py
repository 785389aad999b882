"""The two-term Linear's fused Triton launches under the interpreter, on awkward shapes, bit for bit: the GEMM
with both activation terms summed in its epilogue (salon.kernels.w8a8_two_terms) against its reference and
against the unfused Triton GEMM then `y[:M] + y[M:]`; the norm and both terms in one launch
(quantize.rmsnorm_quant_two_terms_triton) against rmsnorm_triton then quantize_two_terms_triton; and the
Triton family's whole two-term op against its unfused composition."""

from __future__ import annotations

import pytest
import torch

from salon.kernels.backend import triton_ops
from salon.kernels.linear_two_terms import compose
from salon.kernels.quantize import (
    quantize_two_terms_ref,
    quantize_two_terms_triton,
    rmsnorm_quant_two_terms_ref,
    rmsnorm_quant_two_terms_triton,
)
from salon.kernels.rmsnorm import rmsnorm_residual_ref, rmsnorm_residual_triton, rmsnorm_triton
from salon.kernels.w8a8_gemm import w8a8_gemm_triton
from salon.kernels.w8a8_two_terms import w8a8_two_terms_ref, w8a8_two_terms_triton
from tests.triton_interpreter import row_independent_dot


@pytest.fixture(autouse=True)
def rows_on_their_own(monkeypatch):
    row_independent_dot(monkeypatch)


def _operands(m: int, k: int, n: int, grouped: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * 3.0
    a_q, a_scale = quantize_two_terms_ref(x)
    w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    w_scale = torch.rand((n, k // 32) if grouped else (n,), generator=gen) * 0.02 + 1e-3
    return x, a_q, a_scale, w_q, w_scale


# M: one row (decode), a few, more than a tile (16); K: one group, several, not a multiple of the per-row tile (32);
# N: odd, past a tile (32)
SHAPES = [(1, 32, 5, True), (3, 96, 33, True), (17, 64, 7, True), (1, 40, 5, False), (5, 72, 33, False)]


@pytest.mark.parametrize("m, k, n, grouped", SHAPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_gemm_two_terms_bit_exact(m, k, n, grouped, with_residual):
    _, a_q, a_scale, w_q, w_scale = _operands(m, k, n, grouped)
    residual = torch.randn(m, n, generator=torch.Generator().manual_seed(9)) if with_residual else None
    got = w8a8_two_terms_triton(a_q, a_scale, w_q, w_scale, residual)
    assert got.shape == (m, n)
    assert torch.equal(got, w8a8_two_terms_ref(a_q, a_scale, w_q, w_scale, residual))
    y = w8a8_gemm_triton(a_q, a_scale, w_q, w_scale)
    unfused = y[:m] + y[m:]
    assert torch.equal(got, unfused if residual is None else residual + unfused)


def test_gemm_two_terms_refuses_an_odd_number_of_rows():
    _, a_q, a_scale, w_q, w_scale = _operands(2, 32, 5, True)
    with pytest.raises(ValueError, match="terms"):
        w8a8_two_terms_triton(a_q[:3], a_scale[:3], w_q, w_scale)


@pytest.mark.parametrize("m, k", [(1, 64), (3, 100), (17, 7)])
def test_rmsnorm_quant_two_terms_is_the_unfused_pair(m, k):
    gen = torch.Generator().manual_seed(m * k)
    x = torch.randn(m, k, generator=gen) * 2.0
    w = 1.0 + 0.1 * torch.randn(k, generator=gen)
    q, s = rmsnorm_quant_two_terms_triton(x, w, 1e-6)
    q_ref, s_ref = quantize_two_terms_triton(rmsnorm_triton(x, w, 1e-6))
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    # to the reference as rmsnorm_triton is (tl.sum's order): the first term's scale within float rounding
    s_contract = rmsnorm_quant_two_terms_ref(x, w, 1e-6)[1]
    torch.testing.assert_close(s[:m], s_contract[:m], rtol=1e-6, atol=0)


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("norm, post_norm, residual", [(0, 0, 0), (1, 0, 1), (1, 1, 1), (0, 1, 0), (0, 0, 1)])
def test_triton_two_term_op_is_its_unfused_composition(grouped, norm, post_norm, residual):
    m, k, n = 3, 64, 33
    x, _, _, w_q, w_scale = _operands(m, k, n, grouped, seed=3)
    gen = torch.Generator().manual_seed(4)
    kw = dict(
        norm_weight=1.0 + 0.1 * torch.randn(k, generator=gen) if norm else None,
        eps=1e-6,
        post_norm=1.0 + 0.1 * torch.randn(n, generator=gen) if post_norm else None,
        residual=torch.randn(m, n, generator=gen) if residual else None,
    )
    fused = triton_ops().linear_two_terms
    unfused = compose(rmsnorm_triton, quantize_two_terms_triton, w8a8_gemm_triton)
    assert torch.equal(fused(x, w_q, w_scale, **kw), unfused(x, w_q, w_scale, **kw))


@pytest.mark.parametrize("shape", [(1, 64), (3, 100), (2, 3, 7)])
def test_rmsnorm_residual_is_the_unfused_pair(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x, residual = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
    w = 1.0 + 0.1 * torch.randn(shape[-1], generator=gen)
    got = rmsnorm_residual_triton(x, w, 1e-6, residual)
    assert torch.equal(got, residual + rmsnorm_triton(x, w, 1e-6))
    torch.testing.assert_close(got, rmsnorm_residual_ref(x, w, 1e-6, residual), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m, k, n, grouped", [*SHAPES, (64, 640, 1152, True), (1, 640, 2048, True)])
def test_fused_two_term_launches_on_cuda_are_the_unfused_ones(m, k, n, grouped):
    """Compiled (no FMA contraction): the fused launches give the unfused Triton sequence's bits on the GPU, and
    the GEMM with its terms summed the reference's."""
    x, a_q, a_scale, w_q, w_scale = (t.cuda() for t in _operands(m, k, n, grouped))
    residual = torch.randn(m, n, device="cuda")
    got = w8a8_two_terms_triton(a_q, a_scale, w_q, w_scale, residual)
    y = w8a8_gemm_triton(a_q, a_scale, w_q, w_scale)
    assert torch.equal(got, residual + (y[:m] + y[m:]))
    assert torch.equal(got.cpu(), w8a8_two_terms_ref(*(t.cpu() for t in (a_q, a_scale, w_q, w_scale, residual))))
    w = torch.rand(k, device="cuda") + 0.5
    q, s = rmsnorm_quant_two_terms_triton(x, w, 1e-6)
    q_ref, s_ref = quantize_two_terms_triton(rmsnorm_triton(x, w, 1e-6))
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    post = torch.rand(n, device="cuda") + 0.5
    assert torch.equal(rmsnorm_residual_triton(got, post, 1e-6, residual), residual + rmsnorm_triton(got, post, 1e-6))
