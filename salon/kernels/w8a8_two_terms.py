"""The W8A8 GEMM of two-term activations with the terms summed in its epilogue: one launch gives a Linear's
output rows (salon.kernels.linear_two_terms' `y[:M] + y[M:]` after a GEMM of 2M rows, without that sum's own
pass over the output).

    w8a8_two_terms(a_q int8[2M, K], a_scale f32[2M], w_q int8[N, K], w_scale f32[N] or f32[N, K/32],
                   residual f32[M, N] | None) -> f32[M, N]

Contract (w8a8_two_terms_ref): the reference GEMM of all 2M rows (salon.kernels.w8a8_gemm.w8a8_gemm_ref: each row
dequantized with its own scale), then out = y[:M] + y[M:] (rounded to float32), then out = residual + out. The
kernel (salon/kernels/w8a8_triton.py, TWO_TERMS) accumulates rows m and M + m against the same weight tile,
dequantizes each with the same operations in the same order as the reference and adds them, then the residual:
the same bits (float addition commutes, so `y + residual` is `residual + y`).
"""

from __future__ import annotations

import torch

from salon.kernels.triton_gemm_tile import gemm_operands
from salon.kernels.w8a8_gemm import _gemm_config, _per_row_scales, w8a8_gemm_ref
from salon.kernels.w8a8_grouped import _group_scales, _grouped_config
from salon.kernels.w8a8_triton import w8a8_kernel


def w8a8_two_terms_ref(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """-> f32[M, N] (the module docstring's contract)."""
    m = a_q.shape[0] // 2
    y = w8a8_gemm_ref(a_q, a_scale, w_q, w_scale)
    out = y[:m] + y[m:]
    return out if residual is None else residual + out


def w8a8_two_terms_triton(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """-> f32[M, N]: w8a8_two_terms_ref's bits in one launch (per-row or group scales, by w_scale's shape)."""
    grouped = w_scale.dim() == 2
    g = gemm_operands(
        a_q, a_scale, w_q, w_scale, None, residual, False, _group_scales if grouped else _per_row_scales, 2
    )
    if grouped:
        cfg = _grouped_config(g.M, g.n_out, a_q.device)
        return g.launch(w8a8_kernel, cfg, False, group_scales=True, two_terms=True, enable_fp_fusion=False)
    return g.launch(w8a8_kernel, _gemm_config(g.M, g.n_out, a_q.device), False, group_scales=False, two_terms=True)
