"""CPU fast path of salon.kernels.rmsnorm_rope (the per-head RMSNorm, then NeoX RoPE) through rmsnorm_rope.c: one C
call for every head of every token where the CPU family makes two (rmsnorm_cpu, then rope_neox_cpu), with
their bits; their composition runs where the C call cannot. rmsnorm_rope_kv_cpu (salon.kernels.rmsnorm_rope_kv) is
that op on q and on k, then kv_write_cpu."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.kv_write import kv_write_cpu
from salon.kernels.cpu.rmsnorm import rmsnorm_cpu
from salon.kernels.cpu.rope import rope_neox_cpu, rope_tables
from salon.kernels.rmsnorm_rope import compose
from salon.kernels.rmsnorm_rope_kv import compose as compose_with_kv_write

_C_SOURCE = Path(__file__).with_name("rmsnorm_rope.c")
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "rmsnorm_rope_rows": ([_P, _I, _I, _I, _I, _I, _P, ctypes.c_double, _P, _P, _P, _P, ctypes.c_int], ctypes.c_int)
}

composed = compose(rmsnorm_cpu, rope_neox_cpu, "rmsnorm_rope_composed_cpu")


def library() -> ctypes.CDLL | None:
    return native.load(_C_SOURCE, _SIGNATURES) if native.simd_isas() else None


def rmsnorm_rope_c(
    x: torch.Tensor, weight: torch.Tensor, eps: float, positions: torch.Tensor, base: float
) -> torch.Tensor | None:
    """The one C call, or None where it does not take these arguments."""
    if (
        x.dim() != 3
        or x.dtype != torch.float32
        or x.stride(-1) != 1
        or x.device.type != "cpu"
        or x.shape[0] == 0
        or x.shape[-1] % 2
        or weight.dtype != torch.float32
        or tuple(weight.shape) != (x.shape[-1],)
        or not weight.is_contiguous()
        or positions.dtype != torch.int64
        or positions.shape != (x.shape[0],)
        or not positions.is_contiguous()
    ):
        return None
    lib = library()
    if lib is None:
        return None
    lo, hi = (int(v) for v in torch.aminmax(positions))
    if lo < 0:
        return None
    t, h, d = x.shape
    cos, sin = rope_tables(d, base, hi + 1)
    y = torch.empty(x.shape, dtype=torch.float32)
    if lib.rmsnorm_rope_rows(
        x.data_ptr(),
        t,
        h,
        d,
        x.stride(0),
        x.stride(1),
        weight.data_ptr(),
        float(eps),
        positions.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        y.data_ptr(),
        torch.get_num_threads(),
    ):
        return None
    return y


def rmsnorm_rope_cpu(
    x: torch.Tensor, weight: torch.Tensor, eps: float, positions: torch.Tensor, base: float
) -> torch.Tensor:
    """salon.kernels.rmsnorm_rope's op: the C call where it runs, else rmsnorm_cpu then rope_neox_cpu (same bits)."""
    y = rmsnorm_rope_c(x, weight, eps, positions, base)
    return composed(x, weight, eps, positions, base) if y is None else y


# salon.kernels.rmsnorm_rope_kv's op: rmsnorm_rope_cpu on q and on k, then kv_write_cpu (the CPU family's bits)
rmsnorm_rope_kv_cpu = compose_with_kv_write(rmsnorm_rope_cpu, kv_write_cpu, "rmsnorm_rope_kv_cpu")
