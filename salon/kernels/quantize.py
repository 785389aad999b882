"""Per-token symmetric int8 quantization, alone and fused behind an RMSNorm.

Semantics (the engine's int8 contract): for each row, scale = absmax / 127 (floored at SCALE_FLOOR so an
all-zero row gets a positive scale and quantizes to zeros), q = clamp(round_half_even(x / scale), -127, 127).
Dequantization is q * scale. The Triton kernel reproduces the reference bit for bit for quantize_per_token
(IEEE division, ties to even); behind the RMSNorm the row sum is reduced in another order, so values on a
rounding boundary may differ by one step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salon.kernels.rmsnorm import rmsnorm_ref
from salon.kernels.triton_launch import check, check_tensor, next_pow2, on_device

# Smallest normal float32: any row with absmax >= 127 * SCALE_FLOOR keeps scale == absmax / 127 exactly.
SCALE_FLOOR = 2.0**-126
# Rounding in the kernels: in float32, (x + 1.5 * 2**23) - 1.5 * 2**23 (= 12582912.0) rounds x to an integer,
# ties to even, for |x| < 2**22 (here |x| <= 127): the same result as torch.round.
_MAX_ROW = 32768


def quantize_per_token_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] -> (int8[M, K], scale f32[M])."""
    absmax = x.abs().amax(dim=-1)
    scale = torch.clamp(absmax / 127.0, min=SCALE_FLOOR)
    q = torch.round(x / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_two_terms_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] -> (int8[2M, K], scale f32[2M]): x ~ s1 * q1 + s2 * q2, rows [0, M) the first term
    (quantize_per_token_ref of x), rows [M, 2M) the second (of the residual x - q1 * s1, each product and the
    difference rounded to float32): ~14 bits of activation through one int8 GEMM of 2M rows."""
    q1, s1 = quantize_per_token_ref(x)
    q2, s2 = quantize_per_token_ref(x - q1.to(torch.float32) * s1[:, None])
    return torch.cat([q1, q2]), torch.cat([s1, s2])


def rmsnorm_quant_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K], weight f32[K] -> (int8[M, K], scale f32[M]): salon.kernels.rmsnorm's contract, then
    quantize_per_token_ref."""
    return quantize_per_token_ref(rmsnorm_ref(x, weight, eps))


@triton.jit
def _quantize_row(x, scale_floor):
    """A row in registers -> (its int8 values as float32 integers, its scale): the contract's bits."""
    absmax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(tl.math.div_rn(absmax, 127.0), scale_floor)
    y = tl.math.div_rn(x, scale)
    y = tl.minimum(tl.maximum(y, -127.0), 127.0)
    y = (y + 12582912.0) - 12582912.0  # round half to even
    return y, scale


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    w_ptr,
    q_ptr,
    scale_ptr,
    M,
    K,
    stride_x,
    stride_q,
    eps,
    scale_floor,
    BLOCK_K: tl.constexpr,
    RMSNORM: tl.constexpr,
    TWO_TERMS: tl.constexpr,
):
    # One program per row; the whole row sits in registers (BLOCK_K >= K). TWO_TERMS: the residual's term too,
    # into row M + row (quantize_two_terms_ref's layout).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    mask = cols < K
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if RMSNORM:
        mean_sq = tl.sum(x * x, axis=0) / K
        rstd = 1.0 / tl.sqrt_rn(mean_sq + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        x = x * rstd * w
    y, scale = _quantize_row(x, scale_floor)
    tl.store(q_ptr + row * stride_q + cols, y.to(tl.int8), mask=mask)
    tl.store(scale_ptr + row, scale)
    if TWO_TERMS:
        y2, scale2 = _quantize_row(x - y * scale, scale_floor)
        tl.store(q_ptr + (M + row) * stride_q + cols, y2.to(tl.int8), mask=mask)
        tl.store(scale_ptr + M + row, scale2)


def _launch_quantize(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, terms: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    check_tensor("x", x, torch.float32, 2, x.device)
    M, K = x.shape
    check(0 < K <= _MAX_ROW, f"x: row length must be in [1, {_MAX_ROW}], got {K}")
    if weight is not None:
        check_tensor("weight", weight, torch.float32, 1, x.device)
        check(weight.shape[0] == K, f"weight: expected {K} elements, got {weight.shape[0]}")
        weight = weight.contiguous()
    x = x if x.stride(1) == 1 else x.contiguous()
    q = torch.empty((terms * M, K), dtype=torch.int8, device=x.device)
    scale = torch.empty((terms * M,), dtype=torch.float32, device=x.device)
    if M == 0:
        return q, scale
    kernel = on_device(_quantize_rows_kernel, x.device)
    block_k = next_pow2(K)
    kernel[(M,)](
        x,
        weight if weight is not None else x,
        q,
        scale,
        M,
        K,
        x.stride(0),
        q.stride(0),
        float(eps),
        SCALE_FLOOR,
        BLOCK_K=block_k,
        RMSNORM=weight is not None,
        TWO_TERMS=terms == 2,
        num_warps=min(16, max(1, block_k // 256)),
    )
    return q, scale


def quantize_per_token_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] -> (int8[M, K], scale f32[M])."""
    return _launch_quantize(x, None, 0.0)


def quantize_two_terms_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_two_terms_ref in one launch: each row's first term, then its residual's term from the same
    registers (the product and the difference rounded on their own, as the reference's), into rows M + row."""
    return _launch_quantize(x, None, 0.0, terms=2)


def rmsnorm_quant_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K], weight f32[K] -> (int8[M, K], scale f32[M])."""
    return _launch_quantize(x, weight, eps)


def rmsnorm_quant_two_terms_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K], weight f32[K] -> (int8[2M, K], scale f32[2M]): rmsnorm_ref, then quantize_two_terms_ref."""
    return quantize_two_terms_ref(rmsnorm_ref(x, weight, eps))


def rmsnorm_quant_two_terms_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """rmsnorm_triton, then quantize_two_terms_triton, in one launch with their bits: the kernel's norm is
    rmsnorm_triton's operations in its order (tl.sum over the same block, x * r * w), its terms
    quantize_two_terms_triton's; the normed row stays in registers instead of a round trip through memory,
    which holds float32 exactly. To rmsnorm_ref's bits as rmsnorm_triton is (tl.sum's order)."""
    return _launch_quantize(x, weight, eps, terms=2)
