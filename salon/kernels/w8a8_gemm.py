"""W8A8 GEMM: int8 activations (per-token scales) x int8 weights (per-output-channel scales).

    acc[m, n] = sum_k a_q[m, k] * w_q[n, k]                    exact, int32
    y[m, n]   = float(acc[m, n]) * a_scale[m] * w_scale[n]     (evaluated left to right)
    y        += bias[n]                                        (optional)
    geglu:      out[m, j] = gelu_tanh(y[m, j]) * y[m, N/2 + j]  rows [0, N/2) of w are the gate, [N/2, N) the up
    out      += residual[m, :]                                 (optional, added last)

The integer accumulation makes the result independent of tiling and batch size (batch invariance).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from salon.kernels.triton_gemm_tile import finish_tile, gemm_operands, grouped_tile
from salon.kernels.triton_launch import check, check_tensor, is_interpreted
from salon.kernels.w8a8_grouped import w8a8_grouped_scaled_ref, w8a8_grouped_triton

# A float32 dot of int8-valued vectors is exact while |partial sum| < 2**24: K * 127 * 127 < 2**24 for K <= 1040.
EXACT_F32_CHUNK_K = 1024


def int8_matmul_exact(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """a_q int8[M, K] @ w_q int8[N, K]^T -> int32[M, N], exact (float32 GEMMs over K chunks, summed in int32)."""
    M, K = a_q.shape
    acc = torch.zeros((M, w_q.shape[0]), dtype=torch.int32, device=a_q.device)
    for k0 in range(0, K, EXACT_F32_CHUNK_K):
        a = a_q[:, k0:k0 + EXACT_F32_CHUNK_K].float()
        w = w_q[:, k0:k0 + EXACT_F32_CHUNK_K].float()
        acc += (a @ w.T).to(torch.int32)
    return acc


def w8a8_gemm_ref(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    geglu: bool = False,
) -> torch.Tensor:
    """-> f32[M, N], or f32[M, N/2] with geglu. A w_scale of f32[N, K/32] selects the group-scaled contract
    (salon.kernels.w8a8_grouped)."""
    if w_scale.dim() == 2:
        y = w8a8_grouped_scaled_ref(a_q, a_scale, w_q, w_scale)
        return w8a8_epilogue_after_scales(y, bias, residual, geglu)
    return w8a8_epilogue(int8_matmul_exact(a_q, w_q).float(), a_scale, w_scale, bias, residual, geglu)


def w8a8_epilogue(y: torch.Tensor, a_scale: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                  residual: torch.Tensor | None, geglu: bool) -> torch.Tensor:
    """The dequantization and epilogue every PyTorch path shares, in this order (y: float32(acc), overwritten):
    y * a_scale[m] * w_scale[n]; + bias; geglu (gate rows first); + residual."""
    y.mul_(a_scale[:, None]).mul_(w_scale[None, :])
    return w8a8_epilogue_after_scales(y, bias, residual, geglu)


def w8a8_epilogue_after_scales(y: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                               geglu: bool) -> torch.Tensor:
    """The rest of w8a8_epilogue, for a y that already holds float(acc) * a_scale[m] * w_scale[n]."""
    if bias is not None:
        y.add_(bias)
    if geglu:
        half = y.shape[1] // 2
        y = F.gelu(y[:, :half], approximate="tanh") * y[:, half:]
    if residual is not None:
        y = y + residual
    return y


@triton.jit
def _w8a8_gemm_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, bias_ptr, res_ptr, out_ptr,
    M, N_OUT, K, UP_OFFSET,
    stride_am, stride_wn, stride_rm, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, GEGLU: tl.constexpr,
):
    # Output tile [BLOCK_M, BLOCK_N] of out[M, N_OUT]. With GEGLU the program also accumulates the "up" rows
    # of w (row n + UP_OFFSET) next to the "gate" rows n, so gate and up of a column meet in registers.
    pid_m, pid_n = grouped_tile(M, N_OUT, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N_OUT
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N] view of w^T
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0)
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0)
        acc = tl.dot(a, w, acc, out_dtype=tl.int32)
        if GEGLU:
            w_up = tl.load(w_ptrs + UP_OFFSET * stride_wn, mask=mask_k[:, None] & mask_n[None, :], other=0)
            acc_up = tl.dot(a, w_up, acc_up, out_dtype=tl.int32)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    a_s = tl.load(a_scale_ptr + offs_m, mask=mask_m, other=0.0)
    w_s = tl.load(w_scale_ptr + offs_n, mask=mask_n, other=0.0)
    y = acc.to(tl.float32) * a_s[:, None] * w_s[None, :]
    up = y
    if GEGLU:
        w_s_up = tl.load(w_scale_ptr + UP_OFFSET + offs_n, mask=mask_n, other=0.0)
        up = acc_up.to(tl.float32) * a_s[:, None] * w_s_up[None, :]
    finish_tile(y, up, offs_m, offs_n, mask_m, mask_n, bias_ptr, res_ptr, out_ptr, UP_OFFSET, stride_rm, stride_om,
                HAS_BIAS, HAS_RESIDUAL, GEGLU)


def _gemm_config(M: int, N: int, device: torch.device) -> dict:
    """Tile sizes. The int32 sums are exact whatever the tiling, and the epilogue is per element, so the
    result does not depend on the configuration (batch invariance holds across M buckets)."""
    if is_interpreted(device):
        # The interpreter runs one numpy pass per program: wide N tiles keep a 262,144-row output projection
        # at a few hundred programs instead of thousands.
        return dict(BLOCK_M=16, BLOCK_N=32 if N <= 1024 else 16384, BLOCK_K=32, GROUP_M=4)
    if M <= 16:  # decode: weight-bandwidth bound, many N tiles to fill the SMs
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=4)
    if M <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)


def w8a8_gemm_triton(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    geglu: bool = False,
) -> torch.Tensor:
    """-> f32[M, N], or f32[M, N/2] with geglu. Same semantics as w8a8_gemm_ref (a 2-D w_scale: the grouped
    kernel of salon.kernels.w8a8_grouped)."""
    if w_scale.dim() == 2:
        return w8a8_grouped_triton(a_q, a_scale, w_q, w_scale, bias=bias, residual=residual, geglu=geglu)
    g = gemm_operands(a_q, a_scale, w_q, w_scale, bias, residual, geglu, _per_row_scales)
    return g.launch(_w8a8_gemm_kernel, _gemm_config(g.M, g.n_out, a_q.device), geglu)


def _per_row_scales(a_q: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    check_tensor("w_scale", w_scale, torch.float32, 1, a_q.device)
    check(w_scale.shape[0] == w_q.shape[0], f"w_scale: expected {w_q.shape[0]} elements, got {w_scale.shape[0]}")
    return w_scale.contiguous()
