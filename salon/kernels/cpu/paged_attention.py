"""CPU fast path of paged attention, batch- and chunk-invariant by construction.

Same semantics as salon.kernels.paged_attention.paged_attention_ref. Each query row is computed on its
own, so its result never depends on which other queries share the call (other sequences, or the
other tokens of its own prefill chunk). Three implementations, picked by the CPU:

- with AVX-512: paged_attention_avx512.c, the C kernel of paged_attention.h in 16-lane vectors (a work item
  is a run of query rows of one KV head; the header's comment gives the exact order of operations). It reads the
  int8 K/V where they lie, widening them in registers, so a decode step costs what its visible keys cost --
  no copy of the cache per step;
- without AVX-512 but with AVX2 and FMA: paged_attention_avx2.c, the same kernel in 8-lane vectors (same
  interface and limits; its comment gives its fixed sums);
- otherwise (or without a C compiler, or for shapes and dtypes the C kernels decline) the PyTorch path
  (paged_attention_torch.py).

They give the same results to float rounding, not the same bits; one machine always uses the same
one, which is what batch invariance and exact cache hits need.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.paged_attention_torch import paged_attention_torch
from salon.kernels.paged_attention import PagedAttentionArgs

_C_SOURCES = {
    "avx512": Path(__file__).with_name("paged_attention_avx512.c"),
    "avx2": Path(__file__).with_name("paged_attention_avx2.c"),
}
_C_SIGNATURES = {
    "paged_attention_i8": [ctypes.c_void_p] * 6
    + [ctypes.c_int64]
    + [ctypes.c_void_p] * 3
    + [ctypes.c_int64] * 5
    + [ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
}


@functools.cache
def c_isas() -> tuple[str, ...]:
    """The C kernels this CPU can run, best first: "avx512" (paged_attention_avx512.c), "avx2"
    (paged_attention_avx2.c, AVX2 + FMA); the engine runs the first, tests run each."""
    return native.simd_isas()


def build() -> str:
    """The build paged_attention_cpu runs here for the shapes the C kernels take: "avx512", "avx2", or "torch"
    where no C kernel loads. Builds give different bits (the module docstring), so the CPU family's KV names it
    (salon.kernels.backend.Ops.build)."""
    chosen = native.simd_isa()
    return chosen if chosen is not None and _library(chosen) is not None else "torch"


def _library(isa: str | None) -> ctypes.CDLL | None:
    """The library of `isa`'s kernel (default: this CPU's best); None where it cannot run here."""
    chosen = native.simd_isa(isa)
    return native.load(_C_SOURCES[chosen], _C_SIGNATURES) if chosen else None


@functools.cache
def c_limits(isa: str | None = None) -> tuple[int, int] | None:
    """(query heads per KV head, head size) the C kernel (this CPU's, or `isa`) handles at most (its stack
    buffers are sized for them, and the library exports them); None where it cannot run here."""
    lib = _library(isa)
    if lib is None:
        return None
    return (
        ctypes.c_int64.in_dll(lib, "salon_paged_attention_max_group").value,
        ctypes.c_int64.in_dll(lib, "salon_paged_attention_max_head_dim").value,
    )


def c_kernel_supports(num_q_heads: int, num_kv_heads: int, head_dim: int, isa: str | None = None) -> bool:
    limits = c_limits(isa)
    if limits is None or num_kv_heads <= 0 or num_q_heads % num_kv_heads:
        return False
    max_group, max_head_dim = limits
    return num_q_heads // num_kv_heads <= max_group and head_dim % 16 == 0 and head_dim <= max_head_dim


def paged_attention_c(a: PagedAttentionArgs, isa: str | None = None) -> torch.Tensor | None:
    """The C kernel of this CPU (AVX-512, else AVX2 + FMA; see c_isas), or the one named by `isa`; None
    where it cannot run here, or for these shapes and dtypes."""
    q, k_cache, v_cache, k_scale, v_scale = a.q, a.k_cache, a.v_cache, a.k_scale, a.v_scale
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    if (
        not c_kernel_supports(Hq, Hkv, D, isa)
        or q.dtype != torch.float32
        or k_scale is None
        or v_scale is None
        or any(t.dtype != torch.int8 for t in (k_cache, v_cache))
        or any(t.dtype != torch.float32 for t in (k_scale, v_scale))
        or not all(t.is_contiguous() for t in (k_cache, v_cache, k_scale, v_scale))
    ):
        return None
    lib = _library(isa)
    assert lib is not None
    q = q.contiguous()
    tables = a.block_tables.to(torch.int32).contiguous()
    starts = a.query_start_loc.to(torch.int32).contiguous()
    lens = a.seq_lens.to(torch.int32).contiguous()
    row_seq = a.row_seq
    if row_seq is None or row_seq.shape != (T,) or row_seq.dtype != torch.int32 or not row_seq.is_contiguous():
        row_seq = torch.repeat_interleave(torch.arange(lens.numel(), dtype=torch.int32), starts[1:] - starts[:-1])
    out = torch.empty_like(q)
    lib.paged_attention_i8(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k_scale.data_ptr(),
        v_scale.data_ptr(),
        tables.data_ptr(),
        tables.shape[1],
        starts.data_ptr(),
        lens.data_ptr(),
        row_seq.data_ptr(),
        T,
        Hq,
        Hkv,
        D,
        k_cache.shape[1],
        a.sm_scale,
        a.sliding_window or 0,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out


def paged_attention_cpu(a: PagedAttentionArgs) -> torch.Tensor:
    """-> f32[T, Hq, D]: the C kernel where it runs, else the PyTorch path."""
    if a.q.shape[0] == 0:
        return torch.empty_like(a.q)
    out = paged_attention_c(a)
    return out if out is not None else paged_attention_torch(a)
