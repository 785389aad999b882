"""The Triton W8A8 GEMM kernel of both weight-scale layouts, one @triton.jit function: one scale per output row
(salon.kernels.w8a8_gemm.w8a8_gemm_triton, GROUP_SCALES=False) or one per row and group of 32 input channels
(salon.kernels.w8a8_grouped.w8a8_grouped_triton, GROUP_SCALES=True). The flag is a tl.constexpr, so each layout
compiles to its own kernel with only its own loop.

One program computes an output tile [BLOCK_M, BLOCK_N] (tile_start picks which). With GEGLU it also
accumulates the "up" rows of w (row n + UP_OFFSET, with their own scales) next to the "gate" rows n, so gate and
up of a column meet in registers.

Per-row scales: the K loop runs in BLOCK_K chunks (the last one masked) of exact int8 x int8 -> int32 tl.dot
into one int32 accumulator; then y = float(acc) * a_scale[m] * w_scale[n], left to right.

Group scales: BLOCK_K is the group (32 channels; K is a multiple of it, checked by the launcher, so no K mask)
and the K loop takes exactly one group per iteration: an exact tl.dot over the group, converted to float32
(exact, |acc_g| < 2**24), times the group's BLOCK_N weight scales, added to a float32 accumulator in group
order; then y = acc * a_scale[m]. The scales of group g are read with strided loads straight from w_scale [N, G]
(w_scale[n, g] at n * stride_sn + g): no per-call transposed copy; the G scales of a row share cache lines, so
the loads of consecutive groups hit cache. The grouped launcher passes enable_fp_fusion=False, so the GPU
evaluates `acc + float(dot) * scale` as a rounded product and a rounded sum (no FMA), like the reference; the
interpreter (numpy) never fuses.

TWO_TERMS (salon.kernels.w8a8_two_terms): a_q holds 2M rows, the two activation terms of output row m at rows m
and M + m (salon.kernels.quantize's two-term layout); the program accumulates both against the same weight tile
(the weights read once) and sums them after each term's scales, as the reference does after its GEMM of 2M rows:
y = y_first + y_second, each y_t dequantized as above. M is the number of output rows.

After the scales, the epilogue (bias, geglu, residual, store) is salon/kernels/triton_gemm_tile.py's finish_tile
for both layouts.
"""

from __future__ import annotations

import triton
import triton.language as tl

from salon.kernels.triton_gemm_tile import finish_tile, tile_start


@triton.jit
def w8a8_kernel(
    a_ptr,
    a_scale_ptr,
    w_ptr,
    w_scale_ptr,
    bias_ptr,
    res_ptr,
    out_ptr,
    M,
    N_OUT,
    K,
    UP_OFFSET,
    stride_am,
    stride_wn,
    stride_sn,
    stride_rm,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    GROUP_SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    GEGLU: tl.constexpr,
    TWO_TERMS: tl.constexpr = False,
):
    offs_m, offs_n, mask_m, mask_n, a_ptrs, w_ptrs = tile_start(
        a_ptr, w_ptr, M, N_OUT, stride_am, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    offs_k = tl.arange(0, BLOCK_K)
    if GROUP_SCALES:
        s_ptrs = w_scale_ptr + offs_n.to(tl.int64) * stride_sn  # w_scale[n, 0]; + g for group g
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K, BLOCK_K):
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0)
            w = tl.load(w_ptrs, mask=mask_n[None, :], other=0)
            s = tl.load(s_ptrs, mask=mask_n, other=0.0)
            acc += tl.dot(a, w, out_dtype=tl.int32).to(tl.float32) * s[None, :]
            if TWO_TERMS:
                a2 = tl.load(a_ptrs + M * stride_am, mask=mask_m[:, None], other=0)
                acc2 += tl.dot(a2, w, out_dtype=tl.int32).to(tl.float32) * s[None, :]
            if GEGLU:
                w_up = tl.load(w_ptrs + UP_OFFSET * stride_wn, mask=mask_n[None, :], other=0)
                s_up = tl.load(s_ptrs + UP_OFFSET * stride_sn, mask=mask_n, other=0.0)
                acc_up += tl.dot(a, w_up, out_dtype=tl.int32).to(tl.float32) * s_up[None, :]
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
            s_ptrs += 1

        a_s = tl.load(a_scale_ptr + offs_m, mask=mask_m, other=0.0)
        y = acc * a_s[:, None]
        if TWO_TERMS:
            a_s2 = tl.load(a_scale_ptr + M + offs_m, mask=mask_m, other=0.0)
            y = y + acc2 * a_s2[:, None]
        up = y
        if GEGLU:
            up = acc_up * a_s[:, None]
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k0 in range(0, K, BLOCK_K):
            mask_k = offs_k < K - k0
            a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0)
            w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0)
            acc = tl.dot(a, w, acc, out_dtype=tl.int32)
            if TWO_TERMS:
                a2 = tl.load(a_ptrs + M * stride_am, mask=mask_m[:, None] & mask_k[None, :], other=0)
                acc2 = tl.dot(a2, w, acc2, out_dtype=tl.int32)
            if GEGLU:
                w_up = tl.load(w_ptrs + UP_OFFSET * stride_wn, mask=mask_k[:, None] & mask_n[None, :], other=0)
                acc_up = tl.dot(a, w_up, acc_up, out_dtype=tl.int32)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K

        a_s = tl.load(a_scale_ptr + offs_m, mask=mask_m, other=0.0)
        w_s = tl.load(w_scale_ptr + offs_n, mask=mask_n, other=0.0)
        y = acc.to(tl.float32) * a_s[:, None] * w_s[None, :]
        if TWO_TERMS:
            a_s2 = tl.load(a_scale_ptr + M + offs_m, mask=mask_m, other=0.0)
            y = y + acc2.to(tl.float32) * a_s2[:, None] * w_s[None, :]
        up = y
        if GEGLU:
            w_s_up = tl.load(w_scale_ptr + UP_OFFSET + offs_n, mask=mask_n, other=0.0)
            up = acc_up.to(tl.float32) * a_s[:, None] * w_s_up[None, :]
    finish_tile(
        y,
        up,
        offs_m,
        offs_n,
        mask_m,
        mask_n,
        bias_ptr,
        res_ptr,
        out_ptr,
        UP_OFFSET,
        stride_rm,
        stride_om,
        HAS_BIAS,
        HAS_RESIDUAL,
        GEGLU,
    )
