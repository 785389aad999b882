"""CPU fast path of greedy decoding's top-1 (torch.argmax over each row, first index on ties, NaN first),
through argmax.c: one vectorized pass over each logits row (262,144 floats for Gemma) where torch's
reduction reads it at a fraction of the memory's speed, large calls split over torch's threads. None where the
kernel cannot run here."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from salon.kernels.cpu import native

_C_SOURCE = Path(__file__).with_name("argmax.c")
_SIGNATURES = {
    "argmax_rows": [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
}


def argmax_rows_cpu(x: torch.Tensor) -> list[int] | None:
    """torch.argmax(x, dim=-1).tolist() for float32 x[M, N] (rows may be strided, columns contiguous);
    None where the C kernel does not take it (no AVX2 or C compiler, another dtype or layout)."""
    if (
        x.dim() != 2
        or x.dtype != torch.float32
        or x.device.type != "cpu"
        or x.stride(1) != 1
        or not 0 < x.shape[1] < 2**31
        or "avx2" not in native.cpu_isas()
    ):
        return None
    lib = native.load(_C_SOURCE, _SIGNATURES)
    if lib is None:
        return None
    out = torch.empty(x.shape[0], dtype=torch.int64)
    lib.argmax_rows(x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr(), torch.get_num_threads())
    return out.tolist()
