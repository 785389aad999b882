"""CPU fast paths of per-token int8 quantization (alone and behind the RMSNorm), through quantize.c.

Bit-identical to salon.kernels.quantize's references (quantize_group32_cpu to salon.kernels.w8a8_group32's: the
same IEEE division and round-half-even). quantize.c has
two builds of the same arithmetic: AVX-512 (16 lanes) where the CPU has AVX-512 F and BW, else AVX2 + FMA
(8 lanes); where neither can run (an older CPU, or no C compiler) the references run instead.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.rmsnorm import rmsnorm_cpu
from salon.kernels.quantize import SCALE_FLOOR, quantize_per_token_ref, quantize_two_terms_ref
from salon.kernels.w8a8_group32 import quantize_group32_ref
from salon.kernels.w8a8_grouped import GROUP
from salon.kernels.w16a8_grouped import quantize_int16_ref

_C_SOURCE = Path(__file__).with_name("quantize.c")
_QUANTIZE_ARGS = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2 + [ctypes.c_float, ctypes.c_int]
_KV_WRITE_ARGS = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_float, ctypes.c_int]
_SIGNATURES = {
    f"{name}_{isa}": args
    for isa in ("avx512", "avx2")
    for name, args in (
        ("quantize_rows", _QUANTIZE_ARGS),
        ("kv_write_rows", _KV_WRITE_ARGS),
        ("quantize_group32_rows", _QUANTIZE_ARGS),
    )
}
_SIGNATURES["quantize_two_terms_rows_avx2"] = (_QUANTIZE_ARGS, ctypes.c_int)
_SIGNATURES["quantize_int16_rows_avx2"] = _QUANTIZE_ARGS


def library() -> ctypes.CDLL | None:
    """quantize.c's library where one of its builds runs on this CPU (native.simd_isas()), else None."""
    return native.load(_C_SOURCE, _SIGNATURES) if native.simd_isas() else None


_kernels: dict[tuple[str, str | None], object] = {}  # (name, isa) -> the loaded function (a few us per call saved)


def kernel(name: str, isa: str | None = None):
    """quantize.c's `name` ("quantize_rows", "kv_write_rows" or "quantize_group32_rows") in the build for `isa`
    ("avx512" or "avx2"; default: the best this CPU runs); None where that build cannot run here."""
    fn = _kernels.get((name, isa))
    if fn is None:
        chosen = native.simd_isa(isa)
        lib = library()
        if lib is None or chosen is None:
            return None
        fn = _kernels[(name, isa)] = getattr(lib, f"{name}_{chosen}")
    return fn


def _quantized_rows(
    name: str, isa: str | None, x: torch.Tensor, ref, terms: int = 1, dtype: torch.dtype = torch.int8
) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize.c's `name` on x f32[M, K] -> (q dtype[terms * M, K], scale f32[terms * M]); `ref(x)` where
    the kernel cannot run or declines (returns nonzero)."""
    fn = kernel(name, isa)
    if fn is None or x.dtype != torch.float32 or x.dim() != 2 or x.device.type != "cpu":
        return ref(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    q = torch.empty((terms * m, k), dtype=dtype)
    scale = torch.empty((terms * m,), dtype=torch.float32)
    if (
        m
        and k
        and fn(x.data_ptr(), m, k, x.stride(0), q.data_ptr(), scale.data_ptr(), SCALE_FLOOR, torch.get_num_threads())
    ):
        return ref(x)
    return q, scale


def quantize_per_token_cpu(x: torch.Tensor, isa: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] -> (int8[M, K], scale f32[M]); same bits as quantize_per_token_ref. `isa` picks a build
    of the kernel (tests); the reference runs where it cannot."""
    return _quantized_rows("quantize_rows", isa, x, quantize_per_token_ref)


def quantize_two_terms_cpu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] -> (int8[2M, K], scale f32[2M]): both int8 terms of every row in one call (the AVX2 build;
    it runs on AVX-512 CPUs too); same bits as quantize_two_terms_ref, which runs where the kernel cannot."""
    return _quantized_rows("quantize_two_terms_rows", "avx2", x, quantize_two_terms_ref, terms=2)


def quantize_int16_cpu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] -> (int16[M, K], scale f32[M]) in one call (the AVX2 build; it runs on AVX-512 CPUs too);
    same bits as salon.kernels.w16a8_grouped.quantize_int16_ref, which runs where the kernel cannot."""
    return _quantized_rows("quantize_int16_rows", "avx2", x, quantize_int16_ref, dtype=torch.int16)


def quantize_group32_cpu(x: torch.Tensor, isa: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x f32[M, K] (K a multiple of 32) -> (int8[M, K], scale f32[M, K/32]): one int8 term per token and 32
    channels, the bits of salon.kernels.w8a8_group32.quantize_group32_ref (ValueError where it refuses x). `isa`
    picks a build of the kernel (tests); the reference runs where it cannot."""
    fn = kernel("quantize_group32_rows", isa)
    if (
        fn is None
        or x.dtype != torch.float32
        or x.dim() != 2
        or x.shape[1] % GROUP
        or x.device.type != "cpu"
        or not x.shape[0]
        or not x.shape[1]
    ):
        return quantize_group32_ref(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8)
    scale = torch.empty((m, k // GROUP), dtype=torch.float32)
    fn(x.data_ptr(), m, k, x.stride(0), q.data_ptr(), scale.data_ptr(), SCALE_FLOOR, torch.get_num_threads())
    return q, scale


def rmsnorm_quant_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """rmsnorm_cpu, then quantize_per_token_cpu: same bits as rmsnorm_quant_ref."""
    return quantize_per_token_cpu(rmsnorm_cpu(x, weight, eps))
