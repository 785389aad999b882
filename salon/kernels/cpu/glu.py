"""CPU fast paths of salon.kernels.glu (GeGLU and SwiGLU with the fixed-order activations) through glu.c: one C call for
every row (a prefill's rows split over torch's threads), with the bits of the references, which run where the C call
cannot."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.glu import geglu_ref, swiglu_ref

_C_SOURCE = Path(__file__).with_name("glu.c")
_I = ctypes.c_int64
_ROWS = [ctypes.c_void_p, _I, _I, _I, ctypes.c_void_p, _I, ctypes.c_int]
_SIGNATURES = {"geglu_rows": _ROWS, "swiglu_rows": _ROWS}


def library() -> ctypes.CDLL | None:
    return native.load(_C_SOURCE, _SIGNATURES) if native.simd_isas() else None


def _rows(name: str, ref: Callable[[torch.Tensor], torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """y f32[M, 2F] (gate columns first; rows may be strided) -> f32[M, F] contiguous: glu.c's `name`, or the
    reference where it cannot run (the same bits either way)."""
    lib = library()
    if (
        lib is None
        or y.dim() != 2
        or y.dtype != torch.float32
        or y.shape[1] % 2
        or y.stride(1) != 1
        or y.device.type != "cpu"
    ):
        return ref(y)
    m, f = y.shape[0], y.shape[1] // 2
    out = torch.empty((m, f), dtype=torch.float32)
    if m and f:
        getattr(lib, name)(y.data_ptr(), m, f, y.stride(0), out.data_ptr(), f, torch.get_num_threads())
    return out


def geglu_cpu(y: torch.Tensor) -> torch.Tensor:
    return _rows("geglu_rows", geglu_ref, y)


def swiglu_cpu(y: torch.Tensor) -> torch.Tensor:
    return _rows("swiglu_rows", swiglu_ref, y)
