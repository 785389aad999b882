"""Group-scaled W8A8 GEMM: int8 activations (per-token scales) x int8 weights with one scale per output row
and group of GROUP = 32 input channels (the grid of GGUF's Q8_0).

    acc_g[m, n] = sum_{k in [32g, 32g + 32)} a_q[m, k] * w_q[n, k]     exact, int32; |acc_g| <= 32 * 127 * 128
                                                                        < 2**24, so float32(acc_g) is exact
    y[m, n]     = 0;  for g = 0 .. G-1 in order:  y = y + float32(acc_g) * w_scale[n, g]
                  (each product and each sum rounded to float32: no fused multiply-add)
    y[m, n]     = y * a_scale[m]
    then the epilogue of salon.kernels.w8a8_gemm (bias, geglu, residual) as for per-row scales.

A weight of G = K / 32 scales per row is passed as w_scale f32[N, G]; f32[N] keeps the per-row contract of
salon.kernels.w8a8_gemm. Every path (this reference, salon/kernels/cpu, Triton) evaluates the same operations in the same
order, so a row's result is bit-identical whatever the batch, tiling or thread split (batch invariance).
Per-32 weight scales cut the layers' weight rounding error about 3x against one scale per row
(bench/quant_ceilings.py).
The Triton kernel (w8a8_grouped_triton, reached through salon.kernels.w8a8_gemm.w8a8_gemm_triton) is at the end of this file.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salon.kernels.triton_gemm_tile import finish_tile, gemm_operands, grouped_tile
from salon.kernels.triton_launch import check_tensor, is_interpreted

GROUP = 32


def check_grouped(a_q: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> int:
    """The number of groups G, after checking the shapes of a grouped call (ValueError names what is wrong)."""
    if a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"shape mismatch: a_q {tuple(a_q.shape)} w_q {tuple(w_q.shape)}")
    n, k = w_q.shape
    if k % GROUP:
        raise ValueError(f"w_q: grouped scales need K a multiple of {GROUP}, got {k}")
    if w_scale.dtype != torch.float32 or tuple(w_scale.shape) != (n, k // GROUP):
        raise ValueError(f"w_scale: expected float32 {(n, k // GROUP)} (one scale per row and {GROUP} "
                         f"channels), got {w_scale.dtype} {tuple(w_scale.shape)}")
    return k // GROUP


def group_acc_f32(a_q: torch.Tensor, w_q: torch.Tensor, g: int) -> torch.Tensor:
    """float32[M, N] = float32(acc_g), exact: a float32 GEMM over 32 channels never rounds (|sums| < 2**24)."""
    cols = slice(g * GROUP, (g + 1) * GROUP)
    return a_q[:, cols].to(torch.float32) @ w_q[:, cols].to(torch.float32).T


def w8a8_grouped_scaled_ref(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor,
                            w_scale: torch.Tensor) -> torch.Tensor:
    """f32[M, N]: the grouped dequantization before the epilogue (sum over groups in order, then a_scale)."""
    groups = check_grouped(a_q, w_q, w_scale)
    scale_t = w_scale.T.contiguous()  # [G, N]: one contiguous row of scales per group
    y = torch.zeros((a_q.shape[0], w_q.shape[0]), dtype=torch.float32, device=a_q.device)
    for g in range(groups):
        y.add_(group_acc_f32(a_q, w_q, g).mul_(scale_t[g]))  # product rounded, then the sum rounded
    return y.mul_(a_scale.to(torch.float32)[:, None])


# ----------------------------------------------------------------------------------------------------------
# Triton. One program computes an output tile [BLOCK_M, BLOCK_N]; the K loop takes exactly one group (32
# channels) per iteration: an exact int8 x int8 -> int32 tl.dot over the group, converted to float32 (exact,
# |acc_g| < 2**24), times the group's BLOCK_N weight scales, added to a float32 accumulator in group order.
# The scales of group g are read with strided loads straight from w_scale [N, G] (w_scale[n, g] at
# n * stride_sn + g): no per-call transposed copy; the G scales of a row share cache lines, so the loads of
# consecutive groups hit cache. The kernel is launched with enable_fp_fusion=False, so the GPU evaluates
# `acc + float(dot) * scale` as a rounded product and a rounded sum (no FMA), like the reference; the
# interpreter (numpy) never fuses. After a_scale, the epilogue (bias, geglu, residual) is the per-row kernel's
# (salon/kernels/triton_gemm_tile.py).
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _w8a8_grouped_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, bias_ptr, res_ptr, out_ptr,
    M, N_OUT, K, UP_OFFSET,
    stride_am, stride_wn, stride_sn, stride_rm, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, GEGLU: tl.constexpr,
):
    # BLOCK_K is the group size (32): K is a multiple of it (checked by the launcher), so no K mask.
    # With GEGLU the program also accumulates the "up" rows of w (row n + UP_OFFSET), with their own scales.
    pid_m, pid_n = grouped_tile(M, N_OUT, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N_OUT
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N] view of w^T
    s_ptrs = w_scale_ptr + offs_n.to(tl.int64) * stride_sn  # w_scale[n, 0]; + g for group g
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=mask_m[:, None], other=0)
        w = tl.load(w_ptrs, mask=mask_n[None, :], other=0)
        s = tl.load(s_ptrs, mask=mask_n, other=0.0)
        acc += tl.dot(a, w, out_dtype=tl.int32).to(tl.float32) * s[None, :]
        if GEGLU:
            w_up = tl.load(w_ptrs + UP_OFFSET * stride_wn, mask=mask_n[None, :], other=0)
            s_up = tl.load(s_ptrs + UP_OFFSET * stride_sn, mask=mask_n, other=0.0)
            acc_up += tl.dot(a, w_up, out_dtype=tl.int32).to(tl.float32) * s_up[None, :]
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        s_ptrs += 1

    a_s = tl.load(a_scale_ptr + offs_m, mask=mask_m, other=0.0)
    y = acc * a_s[:, None]
    up = y
    if GEGLU:
        up = acc_up * a_s[:, None]
    finish_tile(y, up, offs_m, offs_n, mask_m, mask_n, bias_ptr, res_ptr, out_ptr, UP_OFFSET, stride_rm, stride_om,
                HAS_BIAS, HAS_RESIDUAL, GEGLU)


def _grouped_config(M: int, N: int, device: torch.device) -> dict:
    """Tile sizes, as salon.kernels.w8a8_gemm._gemm_config with BLOCK_K fixed at one group. Every output element
    is computed by the same operations in the same order whatever the tile, so the result does not depend on
    the configuration (batch invariance across M buckets)."""
    if is_interpreted(device):
        return dict(BLOCK_M=16, BLOCK_N=32 if N <= 1024 else 16384, BLOCK_K=GROUP, GROUP_M=4)
    if M <= 16:  # decode: weight-bandwidth bound, many N tiles to fill the SMs
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=GROUP, GROUP_M=1, num_warps=4, num_stages=4)
    if M <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=GROUP, GROUP_M=8, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=GROUP, GROUP_M=8, num_warps=8, num_stages=3)


def w8a8_grouped_triton(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    geglu: bool = False,
) -> torch.Tensor:
    """-> f32[M, N], or f32[M, N/2] with geglu; w_scale f32[N, K/32]. Bit-identical to
    salon.kernels.w8a8_gemm.w8a8_gemm_ref without geglu (geglu: the Triton tanh of the per-row kernel)."""
    g = gemm_operands(a_q, a_scale, w_q, w_scale, bias, residual, geglu, _group_scales)
    # no FMA: the product and the sum of each group step are rounded separately
    return g.launch(_w8a8_grouped_kernel, _grouped_config(g.M, g.n_out, a_q.device), geglu, scale_stride=True,
                    enable_fp_fusion=False)


def _group_scales(a_q: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    check_tensor("w_scale", w_scale, torch.float32, 2, a_q.device)
    check_grouped(a_q, w_q, w_scale)
    return w_scale if w_scale.stride(1) == 1 else w_scale.contiguous()
