"""CPU fast path of RMSNorm (salon.kernels.rmsnorm's contract, the same bits as rmsnorm_ref) through rmsnorm.c: one C
call for every row of a [T, K] or [T, H, K] tensor (the per-head q/k norms read their rows where they lie),
instead of rmsnorm_ref's ~K/16 tensor ops."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.rmsnorm import rmsnorm_ref

_C_SOURCE = Path(__file__).with_name("rmsnorm.c")
_SIGNATURES = {
    "rmsnorm_rows": (
        [ctypes.c_void_p] + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 2 + [ctypes.c_double, ctypes.c_int],
        None,
    )
}


def library() -> ctypes.CDLL | None:
    return native.load(_C_SOURCE, _SIGNATURES) if native.simd_isas() else None


def rmsnorm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x f32[T, K] or f32[T, H, K] (rows of K contiguous values), weight f32[K] -> f32, contiguous; the
    reference where the kernel cannot run (the same bits either way)."""
    lib = library()
    k = x.shape[-1] if x.dim() else 0
    if (
        lib is None
        or x.dim() not in (2, 3)
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or x.device.type != "cpu"
        or weight.device.type != "cpu"
        or x.stride(-1) != 1
        or k == 0
        or tuple(weight.shape) != (k,)
        or not weight.is_contiguous()
    ):
        return rmsnorm_ref(x, weight, eps)
    t, h = x.shape[0], (x.shape[1] if x.dim() == 3 else 1)
    stride_h = x.stride(1) if x.dim() == 3 else k
    y = torch.empty(x.shape, dtype=torch.float32)
    if y.numel():
        lib.rmsnorm_rows(
            x.data_ptr(),
            t,
            h,
            k,
            x.stride(0),
            stride_h,
            weight.data_ptr(),
            y.data_ptr(),
            float(eps),
            torch.get_num_threads(),
        )
    return y
