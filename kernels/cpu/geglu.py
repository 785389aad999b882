"""CPU fast path of kernels.geglu (GeGLU with the fixed-order gelu_tanh) through geglu.c: one C call for every
row, with the bits of geglu_ref, which runs where the C call cannot."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels.cpu import native
from kernels.geglu import geglu_ref

_C_SOURCE = Path(__file__).with_name("geglu.c")
_I = ctypes.c_int64
_SIGNATURES = {"geglu_rows": [ctypes.c_void_p, _I, _I, _I, ctypes.c_void_p, _I]}


def library() -> ctypes.CDLL | None:
    return native.load(_C_SOURCE, _SIGNATURES) if native.simd_isas() else None


def geglu_cpu(y: torch.Tensor) -> torch.Tensor:
    """y f32[M, 2F] (gate columns first; rows may be strided) -> f32[M, F] contiguous: geglu.c, or the
    reference where it cannot run (the same bits either way)."""
    lib = library()
    if (lib is None or y.dim() != 2 or y.dtype != torch.float32 or y.shape[1] % 2 or y.stride(1) != 1
            or y.device.type != "cpu"):
        return geglu_ref(y)
    m, f = y.shape[0], y.shape[1] // 2
    out = torch.empty((m, f), dtype=torch.float32)
    if m and f:
        lib.geglu_rows(y.data_ptr(), m, f, y.stride(0), out.data_ptr(), f)
    return out
