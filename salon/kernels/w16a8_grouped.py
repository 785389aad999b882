"""The int16-activation recipe: one int16 term per activation against the int8 weights with one scale per
output row and group of 32 input channels (salon.kernels.w8a8_grouped's weights, unchanged).

    scale[m]    = max(absmax(x[m]) / 32767, SCALE_FLOOR)            per token, as salon.kernels.quantize with 32767
    a[m, k]     = clamp(round_half_even(x[m, k] / scale[m]), -32767, 32767)            int16
    acc_g[m, n] = sum_{k in [32g, 32g + 32)} a[m, k] * w_q[n, k]     exact, int32: |acc_g| <= 32 * 32767 * 127
                                                                     < 2**27
    y[m, n]     = 0;  for g = 0 .. G-1 in order:  y = y + float32(acc_g) * w_scale[n, g]
                  (float32(acc_g) rounds to nearest even above 2**24; each product and each sum rounded to
                  float32: no fused multiply-add)
    out[m, n]   = y * scale[m]

About 15 bits of each activation through one GEMM row, where the two-term recipe (salon.kernels.quantize's
quantize_two_terms) takes about 14 bits through two int8 rows. On a CPU without VNNI the products are what a
prefill or a batched step spends its time on (bench.gemv), and AVX2's vpmaddwd makes 16 int16 products an
instruction, where the two int8 terms take two vpmaddubsw and two vpmaddwd for 32 products each: more
products a second (measured by `python -m bench.gemv`, its int16_activation_over_int8_ceiling_x). The C kernel is
salon/kernels/cpu/w16a8_grouped.c; salon.kernels.linear_two_terms composes the whole Linear of either recipe.

Every path evaluates the same operations in the same order, so a row's result never depends on the batch it
sits in (batch invariance), as for the int8 GEMMs.
"""

from __future__ import annotations

import torch

from salon.kernels.quantize import SCALE_FLOOR
from salon.kernels.w8a8_grouped import GROUP, check_grouped

INT16_MAX = 32767


def quantize_int16_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] -> (int16[M, K], scale f32[M]): scale = max(absmax / 32767, SCALE_FLOOR), q =
    clamp(round_half_even(x / scale), -32767, 32767)."""
    absmax = x.abs().amax(dim=-1)
    scale = torch.clamp(absmax / float(INT16_MAX), min=SCALE_FLOOR)
    q = torch.round(x / scale[:, None]).clamp_(-INT16_MAX, INT16_MAX).to(torch.int16)
    return q, scale


def w16a8_grouped_ref(a: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """a int16[M, K], a_scale f32[M], w_q int8[N, K], w_scale f32[N, K/32] -> f32[M, N] (the module's
    contract): each group's exact sum (float64 holds it exactly) rounded to float32, times the group's weight
    scales, added in group order (each product and sum rounded), then times a_scale."""
    if a.dtype != torch.int16 or w_q.dtype != torch.int8:
        raise ValueError(f"w16a8_grouped: int16 activations and int8 weights, got {a.dtype} and {w_q.dtype}")
    groups = check_grouped(a, w_q, w_scale)
    scale_t = w_scale.T.contiguous()
    y = torch.zeros((a.shape[0], w_q.shape[0]), dtype=torch.float32, device=a.device)
    for g in range(groups):
        cols = slice(g * GROUP, (g + 1) * GROUP)
        acc = (a[:, cols].to(torch.float64) @ w_q[:, cols].to(torch.float64).T).to(torch.float32)
        y.add_(acc.mul_(scale_t[g]))
    return y.mul_(a_scale.to(torch.float32)[:, None])
