"""The group32 recipe's Triton kernels (salon.kernels.w8a8_group32_triton) bit for bit against the recipe's references
(salon.kernels.w8a8_group32): the quantization per token and 32 channels, the RMSNorm fused in front of it (against
rmsnorm_triton then the quantization), the GEMM in the contract's order with the residual behind it (and with the
two-term values of the same rows from the same weight tiles), and the Triton family's whole `linear_group32` op
against its unfused composition. Without CUDA the kernels run in Triton's interpreter on small seeded shapes; the
tests marked gpu run them compiled on model-sized shapes."""

from __future__ import annotations

import pytest
import torch

from salon.kernels.backend import select_ops, triton_ops
from salon.kernels.linear_two_terms import compose, linear_group32_ref
from salon.kernels.quantize import SCALE_FLOOR, quantize_two_terms_ref
from salon.kernels.rmsnorm import rmsnorm_residual_triton, rmsnorm_triton
from salon.kernels.w8a8_group32 import quantize_group32_ref, w8a8_group32_ref
from salon.kernels.w8a8_group32_triton import (
    quantize_group32_triton,
    rmsnorm_quant_group32_ref,
    rmsnorm_quant_group32_triton,
    w8a8_group32_triton,
    w8a8_group32_two_terms_ref,
    w8a8_group32_two_terms_triton,
)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and bit patterns (torch.equal takes -0.0 for 0.0)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def activations(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows over several binades, with an all-zero group, a group of ties and an outlier confined to its group."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * 2.0 ** torch.randint(-6, 6, (m, 1), generator=gen)
    x[0, :32] = 0.0
    if m > 1:  # absmax 127: the scale is 1.0 and every .5 is a tie
        x[1, :32] = torch.arange(-15.5, 16.5)
        x[1, 31] = 127.0
    if k > 32:
        x[-1, 40] = 1e4
    return x


def operands(m: int, k: int, n: int, per_row_weights: bool = False, seed: int = 0):
    gen = torch.Generator().manual_seed(seed + 100)
    a_q, a_scale = quantize_group32_ref(activations(m, k, seed))
    w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    shape = (n,) if per_row_weights else (n, k // 32)
    # scales over several binades, so the order and rounding of each group's step show in the low bits
    w_scale = (torch.rand(shape, generator=gen) + 0.01) * 2.0 ** torch.randint(-9, -3, shape, generator=gen)
    return a_q, a_scale, w_q, w_scale


# M: one row (decode), a few, past the interpreter's row tile (16); K: one group, three, four; N: not a multiple of
# the column tile (32), and past it
SHAPES = [(1, 32, 5), (2, 64, 33), (3, 96, 40), (17, 128, 7), (5, 128, 65)]


@pytest.mark.parametrize("m, k, n", SHAPES)
def test_quantize_is_the_references_bits(m, k, n):
    x = activations(m, k, seed=m * k)
    q, s = quantize_group32_triton(x)
    q_ref, s_ref = quantize_group32_ref(x)
    assert torch.equal(q, q_ref) and same_bits(s, s_ref)


def test_quantize_ties_zero_groups_and_strided_rows():
    x = torch.zeros(3, 96)
    x[0, :32] = torch.arange(-15.5, 16.5)  # ties: scale 1.0 once 127 is the group's absmax
    x[0, 0] = -127.0
    x[1, 32:64] = 3.0  # row 1: groups 0 and 2 all zero
    x[2] = torch.linspace(-1.0, 1.0, 96)
    q, s = quantize_group32_triton(torch.cat([x, x], dim=1)[:, 96:])  # rows 192 floats apart
    assert x.stride(0) == 96 and s[0, 0].item() == 1.0
    # -14.5 .. 15.5 to even
    assert q[0, 1:32].tolist() == [-14, -14, -12, -12, -10, -10, -8, -8, -6, -6, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4, 6, 6,
                                   8, 8, 10, 10, 12, 12, 14, 14, 16]  # fmt: skip
    assert s[1, 0].item() == SCALE_FLOOR and s[1, 2].item() == SCALE_FLOOR and (q[1, :32] == 0).all()
    q_ref, s_ref = quantize_group32_ref(x)
    assert torch.equal(q, q_ref) and same_bits(s, s_ref)


@pytest.mark.parametrize("m, k", [(1, 32), (3, 96), (17, 160), (2, 640)])
def test_rmsnorm_quant_is_the_unfused_pair(m, k):
    gen = torch.Generator().manual_seed(m + k)
    x = activations(m, k, seed=k)
    x[0, :32] = torch.randn(32, generator=gen)  # a zero group of the input is not one after the norm's weight alone
    w = 1.0 + 0.1 * torch.randn(k, generator=gen)
    w[32:64] = 0.0  # ...but a zero weight makes one
    q, s = rmsnorm_quant_group32_triton(x, w, 1e-6)
    q_ref, s_ref = quantize_group32_triton(rmsnorm_triton(x, w, 1e-6))
    assert torch.equal(q, q_ref) and same_bits(s, s_ref)
    if k > 32:
        assert (s[:, 1] == SCALE_FLOOR).all()
    # to the recipe's reference as rmsnorm_triton is (tl.sum's order): the scales within float rounding
    torch.testing.assert_close(s, rmsnorm_quant_group32_ref(x, w, 1e-6)[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("m, k, n", SHAPES)
@pytest.mark.parametrize("per_row_weights", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_gemm_is_the_references_bits(m, k, n, per_row_weights, with_residual):
    a_q, a_scale, w_q, w_scale = operands(m, k, n, per_row_weights, seed=m + k + n)
    residual = torch.randn(m, n, generator=torch.Generator().manual_seed(9)) if with_residual else None
    got = w8a8_group32_triton(a_q, a_scale, w_q, w_scale, residual)
    expected = w8a8_group32_ref(a_q, a_scale, w_q, w_scale)
    assert same_bits(got, expected if residual is None else residual + expected)


def both_operands(m: int, k: int, n: int, seed: int):
    """The rescored projection's operands: a row's group32 term and its two int8 terms, of the same activations."""
    a_q, a_scale, w_q, w_scale = operands(m, k, n, seed=seed)
    t_q, t_scale = quantize_two_terms_ref(activations(m, k, seed))
    return a_q, a_scale, t_q, t_scale, w_q, w_scale


@pytest.mark.parametrize("m, k, n", SHAPES)
def test_gemm_with_the_two_terms_too_is_both_references_bits(m, k, n):
    """One read of the weights for both values of every row: the group32 GEMM's and the two-term GEMM's bits (the
    terms' sums start from +0.0 and are dequantized per term, then summed; the group32 sum starts from its first
    group's term)."""
    args = both_operands(m, k, n, seed=m + k + n)
    got_a, got_e = w8a8_group32_two_terms_triton(*args)
    want_a, want_e = w8a8_group32_two_terms_ref(*args)
    assert same_bits(got_a, want_a) and same_bits(got_e, want_e)
    assert k == 32 or not same_bits(got_a, got_e)  # two recipes: their low bits differ (k 32: a zero row)
    for i in {0, m - 1}:  # batch invariance
        row = slice(i, i + 1)
        a_q, a_scale, t_q, t_scale, w_q, w_scale = args
        one = w8a8_group32_two_terms_triton(a_q[row], a_scale[row], t_q[[i, m + i]], t_scale[[i, m + i]], w_q, w_scale)
        assert same_bits(one[0], got_a[row]) and same_bits(one[1], got_e[row])


def check_two_terms_signed_zero(device: str) -> None:
    # a zero weight scale times a negative product is -0.0: the group32 sum starts from that term (-0.0), the
    # two-term sums from +0.0 (+0.0 + -0.0 = +0.0), as their references do
    a_q = torch.zeros(1, 32, dtype=torch.int8)
    a_q[0, 0] = -1
    t_q = torch.zeros(2, 32, dtype=torch.int8)
    t_q[:, 0] = -1
    args = (a_q, torch.ones(1, 1), t_q, torch.ones(2), torch.ones(3, 32, dtype=torch.int8), torch.zeros(3, 1))
    a, e = (t.cpu() for t in w8a8_group32_two_terms_triton(*(t.to(device) for t in args)))
    want_a, want_e = w8a8_group32_two_terms_ref(*args)
    assert a.view(torch.int32).eq(torch.tensor(-0.0).view(torch.int32)).all() and same_bits(a, want_a)
    assert e.view(torch.int32).eq(0).all() and same_bits(e, want_e)


def test_gemm_with_the_two_terms_too_keeps_each_sums_first_zero():
    check_two_terms_signed_zero("cpu")


def test_gemm_with_the_two_terms_too_refuses_terms_of_another_shape():
    a_q, a_scale, t_q, t_scale, w_q, w_scale = both_operands(2, 64, 5, seed=1)
    with pytest.raises(ValueError, match="t_q"):
        w8a8_group32_two_terms_triton(a_q, a_scale, t_q[:2], t_scale, w_q, w_scale)
    with pytest.raises(ValueError, match="t_scale"):
        w8a8_group32_two_terms_triton(a_q, a_scale, t_q, t_scale[:3], w_q, w_scale)
    with pytest.raises(ValueError, match="t_q"):
        w8a8_group32_two_terms_triton(a_q, a_scale, t_q.float(), t_scale, w_q, w_scale)


def check_negative_zero(device: str) -> None:
    # one group whose product underflows to -0.0 (the floor scale times 2**-30): the sum starts from that term,
    # not from +0.0 plus it; a second group of zeros then adds +0.0 (-0.0 + +0.0 = +0.0, as the reference has it);
    # and a subnormal scale product (the floor scale times 2**-4) is kept, not flushed to zero
    a_q = torch.zeros(2, 64, dtype=torch.int8)
    a_q[:, 0] = -1
    a_q[1, 32] = 3
    a_scale = torch.full((2, 2), SCALE_FLOOR)
    w_q = torch.ones(3, 64, dtype=torch.int8)
    w_scale = torch.full((3, 2), 2.0**-30)
    w_scale[:, 1] = 2.0**-4
    args = [t.to(device) for t in (a_q[:, :32], a_scale[:, :1], w_q[:, :32], w_scale[:, :1])]
    one_group = w8a8_group32_triton(*args).cpu()
    assert one_group.view(torch.int32).eq(torch.tensor(-0.0).view(torch.int32)).all()
    assert same_bits(one_group, w8a8_group32_ref(a_q[:, :32], a_scale[:, :1], w_q[:, :32], w_scale[:, :1]))
    both = w8a8_group32_triton(*(t.to(device) for t in (a_q, a_scale, w_q, w_scale))).cpu()
    assert both[1].tolist() == [3 * 2.0**-130] * 3
    assert same_bits(both, w8a8_group32_ref(a_q, a_scale, w_q, w_scale))


def test_gemm_keeps_the_first_groups_negative_zero_and_subnormals():
    check_negative_zero("cpu")


def test_gemm_rows_are_batch_invariant():
    m, k, n = 17, 96, 40  # 17 rows: two row tiles of the interpreter's configuration
    a_q, a_scale, w_q, w_scale = operands(m, k, n, seed=5)
    residual = torch.randn(m, n, generator=torch.Generator().manual_seed(6))
    batch = w8a8_group32_triton(a_q, a_scale, w_q, w_scale, residual)
    for i in (0, 7, 15, 16):
        row = slice(i, i + 1)
        assert same_bits(w8a8_group32_triton(a_q[row], a_scale[row], w_q, w_scale, residual[row]), batch[row])
    q, s = quantize_group32_triton(activations(m, k, 7))
    for i in (0, 16):
        assert torch.equal(quantize_group32_triton(activations(m, k, 7)[i : i + 1])[0], q[i : i + 1])


@pytest.mark.parametrize("norm, post_norm, residual", [(0, 0, 0), (1, 0, 1), (1, 1, 1), (0, 1, 0), (0, 0, 1)])
@pytest.mark.parametrize("per_row_weights", [False, True])
def test_triton_group32_op_is_its_unfused_composition(norm, post_norm, residual, per_row_weights):
    m, k, n = 3, 64, 33
    x = activations(m, k, seed=3)
    _, _, w_q, w_scale = operands(m, k, n, per_row_weights, seed=3)
    gen = torch.Generator().manual_seed(4)
    kw = dict(
        norm_weight=1.0 + 0.1 * torch.randn(k, generator=gen) if norm else None,
        eps=1e-6,
        post_norm=1.0 + 0.1 * torch.randn(n, generator=gen) if post_norm else None,
        residual=torch.randn(m, n, generator=gen) if residual else None,
    )
    fused = triton_ops().linear_group32
    assert fused.__name__ == "linear_group32_triton"
    got = fused(x, w_q, w_scale, **kw)
    unfused = compose(rmsnorm_triton, quantize_group32_triton, w8a8_group32_triton, terms=1)
    assert same_bits(got, unfused(x, w_q, w_scale, **kw))
    if not norm and not post_norm:  # no tl.sum in the way: the recipe's reference itself
        assert same_bits(got, linear_group32_ref(x, w_q, w_scale, **kw))
    assert select_ops("cpu", "triton", activations="group32").linear_group32.__name__ == "linear_group32_triton"


def test_bad_operands_are_refused_with_what_is_wrong():
    a_q, a_scale, w_q, w_scale = operands(2, 64, 5)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_group32_triton(torch.zeros(2, 48))
    with pytest.raises(ValueError, match="multiple of 32"):
        rmsnorm_quant_group32_triton(torch.zeros(2, 48), torch.ones(48), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        rmsnorm_quant_group32_triton(torch.zeros(2, 64), torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="a_scale"):
        w8a8_group32_triton(a_q, a_scale[:, :1], w_q, w_scale)
    with pytest.raises(ValueError, match="w_scale"):
        w8a8_group32_triton(a_q, a_scale, w_q, w_scale[:4])
    with pytest.raises(ValueError, match="residual"):
        w8a8_group32_triton(a_q, a_scale, w_q, w_scale, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="w_q"):
        w8a8_group32_triton(a_q, a_scale, w_q.float(), w_scale)


# Gemma 3 270M's qkv, o, gate_up and down, a SmolLM2 width, the output projection: each of the GPU's row tiles
# (M up to 16, 64, more) and both decode column tiles (N up to 2048, more)
CUDA_SHAPES = [(1, 640, 1536), (7, 1024, 640), (64, 640, 4096), (256, 2048, 640), (1000, 576, 1536), (1, 640, 262144)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m, k, n", CUDA_SHAPES)
def test_group32_on_cuda_is_the_references_bits(m, k, n):
    """Compiled (no FMA contraction), on model shapes: the quantization, the fused norm in front of it and the GEMM
    with its residual give the references' bits, the per-row-scale weights too, and each row is the one the kernel
    gives it alone (another row tile's configuration)."""
    x = activations(m, k, seed=m + k).cuda()
    q, s = quantize_group32_triton(x)
    q_ref, s_ref = quantize_group32_ref(x.cpu())
    assert torch.equal(q.cpu(), q_ref) and same_bits(s.cpu(), s_ref)
    w = (torch.rand(k) + 0.5).cuda()
    q2, s2 = rmsnorm_quant_group32_triton(x, w, 1e-6)
    q3, s3 = quantize_group32_triton(rmsnorm_triton(x, w, 1e-6))
    assert torch.equal(q2, q3) and same_bits(s2, s3)
    _, _, w_q, w_scale = operands(1, k, n, seed=n)
    w_q, w_scale = w_q.cuda(), w_scale.cuda()
    residual = torch.randn(m, n, device="cuda")
    got = w8a8_group32_triton(q, s, w_q, w_scale, residual)
    expected = residual.cpu() + w8a8_group32_ref(q_ref, s_ref, w_q.cpu(), w_scale.cpu())
    assert same_bits(got.cpu(), expected)
    per_row = w_scale[:, 0].contiguous()
    expected_per_row = w8a8_group32_ref(q_ref, s_ref, w_q.cpu(), per_row.cpu())
    assert same_bits(w8a8_group32_triton(q, s, w_q, per_row).cpu(), expected_per_row)
    for i in {0, m // 2, m - 1}:
        row = slice(i, i + 1)
        assert same_bits(w8a8_group32_triton(q[row], s[row], w_q, w_scale, residual[row]), got[row])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 8, 64])
def test_group32_with_the_two_terms_too_on_cuda_is_both_references_bits(m):
    """Compiled, on Gemma 3's output projection width and a sixteenth of its vocabulary, at decode and prefill
    row tiles."""
    args = both_operands(m, 640, 16384, seed=m)
    got = w8a8_group32_two_terms_triton(*(t.cuda() for t in args))
    want = w8a8_group32_two_terms_ref(*args)
    assert same_bits(got[0].cpu(), want[0]) and same_bits(got[1].cpu(), want[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_group32_on_cuda_keeps_negative_zero_and_subnormals():
    check_negative_zero("cuda")
    check_two_terms_signed_zero("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("norm, post_norm, residual", [(1, 0, 0), (0, 1, 1), (1, 1, 1)])
def test_group32_op_on_cuda_is_its_unfused_composition(norm, post_norm, residual):
    m, k, n = 64, 640, 1152
    x = activations(m, k, seed=1).cuda()
    _, _, w_q, w_scale = (t.cuda() for t in operands(1, k, n, seed=2))
    kw = dict(
        norm_weight=(torch.rand(k) + 0.5).cuda() if norm else None,
        eps=1e-6,
        post_norm=(torch.rand(n) + 0.5).cuda() if post_norm else None,
        residual=torch.randn(m, n, device="cuda") if residual else None,
    )
    got = triton_ops().linear_group32(x, w_q, w_scale, **kw)
    unfused = compose(rmsnorm_triton, quantize_group32_triton, w8a8_group32_triton, terms=1)
    assert same_bits(got, unfused(x, w_q, w_scale, **kw))
    if post_norm and residual:
        h = rmsnorm_triton(x, kw["norm_weight"], 1e-6) if norm else x
        out = w8a8_group32_triton(*quantize_group32_triton(h), w_q, w_scale)
        assert same_bits(got, rmsnorm_residual_triton(out, kw["post_norm"], 1e-6, kw["residual"]))
