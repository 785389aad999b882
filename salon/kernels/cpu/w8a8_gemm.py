"""CPU fast path of the W8A8 GEMM; same signature and bit-identical results as salon.kernels.w8a8_gemm.w8a8_gemm_ref.

Exact ways to get the int32 accumulator acc = a_q @ w_q^T, best first:

- The AVX-512 VNNI kernel of w8a8_acc.c, at any M, VNNI_ROW_BLOCK rows at a time: 64 byte products per
  instruction, the weights read once per call (decode is bound by reading them at small batches, by
  the multiplies at large ones). Measured here (2 cores) against the AVX2 kernel: the 262,144 x 640 output
  projection at 32 rows 9.9 ms vs 37 ms, at 1 row 2.7 ms vs 2.7 ms; a 256 x 4096 x 640 prefill GEMM 1.8 ms
  vs 8.7 ms for the float path.
- Without VNNI, at any M, GEMV_MAX_ROWS rows a call, the AVX2 GEMV of w8a8_gemv.c: exact int8 products
  through vpmaddubsw, every weight byte read from memory once per call, the rows split between the threads,
  the dequantization done as it stores (faster than the next two paths at every M measured, 1 to 1024 rows);
  it declines activations holding -128 (the next paths take those).
- Without VNNI, the AVX2 kernel for M < SMALL_M_ROWS or for any M on a weight of LARGE_WEIGHT_ELEMENTS or more
  (the output projection, which the float path would widen to 670 MB every call), C_ROW_BLOCK rows at a time.
- Otherwise, or without a C compiler: float32 GEMMs (MKL) on int8-valued operands. A float32 dot is exact
  while every partial sum stays below 2^24, which holds for K chunks of at most 1024 (1024*127*127 < 2^24);
  chunk results are added in float64 (exact), so the f32 value of the sum equals float32(int32 acc)
  exactly. Weights are widened to float32 a block of rows at a time, so no float copy of the weights is kept.

The C kernels are compiled with the system C compiler on first use and loaded with ctypes. Each output
element depends only on its own row and column, so results never depend on M, the row blocking or the
thread split.

Epilogue, in the reference's order: y = float(acc) * a_scale[m] * w_scale[n]; + bias; geglu; + residual.

Group-scaled weights (w_scale f32[N, K/32], salon.kernels.w8a8_grouped) go through a C kernel at every M: on
AVX-512 VNNI w8a8_grouped_vnni.c, else the AVX2 kernel of w8a8_grouped.c (which declines an activation of
-128); without either, the grouped reference.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.native import cpu_isas
from salon.kernels.cpu.w8a8_gemv import GEMV_MAX_ROWS, w8a8_gemv_scaled
from salon.kernels.cpu.w8a8_grouped import w8a8_grouped_scaled_cpu
from salon.kernels.w8a8_gemm import EXACT_F32_CHUNK_K, w8a8_epilogue, w8a8_epilogue_after_scales
from salon.kernels.w8a8_grouped import w8a8_grouped_scaled_ref

# The AVX2 kernel beats the float path below this many rows (or for weights of LARGE_WEIGHT_ELEMENTS or
# more, which the float path would widen to float32 every call), in C_ROW_BLOCK rows at a time.
SMALL_M_ROWS = 64
LARGE_WEIGHT_ELEMENTS = 1 << 24
C_ROW_BLOCK = 32
# The VNNI kernel beats the float path at every M; rows go through it VNNI_ROW_BLOCK at a time so that the
# uint8 activations of one call (VNNI_ROW_BLOCK x K bytes) stay in the L2 cache.
VNNI_ROW_BLOCK = 256
# Rows of w widened to float32 per block in the float path (bounds the temporary to ~40 MB at K=640).
_W_BLOCK_ROWS = 16384

_C_SOURCE = Path(__file__).with_name("w8a8_acc.c")
_SIGNATURES = {
    "w8a8_acc_avx2": [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [ctypes.c_int],
    "w8a8_acc_vnni": [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_int],
}


def int8_acc_c(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    isa: str | None = None,
    a_scale: torch.Tensor | None = None,
    w_scale: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Exact int32 a_q @ w_q^T through one call of a C kernel (the best one, or `isa`), or None when
    it is unavailable. With a_scale and w_scale (VNNI only): float32(acc) * a_scale[m] * w_scale[n] instead,
    the first step of the epilogue done as the results are stored."""
    lib = native.load(_C_SOURCE, _SIGNATURES)
    isas = cpu_isas()
    isa = isa or (isas[0] if isas else None)
    if lib is None or isa not in isas or (a_scale is not None and isa != "vnni"):
        return None
    m, k = a_q.shape
    n = w_q.shape[0]
    w = w_q.contiguous()
    threads = torch.get_num_threads()
    if isa == "vnni":
        kp, mp = (k + 63) // 64 * 64, (m + 3) // 4 * 4
        a_u8 = torch.full((mp, kp), 128, dtype=torch.uint8)
        torch.bitwise_xor(a_q.view(torch.uint8), 0x80, out=a_u8[:m, :k])  # int8 x -> uint8 x + 128
        if a_scale is None:
            out = torch.empty((m, n), dtype=torch.int32)
            scales = (None, None)
        else:
            out = torch.empty((m, n), dtype=torch.float32)
            a_scale, w_scale = a_scale.to(torch.float32).contiguous(), w_scale.to(torch.float32).contiguous()
            scales = (a_scale.data_ptr(), w_scale.data_ptr())
        lib.w8a8_acc_vnni(a_u8.data_ptr(), w.data_ptr(), out.data_ptr(), *scales, m, mp, n, k, kp, threads)
    else:
        kp = (k + 31) // 32 * 32
        a16 = torch.zeros((m, kp), dtype=torch.int16)
        a16[:, :k] = a_q
        out = torch.empty((m, n), dtype=torch.int32)
        lib.w8a8_acc_avx2(a16.data_ptr(), w.data_ptr(), out.data_ptr(), m, n, k, kp, threads)
    return out


def int8_acc_c_blocked(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    isa: str | None = None,
    a_scale: torch.Tensor | None = None,
    w_scale: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """int8_acc_c over blocks of rows (exact, so the blocking never changes a result); None when no C
    kernel runs here."""
    isas = cpu_isas()
    isa = isa or (isas[0] if isas else None)
    rows = VNNI_ROW_BLOCK if isa == "vnni" else C_ROW_BLOCK
    parts = []
    for m0 in range(0, a_q.shape[0], rows):
        part = int8_acc_c(a_q[m0 : m0 + rows], w_q, isa, None if a_scale is None else a_scale[m0 : m0 + rows], w_scale)
        if part is None:
            return None
        parts.append(part)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _gemv_blocked(
    a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor
) -> torch.Tensor | None:
    """The AVX2 GEMV's scaled product over blocks of GEMV_MAX_ROWS rows; None when it declines a block."""
    m = a_q.shape[0]
    if m <= GEMV_MAX_ROWS:
        return w8a8_gemv_scaled(a_q, a_scale, w_q, w_scale)
    out = torch.empty((m, w_q.shape[0]), dtype=torch.float32)
    for m0 in range(0, m, GEMV_MAX_ROWS):
        rows = slice(m0, m0 + GEMV_MAX_ROWS)
        if w8a8_gemv_scaled(a_q[rows], a_scale[rows], w_q, w_scale, out=out[rows]) is None:
            return None
    return out


def int8_acc_f32(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """float32[M, N] holding exactly float32(int32 a_q @ w_q^T), via float32 GEMMs on K chunks <= 1024."""
    m, k = a_q.shape
    n = w_q.shape[0]
    a = a_q.to(torch.float32)
    out = torch.empty((m, n), dtype=torch.float32)
    for n0 in range(0, n, _W_BLOCK_ROWS):
        wb = w_q[n0 : n0 + _W_BLOCK_ROWS].to(torch.float32)
        if k <= EXACT_F32_CHUNK_K:
            torch.matmul(a, wb.T, out=out[:, n0 : n0 + wb.shape[0]])
            continue
        acc = torch.zeros((m, wb.shape[0]), dtype=torch.float64)
        for k0 in range(0, k, EXACT_F32_CHUNK_K):
            acc += (a[:, k0 : k0 + EXACT_F32_CHUNK_K] @ wb[:, k0 : k0 + EXACT_F32_CHUNK_K].T).to(torch.float64)
        out[:, n0 : n0 + wb.shape[0]] = acc
    return out


def w8a8_gemm_cpu(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    geglu: bool = False,
) -> torch.Tensor:
    """-> f32[M, N], or f32[M, N/2] with geglu. Bit-identical to w8a8_gemm_ref."""
    if a_q.dtype != torch.int8 or w_q.dtype != torch.int8:
        raise ValueError("a_q and w_q must be int8")
    if a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"shape mismatch: a_q {tuple(a_q.shape)} w_q {tuple(w_q.shape)}")
    if w_scale.dim() == 2:
        y = w8a8_grouped_scaled_cpu(a_q, a_scale, w_q, w_scale)
        if y is None:
            y = w8a8_grouped_scaled_ref(a_q, a_scale, w_q, w_scale)
        return w8a8_epilogue_after_scales(y, bias, residual, geglu)
    isas = cpu_isas()
    if "vnni" in isas and a_q.device.type == "cpu":
        y = int8_acc_c_blocked(a_q, w_q, "vnni", a_scale, w_scale)
        if y is not None:
            return w8a8_epilogue_after_scales(y, bias, residual, geglu)
    if a_q.device.type == "cpu":
        y = _gemv_blocked(a_q, a_scale, w_q, w_scale)
        if y is not None:
            return w8a8_epilogue_after_scales(y, bias, residual, geglu)
    use_c = a_q.shape[0] < SMALL_M_ROWS or w_q.numel() >= LARGE_WEIGHT_ELEMENTS
    acc = int8_acc_c_blocked(a_q, w_q, "avx2" if "avx2" in isas else None) if use_c else None
    y = acc.to(torch.float32) if acc is not None else int8_acc_f32(a_q, w_q)
    return w8a8_epilogue(y, a_scale, w_scale, bias, residual, geglu)
