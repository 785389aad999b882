"""The group-scaled W8A8 Triton GEMM (salon/kernels/w8a8_grouped.py) against w8a8_gemm_ref. Without CUDA the kernel runs
in Triton's interpreter on CPU tensors; shapes stay small because the interpreter is slow. Same strictness as the
per-row kernel in test_kernels_triton.py: bit-identical without geglu, geglu (the kernel's tanh via exp against
torch's gelu) to rtol = atol = 1e-5."""

from __future__ import annotations

import pytest
import torch

from salon.kernels.w8a8_gemm import w8a8_gemm_ref, w8a8_gemm_triton
from salon.kernels.w8a8_grouped import GROUP, w8a8_grouped_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPILOGUES = ["none", "bias", "residual", "bias_residual"]


def _to(t):
    return None if t is None else t.to(DEVICE)


def _case(M: int, K: int, N: int, seed: int, bias: bool = False, residual: bool = False, n_out: int | None = None):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    a_s = torch.rand(M, generator=g) / 50 + 1e-4
    # scales over several binades, so the order and rounding of the per-group sum show in the low bits
    w_s = (torch.rand(N, K // GROUP, generator=g) + 0.01) * 2.0 ** torch.randint(-9, -3, (N, K // GROUP), generator=g)
    b = torch.randn(N, generator=g) if bias else None
    res = torch.randn(M, N if n_out is None else n_out, generator=g) if residual else None
    return a, a_s, w, w_s, b, res


@pytest.mark.parametrize("M", [1, 3, 17])
@pytest.mark.parametrize("K", [32, 96])
@pytest.mark.parametrize("N", [8, 40])
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_grouped_bit_exact_without_geglu(M, K, N, epilogue):
    a, a_s, w, w_s, b, res = _case(M, K, N, seed=M * K + N, bias="bias" in epilogue, residual="residual" in epilogue)
    out = w8a8_gemm_triton(_to(a), _to(a_s), _to(w), _to(w_s), bias=_to(b), residual=_to(res))
    assert out.shape == (M, N)
    assert torch.equal(out.cpu(), w8a8_gemm_ref(a, a_s, w, w_s, bias=b, residual=res))


@pytest.mark.parametrize("M", [1, 3, 17])
@pytest.mark.parametrize("K", [32, 96])
@pytest.mark.parametrize("N", [8, 40])
@pytest.mark.parametrize("with_bias", [False, True])
def test_grouped_geglu(M, K, N, with_bias):
    a, a_s, w, w_s, b, res = _case(M, K, N, seed=M + K + N, bias=with_bias, residual=True, n_out=N // 2)
    w_s = w_s / 4  # gate/up mostly of order 1 (max about 20), the value range of the per-row geglu test
    out = w8a8_gemm_triton(_to(a), _to(a_s), _to(w), _to(w_s), bias=_to(b), residual=_to(res), geglu=True)
    ref = w8a8_gemm_ref(a, a_s, w, w_s, bias=b, residual=res, geglu=True)
    assert out.shape == (M, N // 2)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_grouped_direct_call_and_strided_scales():
    # w8a8_grouped_triton directly, with w_scale a transposed view ([G, N] storage) and a_q a column slice
    a, a_s, w, w_s, b, res = _case(5, 128, 40, seed=11, bias=True, residual=True)
    a_wide = torch.cat([a, a], dim=1)[:, :128]
    w_s_view = w_s.T.contiguous().T
    assert not w_s_view.is_contiguous()
    out = w8a8_grouped_triton(_to(a_wide), _to(a_s), _to(w), _to(w_s_view), bias=_to(b), residual=_to(res))
    assert torch.equal(out.cpu(), w8a8_gemm_ref(a, a_s, w, w_s, bias=b, residual=res))


@pytest.mark.parametrize("geglu", [False, True])
def test_grouped_batch_invariant(geglu):
    M, K, N = 17, 96, 40  # 17 rows: two BLOCK_M tiles in the interpreter's config
    a, a_s, w, w_s, b, res = _case(M, K, N, seed=5, bias=True, residual=True, n_out=N // 2 if geglu else N)
    args = [_to(t) for t in (a, a_s, w, w_s, b, res)]
    batch = w8a8_gemm_triton(*args[:4], bias=args[4], residual=args[5], geglu=geglu)
    for i in [0, 7, 15, 16]:
        alone = w8a8_gemm_triton(
            args[0][i : i + 1],
            args[1][i : i + 1],
            args[2],
            args[3],
            bias=args[4],
            residual=args[5][i : i + 1],
            geglu=geglu,
        )
        assert torch.equal(alone, batch[i : i + 1]), i
    first = w8a8_gemm_triton(
        args[0][:3], args[1][:3], args[2], args[3], bias=args[4], residual=args[5][:3], geglu=geglu
    )
    assert torch.equal(first, batch[:3])


def test_grouped_rejects_bad_arguments():
    a = torch.zeros(2, 48, dtype=torch.int8, device=DEVICE)
    w = torch.zeros(4, 48, dtype=torch.int8, device=DEVICE)
    s2 = torch.ones(2, device=DEVICE)
    with pytest.raises(ValueError, match="K a multiple of 32, got 48"):
        w8a8_gemm_triton(a, s2, w, torch.ones(4, 1, device=DEVICE))
    a, w = a[:, :32].contiguous(), w[:, :32].contiguous()
    with pytest.raises(ValueError, match=r"w_scale: expected float32 \(4, 1\)"):
        w8a8_gemm_triton(a, s2, w, torch.ones(4, 2, device=DEVICE))
    with pytest.raises(ValueError, match="w_scale: expected dtype torch.float32"):
        w8a8_grouped_triton(a, s2, w, torch.ones(4, 1, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="w_scale: expected 2 dimensions"):
        w8a8_grouped_triton(a, s2, w, torch.ones(4, device=DEVICE))
    with pytest.raises(ValueError, match="a_q: expected dtype torch.int8"):
        w8a8_gemm_triton(a.float(), s2, w, torch.ones(4, 1, device=DEVICE))
    with pytest.raises(ValueError, match="residual: expected shape"):
        w8a8_gemm_triton(
            a, s2, w, torch.ones(4, 1, device=DEVICE), residual=torch.zeros(2, 4, device=DEVICE), geglu=True
        )
