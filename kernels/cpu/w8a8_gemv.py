"""Decode-sized W8A8 GEMMs (M <= GEMV_MAX_ROWS rows) on AVX2 CPUs, through w8a8_gemv.c.

Returns float32(acc) * a_scale[m] * w_scale[n], the bits of the reference's dequantization, so
kernels/cpu/w8a8_gemm.py hands it the small steps and keeps its other paths for the large ones without a
row's result changing with the batch it sits in. The kernel reads every weight byte once per call, each
thread streaming its own half of the weight rows; the activations are read where they lie (int8, no
widened copy), so a call costs one output tensor and one C call.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels.cpu import native

GEMV_MAX_ROWS = 8
_C_SOURCE = Path(__file__).with_name("w8a8_gemv.c")
_SIGNATURES = {
    "w8a8_gemv_avx2": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                        ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_int], ctypes.c_int),
}


def library() -> ctypes.CDLL | None:
    return native.load(_C_SOURCE, _SIGNATURES) if "avx2" in native.cpu_isas() else None


def w8a8_gemv_scaled(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor,
                     w_scale: torch.Tensor) -> torch.Tensor | None:
    """f32[M, N] = float32(a_q @ w_q^T) * a_scale[:, None] * w_scale[None, :] for int8 a_q[M, K] with
    1 <= M <= GEMV_MAX_ROWS, int8 w_q[N, K] (contiguous), f32 scales; None where the kernel does not take
    the call (no AVX2 or C compiler, other shapes or dtypes, or an activation of -128)."""
    m, k = a_q.shape
    n = w_q.shape[0]
    if (not 1 <= m <= GEMV_MAX_ROWS or a_q.stride(1) != 1 or not w_q.is_contiguous()
            or a_scale.dtype != torch.float32 or w_scale.dtype != torch.float32
            or not a_scale.is_contiguous() or not w_scale.is_contiguous() or a_q.device.type != "cpu"):
        return None
    lib = library()
    if lib is None:
        return None
    out = torch.empty((m, n), dtype=torch.float32)
    if lib.w8a8_gemv_avx2(a_q.data_ptr(), a_q.stride(0), w_q.data_ptr(), out.data_ptr(), n, a_scale.data_ptr(),
                          w_scale.data_ptr(), m, n, k, torch.get_num_threads()):
        return None
    return out
