"""W8A8 GEMMs of up to GEMV_MAX_ROWS rows on AVX2 CPUs, through w8a8_gemv.c.

Returns float32(acc) * a_scale[m] * w_scale[n], the bits of the reference's dequantization, so
salon/kernels/cpu/w8a8_gemm.py hands it every step, GEMV_MAX_ROWS rows a call, and keeps its other paths for the
calls it declines without a row's result changing with the batch it sits in. The kernel reads every weight
byte from memory once per call, each thread streaming its own half of the weight rows; the activations are
copied once into zero-padded rows. Measured here (2 AVX2 cores, one call timed at a time, against the AVX2
int16 kernel and the float path): SmolLM2's 3072 x 576 gate_up at 16 rows 0.27 ms vs 0.38 ms, at 128 rows
2.2 ms vs 4.5 ms (int16) and 3.3 ms (float).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from salon.kernels.cpu import native

GEMV_MAX_ROWS = 128  # w8a8_gemv.c's
_C_SOURCE = Path(__file__).with_name("w8a8_gemv.c")
_SIGNATURES = {
    "w8a8_gemv_avx2": (
        [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        + [ctypes.c_int64] * 3
        + [ctypes.c_int],
        ctypes.c_int,
    ),
}


def library() -> ctypes.CDLL | None:
    return native.load(_C_SOURCE, _SIGNATURES) if "avx2" in native.cpu_isas() else None


def w8a8_gemv_scaled(
    a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor | None:
    """f32[M, N] = float32(a_q @ w_q^T) * a_scale[:, None] * w_scale[None, :] for int8 a_q[M, K] with
    1 <= M <= GEMV_MAX_ROWS, int8 w_q[N, K] (contiguous), f32 scales, written into `out` (f32[M, N],
    contiguous) when given; None where the kernel does not take the call (no AVX2 or C compiler, other shapes
    or dtypes, or an activation of -128)."""
    m, k = a_q.shape
    n = w_q.shape[0]
    if (
        not 1 <= m <= GEMV_MAX_ROWS
        or a_q.stride(1) != 1
        or not w_q.is_contiguous()
        or a_scale.dtype != torch.float32
        or w_scale.dtype != torch.float32
        or not a_scale.is_contiguous()
        or not w_scale.is_contiguous()
        or a_q.device.type != "cpu"
    ):
        return None
    lib = library()
    if lib is None:
        return None
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32)
    elif out.dtype != torch.float32 or tuple(out.shape) != (m, n) or not out.is_contiguous():
        raise ValueError(f"out must be contiguous float32 {(m, n)}, got {out.dtype} {tuple(out.shape)}")
    if lib.w8a8_gemv_avx2(
        a_q.data_ptr(),
        a_q.stride(0),
        w_q.data_ptr(),
        out.data_ptr(),
        n,
        a_scale.data_ptr(),
        w_scale.data_ptr(),
        m,
        n,
        k,
        torch.get_num_threads(),
    ):
        return None
    return out
