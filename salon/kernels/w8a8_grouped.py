"""Group-scaled W8A8 GEMM: int8 activations (per-token scales) x int8 weights with one scale per output row
and group of GROUP = 32 input channels (the grid of GGUF's Q8_0).

    acc_g[m, n] = sum_{k in [32g, 32g + 32)} a_q[m, k] * w_q[n, k]     exact, int32; |acc_g| <= 32 * 127 * 128
                                                                        < 2**24, so float32(acc_g) is exact
    y[m, n]     = 0;  for g = 0 .. G-1 in order:  y = y + float32(acc_g) * w_scale[n, g]
                  (each product and each sum rounded to float32: no fused multiply-add)
    y[m, n]     = y * a_scale[m]
    then the epilogue of salon.kernels.w8a8_gemm (bias, geglu, residual) as for per-row scales.

A weight of G = K / 32 scales per row is passed as w_scale f32[N, G]; f32[N] keeps the per-row contract of
salon.kernels.w8a8_gemm. Every path (this reference, salon/kernels/cpu, Triton) evaluates the same operations in the
same
order, so a row's result is bit-identical whatever the batch, tiling or thread split (batch invariance).
Per-32 weight scales cut the layers' weight rounding error about 3x against one scale per row
(bench/quant_ceilings.py).
The Triton launcher (w8a8_grouped_triton, reached through salon.kernels.w8a8_gemm.w8a8_gemm_triton) is at the end of
this file; its kernel is salon/kernels/w8a8_triton.py's, with GROUP_SCALES.
"""

from __future__ import annotations

import torch

from salon.kernels.triton_gemm_tile import gemm_operands
from salon.kernels.triton_launch import check_tensor, is_interpreted
from salon.kernels.w8a8_triton import w8a8_kernel

GROUP = 32


def check_grouped(a_q: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> int:
    """The number of groups G, after checking the shapes of a grouped call (ValueError names what is wrong)."""
    if a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"shape mismatch: a_q {tuple(a_q.shape)} w_q {tuple(w_q.shape)}")
    n, k = w_q.shape
    if k % GROUP:
        raise ValueError(f"w_q: grouped scales need K a multiple of {GROUP}, got {k}")
    if w_scale.dtype != torch.float32 or tuple(w_scale.shape) != (n, k // GROUP):
        raise ValueError(
            f"w_scale: expected float32 {(n, k // GROUP)} (one scale per row and {GROUP} "
            f"channels), got {w_scale.dtype} {tuple(w_scale.shape)}"
        )
    return k // GROUP


def group_acc_f32(a_q: torch.Tensor, w_q: torch.Tensor, g: int) -> torch.Tensor:
    """float32[M, N] = float32(acc_g), exact: a float32 GEMM over 32 channels never rounds (|sums| < 2**24)."""
    cols = slice(g * GROUP, (g + 1) * GROUP)
    return a_q[:, cols].to(torch.float32) @ w_q[:, cols].to(torch.float32).T


def w8a8_grouped_scaled_ref(
    a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor
) -> torch.Tensor:
    """f32[M, N]: the grouped dequantization before the epilogue (sum over groups in order, then a_scale)."""
    groups = check_grouped(a_q, w_q, w_scale)
    scale_t = w_scale.T.contiguous()  # [G, N]: one contiguous row of scales per group
    y = torch.zeros((a_q.shape[0], w_q.shape[0]), dtype=torch.float32, device=a_q.device)
    for g in range(groups):
        y.add_(group_acc_f32(a_q, w_q, g).mul_(scale_t[g]))  # product rounded, then the sum rounded
    return y.mul_(a_scale.to(torch.float32)[:, None])


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
    return g.launch(
        w8a8_kernel, _grouped_config(g.M, g.n_out, a_q.device), geglu, group_scales=True, enable_fp_fusion=False
    )


def _group_scales(a_q: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    check_tensor("w_scale", w_scale, torch.float32, 2, a_q.device)
    check_grouped(a_q, w_q, w_scale)
    return w_scale if w_scale.stride(1) == 1 else w_scale.contiguous()
