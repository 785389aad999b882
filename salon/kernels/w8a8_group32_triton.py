"""The group32 activation recipe (salon.kernels.w8a8_group32) on Triton: its quantization, the RMSNorm fused in front
of it, and its GEMM with the residual fused behind it, each to the bits of the recipe's contract.

quantize_group32_triton(x f32[M, K]) -> (int8[M, K], scale f32[M, K/32])
    One program per block of BLOCK_R (row, group) pairs: x seen as M * G rows of 32 channels. Per group
    scale = max(div_rn(absmax, 127), SCALE_FLOOR), q = round_half_even(clamp(div_rn(x, scale), -127, 127)) (the
    clamp before the rounding gives the same integers: every value past +-127 rounds onto the clamp's own
    bound). A maximum and correctly rounded divisions: quantize_group32_ref's bits, whatever the block.

rmsnorm_quant_group32_triton(x, weight, eps)
    rmsnorm_triton, then quantize_group32_triton, in one launch with their bits: one program per row; the
    sum of squares is rmsnorm_triton's (tl.sum over the whole row as one vector of the same block and warps, then
    1 / sqrt_rn(sum / K + eps)), after which the row is read again BLOCK_G groups at a time ([BLOCK_G, 32] tiles),
    normed with rmsnorm_triton's x * r * w, quantized per group and stored; the normed row never goes through memory.
    To rmsnorm_ref's bits as rmsnorm_triton is (tl.sum's order).

w8a8_group32_triton(a_q, a_scale f32[M, G], w_q, w_scale f32[N, G] or f32[N], residual f32[M, N] | None)
    One program per output tile [BLOCK_M, BLOCK_N] (salon.kernels.triton_gemm_tile's grouped order); the K loop takes
    exactly one group of 32 channels per iteration:
        d = float32(tl.dot(a[BLOCK_M, 32], w^T[32, BLOCK_N]) in int32)       exact (|acc_g| < 2**24)
        s = a_scale[m, g] * w_scale[n, g]                                     rounded
        y = d * s  for the first group, then  y = y + d * s                   the product and the sum each rounded
    compiled without FMA contraction (triton_launch's launcher: enable_fp_fusion=False), then
    y + residual (finish_tile; the reference's residual + y, the same rounding): w8a8_group32_ref's bits, and a
    row's result depends on that row alone (batch invariance). Per-row weight scales (f32[N]) are read with a
    group stride of 0, the same scale in every group, as the reference expands them.

w8a8_group32_two_terms_triton(a_q, a_scale, t_q int8[2M, K], t_scale f32[2M], w_q, w_scale) -> (a, e)
    The same kernel (TWO_TERMS_TOO) for the rescored output projection (salon.kernels.linear_rescored): each weight
    tile also meets the row's two int8 terms (t rows m and M + m), each summed over the groups from +0.0 times the
    weight scales only and dequantized with its row's scale, then the two added: a is w8a8_group32_ref's bits, e
    w8a8_two_terms_ref's, from one read of the weights.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salon.kernels.quantize import SCALE_FLOOR
from salon.kernels.rmsnorm import rmsnorm_ref
from salon.kernels.triton_gemm_tile import finish_tile, tile_start
from salon.kernels.triton_launch import check, check_tensor, is_interpreted, next_pow2, on_device
from salon.kernels.w8a8_group32 import check_group32, quantize_group32_ref, w8a8_group32_ref
from salon.kernels.w8a8_grouped import GROUP
from salon.kernels.w8a8_two_terms import w8a8_two_terms_ref

_MAX_ROW = 32768  # rmsnorm_triton's: a fused row sits in one program's registers for its sum
_QUANT_BLOCK_R = 64  # (row, group) pairs per program of the plain quantization: 2,048 values
_NORM_BLOCK_G = 8  # groups per tile of the fused quantization's pass over its row


@triton.jit
def _quantize_groups(y, scale_floor):
    """[R, 32] values in registers -> (their int8 values as float32 integers, each row's scale): the contract."""
    absmax = tl.max(tl.abs(y), axis=1)
    scale = tl.maximum(tl.math.div_rn(absmax, 127.0), scale_floor)
    q = tl.math.div_rn(y, scale[:, None])
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    q = (q + 12582912.0) - 12582912.0  # round half to even (1.5 * 2**23; |q| <= 127)
    return q, scale


@triton.jit
def _quantize_group32_kernel(
    x_ptr, q_ptr, scale_ptr, M, G, stride_x, stride_q, scale_floor, BLOCK_R: tl.constexpr, GROUP_K: tl.constexpr
):
    pairs = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (row, group) pair r = row * G + group
    mask_r = pairs < M * G
    rows = (pairs // G).to(tl.int64)
    cols = (pairs % G) * GROUP_K
    chans = tl.arange(0, GROUP_K)
    mask = mask_r[:, None]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[:, None] + chans[None, :], mask=mask, other=0.0)
    q, scale = _quantize_groups(x, scale_floor)
    tl.store(q_ptr + rows[:, None] * stride_q + cols[:, None] + chans[None, :], q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + pairs, scale, mask=mask_r)


@triton.jit
def _rmsnorm_quant_group32_kernel(
    x_ptr,
    w_ptr,
    q_ptr,
    scale_ptr,
    K,
    G,
    eps,
    scale_floor,
    BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr,
    GROUP_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # one program per row, addressed as rmsnorm_triton's (contiguous rows)
    cols = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * K + cols, mask=cols < K, other=0.0)
    r = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / K + eps)
    groups = tl.arange(0, BLOCK_G)
    chans = tl.arange(0, GROUP_K)
    for g0 in range(0, G, BLOCK_G):
        mask_g = g0 + groups < G
        offs = (g0 + groups)[:, None] * GROUP_K + chans[None, :]  # [BLOCK_G, 32] channels of the row
        mask = mask_g[:, None]
        xg = tl.load(x_ptr + row * K + offs, mask=mask, other=0.0)
        wg = tl.load(w_ptr + offs, mask=mask, other=0.0)
        q, scale = _quantize_groups(xg * r * wg, scale_floor)
        tl.store(q_ptr + row * K + offs, q.to(tl.int8), mask=mask)
        tl.store(scale_ptr + row * G + g0 + groups, scale, mask=mask_g)


@triton.jit
def _two_terms_step(t_ptrs, second, mask_m, w, ws, e1, e2):
    """One group of the two-term values: each term's rows (at t_ptrs, the second `second` elements on) against the
    group's weight tile w, exact in int32, times its weight scales ws, added to that term's sum."""
    e1 += tl.dot(tl.load(t_ptrs, mask=mask_m[:, None], other=0), w, out_dtype=tl.int32).to(tl.float32) * ws
    e2 += tl.dot(tl.load(t_ptrs + second, mask=mask_m[:, None], other=0), w, out_dtype=tl.int32).to(tl.float32) * ws
    return e1, e2


@triton.jit
def _group32_gemm_kernel(
    a_ptr,
    a_scale_ptr,
    w_ptr,
    w_scale_ptr,
    res_ptr,
    out_ptr,
    M,
    N,
    G,
    stride_am,
    stride_asm,
    stride_wn,
    stride_wsn,
    stride_wsg,
    stride_rm,
    stride_om,
    t_ptr,
    t_scale_ptr,
    e_ptr,
    stride_tm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    TWO_TERMS_TOO: tl.constexpr = False,
):
    offs_m, offs_n, mask_m, mask_n, a_ptrs, w_ptrs = tile_start(
        a_ptr, w_ptr, M, N, stride_am, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    offs_k = tl.arange(0, BLOCK_K)
    as_ptrs = a_scale_ptr + offs_m.to(tl.int64) * stride_asm  # a_scale[m, 0]; + g for group g
    ws_ptrs = w_scale_ptr + offs_n.to(tl.int64) * stride_wsn  # w_scale[n, 0]; + g * stride_wsg

    # TWO_TERMS_TOO: the two int8 terms of each row (t rows m and M + m) meet the same weight tile, each summed over
    # the groups as the two-term GEMM sums them (from 0.0, weight scales only: w8a8_kernel's GROUP_SCALES loop)
    t_ptrs = t_ptr + offs_m[:, None].to(tl.int64) * stride_tm + offs_k[None, :]
    e1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    e2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    # group 0 starts the sum (the reference copies its term rather than adding it to zero: -0.0 stays -0.0)
    a = tl.load(a_ptrs, mask=mask_m[:, None], other=0)
    w = tl.load(w_ptrs, mask=mask_n[None, :], other=0)
    ws = tl.load(ws_ptrs, mask=mask_n, other=0.0)[None, :]
    y = tl.dot(a, w, out_dtype=tl.int32).to(tl.float32) * (tl.load(as_ptrs, mask=mask_m, other=0.0)[:, None] * ws)
    if TWO_TERMS_TOO:
        e1, e2 = _two_terms_step(t_ptrs, M * stride_tm, mask_m, w, ws, e1, e2)
    for _ in range(1, G):
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        t_ptrs += BLOCK_K
        as_ptrs += 1
        ws_ptrs += stride_wsg
        a = tl.load(a_ptrs, mask=mask_m[:, None], other=0)
        w = tl.load(w_ptrs, mask=mask_n[None, :], other=0)
        ws = tl.load(ws_ptrs, mask=mask_n, other=0.0)[None, :]
        s = tl.load(as_ptrs, mask=mask_m, other=0.0)[:, None] * ws
        y = y + tl.dot(a, w, out_dtype=tl.int32).to(tl.float32) * s
        if TWO_TERMS_TOO:
            e1, e2 = _two_terms_step(t_ptrs, M * stride_tm, mask_m, w, ws, e1, e2)
    finish_tile(
        y, y, offs_m, offs_n, mask_m, mask_n, out_ptr, res_ptr, out_ptr, 0, stride_rm, stride_om, False, HAS_RESIDUAL,
        False,
    )  # fmt: skip
    if TWO_TERMS_TOO:  # each term dequantized with its row's scale, then the two summed: w8a8_two_terms_ref's bits
        e = e1 * tl.load(t_scale_ptr + offs_m, mask=mask_m, other=0.0)[:, None]
        e = e + e2 * tl.load(t_scale_ptr + M + offs_m, mask=mask_m, other=0.0)[:, None]
        finish_tile(
            e, e, offs_m, offs_n, mask_m, mask_n, e_ptr, e_ptr, e_ptr, 0, 0, stride_om, False, False, False
        )  # fmt: skip


def quantize_group32_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] (K a multiple of 32) -> (int8[M, K], scale f32[M, K/32]): quantize_group32_ref's bits."""
    M, K = _check_x(x)
    x = x if x.stride(1) == 1 else x.contiguous()
    q = torch.empty((M, K), dtype=torch.int8, device=x.device)
    scale = torch.empty((M, K // GROUP), dtype=torch.float32, device=x.device)
    if M == 0:
        return q, scale
    pairs = M * (K // GROUP)
    on_device(_quantize_group32_kernel, x.device)[(triton.cdiv(pairs, _QUANT_BLOCK_R),)](
        x,
        q,
        scale,
        M,
        K // GROUP,
        x.stride(0),
        q.stride(0),
        SCALE_FLOOR,
        BLOCK_R=_QUANT_BLOCK_R,
        GROUP_K=GROUP,
        num_warps=4,
    )
    return q, scale


def rmsnorm_quant_group32_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K], weight f32[K] -> (int8[M, K], scale f32[M, K/32]): rmsnorm_ref, then quantize_group32_ref."""
    return quantize_group32_ref(rmsnorm_ref(x, weight, eps))


def rmsnorm_quant_group32_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """rmsnorm_triton, then quantize_group32_triton, in one launch with their bits (the module docstring)."""
    M, K = _check_x(x)
    check(0 < K <= _MAX_ROW, f"x: row length must be in [1, {_MAX_ROW}], got {K}")
    check_tensor("weight", weight, torch.float32, 1, x.device)
    check(weight.shape[0] == K, f"weight: expected {K} elements, got {weight.shape[0]}")
    x = x.contiguous()
    q = torch.empty((M, K), dtype=torch.int8, device=x.device)
    scale = torch.empty((M, K // GROUP), dtype=torch.float32, device=x.device)
    if M == 0:
        return q, scale
    block_k = next_pow2(K)
    on_device(_rmsnorm_quant_group32_kernel, x.device)[(M,)](
        x,
        weight.contiguous(),
        q,
        scale,
        K,
        K // GROUP,
        float(eps),
        SCALE_FLOOR,
        BLOCK_K=block_k,
        BLOCK_G=_NORM_BLOCK_G,
        GROUP_K=GROUP,
        num_warps=min(16, max(1, block_k // 256)),  # rmsnorm_triton's: the same reduction over the row
    )
    return q, scale


def _group32_config(M: int, N: int, device: torch.device, two_terms_too: bool = False) -> dict:
    """Tile sizes (BLOCK_K is the group). Every output element is computed by the same operations in the same
    order whatever the tile, so the result does not depend on the configuration (batch invariance across M
    buckets). On the GPU (sm_90): decode is weight-bandwidth bound and wants many N tiles in flight (the K loop
    cannot be split: the groups are summed in order), narrower ones where N is small (o and down: 640 columns are
    20 programs of 32 for 132 SMs), with deep pipelining of the 32-channel steps; prefill wants the large tiles'
    reuse. With the two-term values too (three float32 accumulators a tile), tiles stay at most 64 x 64: three
    128 x 128 ones would not fit a program's registers."""
    if two_terms_too:
        M = min(M, 64)
    if is_interpreted(device):
        return dict(BLOCK_M=16, BLOCK_N=32 if N <= 1024 else 16384, BLOCK_K=GROUP, GROUP_M=4)
    if M <= 16:
        block_n = 32 if N <= 2048 else 64
        return dict(BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=GROUP, GROUP_M=1, num_warps=4, num_stages=6)
    if M <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=GROUP, GROUP_M=8, num_warps=4, num_stages=5)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=GROUP, GROUP_M=8, num_warps=8, num_stages=4)


def w8a8_group32_triton(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """-> f32[M, N]: w8a8_group32_ref's bits (then residual + y where given) in one launch."""
    return _launch(a_q, a_scale, w_q, w_scale, residual, None)[0]


def w8a8_group32_two_terms_ref(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    t_q: torch.Tensor,
    t_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both values of every output row: (w8a8_group32_ref of the group32 term a_q int8[M, K], a_scale f32[M, K/32],
    w8a8_two_terms_ref of the two int8 terms t_q int8[2M, K], t_scale f32[2M]), f32[M, N] each."""
    return w8a8_group32_ref(a_q, a_scale, w_q, w_scale), w8a8_two_terms_ref(t_q, t_scale, w_q, w_scale)


def w8a8_group32_two_terms_triton(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    t_q: torch.Tensor,
    t_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """w8a8_group32_two_terms_ref's bits in one launch: each weight tile read once for the three int8 products (the
    rescored output projection's, salon.kernels.linear_rescored; the two GEMMs, composed, read the weights twice)."""
    dev = a_q.device
    check_tensor("t_q", t_q, torch.int8, 2, dev)
    check_tensor("t_scale", t_scale, torch.float32, 1, dev)
    m = a_q.shape[0]
    want = (2 * m, a_q.shape[1])
    check(tuple(t_q.shape) == want, f"t_q: expected shape {want}, got {tuple(t_q.shape)}")
    check(tuple(t_scale.shape) == (2 * m,), f"t_scale: expected shape {(2 * m,)}, got {tuple(t_scale.shape)}")
    return _launch(a_q, a_scale, w_q, w_scale, None, (t_q if t_q.stride(1) == 1 else t_q.contiguous(), t_scale))


def _launch(a_q, a_scale, w_q, w_scale, residual, terms) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The group32 GEMM (and with terms = (t_q, t_scale) the two-term values too) after the operands' checks."""
    dev = a_q.device
    check_tensor("a_q", a_q, torch.int8, 2, dev)
    check_tensor("w_q", w_q, torch.int8, 2, dev)
    check(a_scale.device == dev and w_scale.device == dev, f"a_scale, w_scale: expected device {dev}")
    groups = check_group32(a_q, a_scale, w_q, w_scale)
    check(groups > 0, "a_q, w_q: K must be a positive multiple of 32, got 0")
    M, N = a_q.shape[0], w_q.shape[0]
    if residual is not None:
        check_tensor("residual", residual, torch.float32, 2, dev)
        check(tuple(residual.shape) == (M, N), f"residual: expected shape {(M, N)}, got {tuple(residual.shape)}")
        residual = residual if residual.stride(1) == 1 else residual.contiguous()
    a_q = a_q if a_q.stride(1) == 1 else a_q.contiguous()
    w_q = w_q if w_q.stride(1) == 1 else w_q.contiguous()
    a_scale = a_scale if a_scale.stride(1) == 1 else a_scale.contiguous()
    w_scale = w_scale if w_scale.stride(-1) == 1 else w_scale.contiguous()
    out = torch.empty((M, N), dtype=torch.float32, device=dev)
    e = torch.empty((M, N), dtype=torch.float32, device=dev) if terms is not None else None
    if M == 0 or N == 0:
        return out, e
    cfg = _group32_config(M, N, dev, terms is not None)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    t_q, t_scale = terms if terms is not None else (a_q, a_scale)
    on_device(_group32_gemm_kernel, dev)[grid](
        a_q,
        a_scale,
        w_q,
        w_scale,
        residual if residual is not None else out,
        out,
        M,
        N,
        groups,
        a_q.stride(0),
        a_scale.stride(0),
        w_q.stride(0),
        w_scale.stride(0),
        w_scale.stride(1) if w_scale.dim() == 2 else 0,
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        t_q,
        t_scale,
        e if e is not None else out,
        t_q.stride(0),
        HAS_RESIDUAL=residual is not None,
        TWO_TERMS_TOO=terms is not None,
        enable_fp_fusion=False,  # the product and the sum of each group step rounded on their own
        **cfg,
    )
    return out, e


def _check_x(x: torch.Tensor) -> tuple[int, int]:
    check_tensor("x", x, torch.float32, 2, x.device)
    M, K = x.shape
    check(K > 0 and K % GROUP == 0, f"x: K must be a positive multiple of {GROUP}, got {K}")
    return M, K
