"""The int16-activation group-scaled GEMM (salon.kernels.w16a8_grouped) on AVX2 CPUs: salon/kernels/cpu/w16a8_grouped.c.

Returns the grouped dequantization, bit for bit the value of salon.kernels.w16a8_grouped.w16a8_grouped_ref: per output
element the exact int32 sum of each group of 32 channels of int16 activations and int8 weights, times that
group's scale, added group after group in order (no fused multiply-add), then times a_scale[m]. Every element
sees the same operations whatever M, the blocking or the thread split, so a row's result never depends on the
batch it sits in. The weights and scales are salon.kernels.w8a8_grouped's, read in their own layout; at decode sizes
every weight byte is read once per call, so T int16 rows cost what the 2T int8 rows of the two-term recipe
(salon.kernels.quantize's quantize_two_terms) cost to stream, and at larger T the int16 products take about half the
instructions. The activations are read where they lie (rows may be strided), so a call costs one output tensor
and one C call.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.w8a8_grouped import check_grouped
from salon.kernels.w16a8_grouped import w16a8_grouped_ref

_SOURCE = Path(__file__).with_name("w16a8_grouped.c")
_SIGNATURES = {
    "w16a8_grouped_avx2": (
        [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
        ]
        + [ctypes.c_int64] * 3
        + [ctypes.c_int],
        ctypes.c_int,
    )
}


def library() -> ctypes.CDLL | None:
    """The kernel's library, or None where this CPU has no AVX2 or there is no C compiler."""
    if "avx2" not in native.cpu_isas():
        return None
    return native.load(_SOURCE, _SIGNATURES)


def w16a8_grouped_cpu(
    a: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, threads: int | None = None
) -> torch.Tensor | None:
    """f32[M, N], the bits of w16a8_grouped_ref(a, a_scale, w_q, w_scale), for int16 a[M, K] (contiguous
    columns; rows may be strided), int8 w_q[N, K] (contiguous), float32 w_scale[N, K/32] (contiguous) and
    floating a_scale[M], on `threads` threads (by default torch's); ValueError where check_grouped refuses the
    shapes; None where the kernel does not take the call (no AVX2 or no C compiler, not on the CPU, other dtypes
    or strides, M = 0), and the caller takes the reference."""
    if a.dtype != torch.int16 or w_q.dtype != torch.int8:
        return None
    check_grouped(a, w_q, w_scale)
    m, k = a.shape
    n = w_q.shape[0]
    if (
        m == 0
        or n == 0
        or a.device.type != "cpu"
        or w_q.device.type != "cpu"
        or w_scale.device.type != "cpu"
        or a_scale.device.type != "cpu"
        or a.stride(1) != 1
        or not w_q.is_contiguous()
        or not w_scale.is_contiguous()
        or tuple(a_scale.shape) != (m,)
        or not a_scale.is_floating_point()
    ):
        return None
    lib = library()
    if lib is None:
        return None
    a_scale = a_scale.to(torch.float32).contiguous()  # the reference's conversion
    out = torch.empty((m, n), dtype=torch.float32)
    if lib.w16a8_grouped_avx2(
        a.data_ptr(),
        a.stride(0),
        w_q.data_ptr(),
        w_scale.data_ptr(),
        out.data_ptr(),
        n,
        a_scale.data_ptr(),
        m,
        n,
        k,
        threads or torch.get_num_threads(),
    ):
        return None
    return out


def w16a8_gemm_cpu(a: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """The int16 recipe's GEMM as the CPU family runs it: w16a8_grouped_cpu, else the reference (same bits)."""
    out = w16a8_grouped_cpu(a, a_scale, w_q, w_scale)
    return w16a8_grouped_ref(a, a_scale, w_q, w_scale) if out is None else out
