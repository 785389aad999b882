"""CPU fast paths of per-token int8 quantization (alone and behind the RMSNorm), through quantize.c.

Bit-identical to kernels.quantize's references (the same IEEE division and round-half-even); where the C
kernel cannot run (no AVX-512 or no C compiler) the references run instead.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels.cpu import native
from kernels.quantize import SCALE_FLOOR, quantize_per_token_ref, rmsnorm_ref

_C_SOURCE = Path(__file__).with_name("quantize.c")
_SIGNATURES = {
    "quantize_rows": [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2 + [ctypes.c_float, ctypes.c_int],
    "kv_write_rows": [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_float, ctypes.c_int],
}


def library() -> ctypes.CDLL | None:
    return native.load(_C_SOURCE, _SIGNATURES) if native.has_avx512() else None


def quantize_per_token_cpu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] -> (int8[M, K], scale f32[M]); same bits as quantize_per_token_ref."""
    lib = library()
    if lib is None or x.dtype != torch.float32 or x.dim() != 2 or x.device.type != "cpu":
        return quantize_per_token_ref(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8)
    scale = torch.empty((m,), dtype=torch.float32)
    if m and k:
        lib.quantize_rows(x.data_ptr(), m, k, x.stride(0), q.data_ptr(), scale.data_ptr(), SCALE_FLOOR,
                          torch.get_num_threads())
    return q, scale


def rmsnorm_quant_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The RMSNorm of the reference, then quantize_per_token_cpu: same bits as rmsnorm_quant_ref."""
    return quantize_per_token_cpu(rmsnorm_ref(x, weight, eps))
