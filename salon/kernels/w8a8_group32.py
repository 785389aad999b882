"""The group32 activation recipe: one int8 term per activation with its own scale per token and group of 32 input
channels (the granularity of llama.cpp's Q8_0 activations), against int8 weights with one scale per output row
and group of 32 input channels (salon.kernels.w8a8_grouped's weights). Half the int8 products of the two-term
recipe (salon.kernels.quantize's quantize_two_terms), for one more multiply per group.

    a_scale[m, g] = max(absmax(x[m, 32g : 32g + 32]) / 127, SCALE_FLOOR)          float32, IEEE division
    a_q[m, k]     = clamp(round_half_even(x[m, k] / a_scale[m, k // 32]), -127, 127)     int8, IEEE division
    acc_g[m, n]   = sum_{k in [32g, 32g + 32)} a_q[m, k] * w_q[n, k]       exact, int32; |acc_g| <= 32 * 127 * 127
                                                                         < 2**24, so float32(acc_g) is exact
    s_g[m, n]     = a_scale[m, g] * w_scale[n, g]                         rounded to float32
    y[m, n]       = float32(acc_0) * s_0;  for g = 1 .. G-1 in order:  y = y + float32(acc_g) * s_g
                    (each product and each sum rounded to float32: no fused multiply-add)

The bit contract every kernel of the recipe (C, Triton) has to meet is exactly that order: the activation scale
times the weight scale first, that product times the group's integer sum, the groups added from the first on.
It is llama.cpp's order for a Q8_0 dot product (sumi * (d_x * d_y), summed over the blocks), and a row's
result depends on that row alone (batch invariance). An all-zero group gets SCALE_FLOOR and quantizes to zeros.
Weights with one scale per row (w_scale f32[N]) take that scale in every group.

salon.kernels.linear_two_terms composes the whole Linear (norm, this quantization, this GEMM, post-norm, residual)
as the families' `linear_group32` op: the CPU family runs it in C (salon.kernels.cpu.linear_two_terms), the Triton
family on salon.kernels.w8a8_group32_triton's kernels, both with these bits.
"""

from __future__ import annotations

import torch

from salon.kernels.quantize import SCALE_FLOOR
from salon.kernels.w8a8_grouped import GROUP

INT8_MAX = 127
# Output columns per pass of the reference GEMM: bounds its float32 temporaries (an output projection of 262,144
# rows would otherwise take M x 262,144 floats three times); columns are independent, so the bits do not change.
_COLUMNS_PER_PASS = 8192


def quantize_group32_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] (K a multiple of 32) -> (int8[M, K], scale f32[M, K/32]): the module's quantization."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] % GROUP:
        raise ValueError(
            f"quantize_group32: float32 x[M, K] with K a multiple of {GROUP}, got {x.dtype} {tuple(x.shape)}"
        )
    m, k = x.shape
    groups = x.reshape(m, k // GROUP, GROUP)
    scale = torch.clamp(groups.abs().amax(dim=-1) / float(INT8_MAX), min=SCALE_FLOOR)
    q = torch.round(groups / scale[:, :, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.reshape(m, k), scale.contiguous()


def check_group32(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> int:
    """The number of groups G, after checking a call's operands (ValueError names what is wrong)."""
    if a_q.dtype != torch.int8 or w_q.dtype != torch.int8:
        raise ValueError(f"w8a8_group32: int8 activations and weights, got {a_q.dtype} and {w_q.dtype}")
    if a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"w8a8_group32: shape mismatch: a_q {tuple(a_q.shape)} w_q {tuple(w_q.shape)}")
    (m, k), n = a_q.shape, w_q.shape[0]
    if k % GROUP:
        raise ValueError(f"w8a8_group32: K must be a multiple of {GROUP}, got {k}")
    if a_scale.dtype != torch.float32 or tuple(a_scale.shape) != (m, k // GROUP):
        raise ValueError(
            f"a_scale: expected float32 {(m, k // GROUP)} (one scale per token and {GROUP} channels), "
            f"got {a_scale.dtype} {tuple(a_scale.shape)}"
        )
    if w_scale.dtype != torch.float32 or tuple(w_scale.shape) not in ((n,), (n, k // GROUP)):
        raise ValueError(
            f"w_scale: expected float32 {(n,)} or {(n, k // GROUP)}, got {w_scale.dtype} {tuple(w_scale.shape)}"
        )
    return k // GROUP


def w8a8_group32_ref(
    a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor
) -> torch.Tensor:
    """a_q int8[M, K], a_scale f32[M, K/32], w_q int8[N, K], w_scale f32[N, K/32] or f32[N] -> f32[M, N]: the
    module's contract (a float32 GEMM over 32 channels of int8 values is exact: |sums| < 2**24)."""
    groups = check_group32(a_q, a_scale, w_q, w_scale)
    m, n = a_q.shape[0], w_q.shape[0]
    w_scale_t = (w_scale[:, None].expand(n, groups) if w_scale.dim() == 1 else w_scale).T.contiguous()  # [G, N]
    a = a_q.to(torch.float32)
    y = torch.empty((m, n), dtype=torch.float32, device=a_q.device)
    for lo in range(0, n, _COLUMNS_PER_PASS):
        cols = slice(lo, min(n, lo + _COLUMNS_PER_PASS))
        w = w_q[cols].to(torch.float32)
        out = y[:, cols]
        for g in range(groups):
            k = slice(g * GROUP, (g + 1) * GROUP)
            s = a_scale[:, g, None] * w_scale_t[g, None, cols]  # the two scales' product, rounded
            term = (a[:, k] @ w[:, k].T).mul_(s)  # the exact group sum times it, rounded
            if g == 0:
                out.copy_(term)
            else:
                out.add_(term)  # added in group order, rounded
    return y
