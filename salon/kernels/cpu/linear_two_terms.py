"""CPU fast paths of salon.kernels.linear_two_terms's ops (the norm, both int8 terms, the one int16 term or the group32
recipe's one int8 term per 32 channels, the grouped GEMM, the terms' sum, the post-norm and the residual) through
linear_two_terms.h: one C call where a decode step made five to eight, with the bits of the composition of the CPU
family's own kernels, which runs where the C call cannot. The int16 op's GEMM is salon/kernels/cpu/w16a8_grouped.c
(AVX2): its C call is the AVX2 build's on every CPU. The group32 op's is the grouped GEMM's group32 entry point
(salon.kernels.cpu.w8a8_group32), in the build this CPU runs.

The C call takes grouped weights (w_scale f32[N, K/32]) for up to MAX_ROWS rows (decode, small batches,
speculative verification: the sizes where the calls' overhead is a large part of the step), in the build of
the grouped GEMM this CPU runs (salon.kernels.cpu.w8a8_grouped: linear_two_terms.c around the AVX-512 VNNI GEMM,
linear_two_terms_avx2.c around the AVX2 one); larger calls, per-row weight scales and other CPUs run the
composition.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.quantize import quantize_group32_cpu, quantize_int16_cpu, quantize_two_terms_cpu
from salon.kernels.cpu.rmsnorm import rmsnorm_cpu
from salon.kernels.cpu.w8a8_gemm import w8a8_gemm_cpu
from salon.kernels.cpu.w8a8_group32 import w8a8_group32_gemm_cpu
from salon.kernels.cpu.w8a8_grouped import chosen_isa, weight_pointers
from salon.kernels.cpu.w16a8_grouped import w16a8_gemm_cpu
from salon.kernels.linear_rescored import compose as compose_rescored
from salon.kernels.linear_two_terms import compose
from salon.kernels.quantize import SCALE_FLOOR
from salon.kernels.w8a8_grouped import GROUP

MAX_ROWS = 64
# linear_two_terms.h's SUM2_MAX_ROWS and linear_two_terms.c's RESCORE_MAX_GROUPS: the most rows and input groups of the
# rescored output projection's one C call
SUM2_MAX_ROWS = 32
RESCORE_MAX_GROUPS = 1024
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGS = ([_P, _I, _I, _I, _P, ctypes.c_double, _P, _P, _I, _P, _P, _I, _P, ctypes.c_float, ctypes.c_int], ctypes.c_int)
# grouped GEMM isa -> (source, its one entry point)
_KERNELS = {
    "vnni": (Path(__file__).with_name("linear_two_terms.c"), "linear_two_terms_vnni"),
    "avx2": (Path(__file__).with_name("linear_two_terms_avx2.c"), "linear_two_terms_avx2"),
}
_SIGNATURES = {isa: {name: _ARGS} for isa, (_, name) in _KERNELS.items()}
_SIGNATURES["avx2"]["linear_int16_avx2"] = _ARGS  # the int16 recipe's one entry point, in the AVX2 build
# the group32 recipe's entry point in each build
_GROUP32_ENTRIES = {"vnni": "linear_group32_vnni", "avx2": "linear_group32_avx2"}
for _isa, _name in _GROUP32_ENTRIES.items():
    _SIGNATURES[_isa][_name] = _ARGS
# the rescored output projection's entry point (salon.kernels.linear_rescored), in the VNNI build only
_SIGNATURES["vnni"]["linear_rescored_vnni"] = (
    [_P, _I, _I, _I, _P, _P, _P, _I, _P, _P, ctypes.c_float, ctypes.c_int],
    ctypes.c_int,
)

composed = compose(rmsnorm_cpu, quantize_two_terms_cpu, w8a8_gemm_cpu, "linear_two_terms_composed_cpu")


composed_int16 = compose(rmsnorm_cpu, quantize_int16_cpu, w16a8_gemm_cpu, "linear_int16_composed_cpu", terms=1)


composed_group32 = compose(
    rmsnorm_cpu, quantize_group32_cpu, w8a8_group32_gemm_cpu, "linear_group32_composed_cpu", terms=1
)


def library(isa: str | None = None) -> ctypes.CDLL | None:
    """The build around the grouped GEMM for `isa` ("vnni", "avx2"; by default the one the CPU family's GEMM
    runs here), or None where this CPU does not run it or there is no C compiler."""
    isa = chosen_isa(isa)
    return native.load(_KERNELS[isa][0], _SIGNATURES[isa]) if isa else None


# (isa, recipe) -> the loaded entry point (a few microseconds a call saved)
_entries: dict[tuple[str | None, str], object] = {}


def entry(isa: str | None = None, recipe: str = "two_terms"):
    """The C entry point of the activation `recipe` ("two_terms" and "group32": in `isa`'s build, see library;
    "int16": in the AVX2 build whatever `isa`, its GEMM being AVX2's), or None."""
    fn = _entries.get((isa, recipe))
    if fn is None:
        chosen = "avx2" if recipe == "int16" else chosen_isa(isa)
        lib = library(chosen)
        if lib is None:
            return None
        names = {"int16": "linear_int16_avx2", "group32": _GROUP32_ENTRIES[chosen]}
        fn = _entries[(isa, recipe)] = getattr(lib, names.get(recipe, _KERNELS[chosen][1]))
    return fn


def _grouped_operands(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, max_rows: int) -> bool:
    """Whether x f32[M, K] (1 <= M <= max_rows, contiguous rows on the CPU), w_q int8[N, K] and w_scale f32[N, K/32]
    (both contiguous) are what the C calls take."""
    if x.dim() != 2 or w_q.dim() != 2 or w_scale.dim() != 2:
        return False
    m, k = x.shape
    n = w_q.shape[0]
    return (
        1 <= m <= max_rows
        and k % GROUP == 0
        and w_q.shape[1] == k
        and tuple(w_scale.shape) == (n, k // GROUP)
        and x.dtype == torch.float32
        and x.stride(1) == 1
        and x.device.type == "cpu"
        and w_q.dtype == torch.int8
        and w_q.is_contiguous()
        and w_scale.dtype == torch.float32
        and w_scale.is_contiguous()
    )


def _f32_vector(t: torch.Tensor | None, n: int) -> bool:
    return t is None or (
        t.dtype == torch.float32 and tuple(t.shape) == (n,) and t.is_contiguous() and t.device.type == "cpu"
    )


def linear_two_terms_c(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    post_norm: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    isa: str | None = None,
    recipe: str = "two_terms",
) -> torch.Tensor | None:
    """The one C call of the activation `recipe` (in `isa`'s build, by default this CPU's), or None where it
    does not take these arguments (the caller composes)."""
    if not _grouped_operands(x, w_q, w_scale, MAX_ROWS):
        return None
    m, k = x.shape
    n = w_q.shape[0]
    if (
        not _f32_vector(norm_weight, k)
        or not _f32_vector(post_norm, n)
        or (
            residual is not None
            and (
                residual.dtype != torch.float32
                or tuple(residual.shape) != (m, n)
                or residual.stride(1) != 1
                or residual.device.type != "cpu"
            )
        )
    ):
        return None
    fn = entry(isa, recipe)
    if fn is None:
        return None
    # the VNNI GEMM reads its packed copy of the weights (salon.kernels.cpu.w8a8_grouped); the int16 one, AVX2's, never
    w_ptr, s_ptr = weight_pointers(w_q, w_scale, None if recipe == "int16" else chosen_isa(isa))
    out = torch.empty((m, n), dtype=torch.float32)
    if fn(
        x.data_ptr(),
        m,
        k,
        x.stride(0),
        None if norm_weight is None else norm_weight.data_ptr(),
        float(eps),
        w_ptr,
        s_ptr,
        n,
        None if post_norm is None else post_norm.data_ptr(),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        out.data_ptr(),
        SCALE_FLOOR,
        torch.get_num_threads(),
    ):
        return None
    return out


def _with_fallback(recipe: str, fallback: Callable, name: str) -> Callable:
    """The op of `recipe`: the C call where it runs, else `fallback` (the CPU family's composition, same bits)."""

    def linear(
        x: torch.Tensor,
        w_q: torch.Tensor,
        w_scale: torch.Tensor,
        norm_weight: torch.Tensor | None = None,
        eps: float = 0.0,
        post_norm: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = linear_two_terms_c(x, w_q, w_scale, norm_weight, eps, post_norm, residual, recipe=recipe)
        if out is None:
            out = fallback(x, w_q, w_scale, norm_weight, eps, post_norm, residual)
        return out

    linear.__name__ = linear.__qualname__ = name
    return linear


# salon.kernels.linear_two_terms's ops, two int8 terms, one int16 term and group32's one int8 term per 32 channels.
linear_two_terms_cpu = _with_fallback("two_terms", composed, "linear_two_terms_cpu")
linear_int16_cpu = _with_fallback("int16", composed_int16, "linear_int16_cpu")
linear_group32_cpu = _with_fallback("group32", composed_group32, "linear_group32_cpu")


composed_rescored = compose_rescored(
    linear_group32_cpu,
    linear_two_terms_cpu,
    quantize_group32_cpu,
    quantize_two_terms_cpu,
    "linear_rescored_composed_cpu",
)


def linear_rescored_c(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bounds: torch.Tensor,
    argmax: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """salon.kernels.linear_rescored's op as one C call (VNNI, grouped weights, up to SUM2_MAX_ROWS rows), or None
    where it does not take these arguments (the caller composes). argmax (int64[M], contiguous): filled with each
    row's argmax of the output (its first index on ties), from the rescored rows (-1 where the kernel leaves it to
    the caller: a NaN, or a bound that did not hold)."""
    if not _grouped_operands(x, w_q, w_scale, SUM2_MAX_ROWS):
        return None
    m, k = x.shape
    n = w_q.shape[0]
    if (
        k // GROUP > RESCORE_MAX_GROUPS
        or bounds.dtype != torch.float32
        or tuple(bounds.shape) != (2, n)
        or not bounds.is_contiguous()
        or bounds.device.type != "cpu"
        or chosen_isa() != "vnni"
        or (argmax is not None and (argmax.dtype != torch.int64 or argmax.shape != (m,) or not argmax.is_contiguous()))
    ):
        return None
    lib = library("vnni")
    if lib is None:
        return None
    w_ptr, s_ptr = weight_pointers(w_q, w_scale, "vnni")
    out = torch.empty((m, n), dtype=torch.float32)
    if lib.linear_rescored_vnni(
        x.data_ptr(),
        m,
        k,
        x.stride(0),
        w_ptr,
        s_ptr,
        bounds.data_ptr(),
        n,
        out.data_ptr(),
        None if argmax is None else argmax.data_ptr(),
        SCALE_FLOOR,
        torch.get_num_threads(),
    ):
        return None
    return out


def linear_rescored_cpu(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bounds: torch.Tensor,
    argmax: torch.Tensor | None = None,
) -> torch.Tensor:
    """salon.kernels.linear_rescored's op: the C call where it runs (SUM2_MAX_ROWS rows a call: a row's result does not
    depend on the rows beside it), else the CPU family's composition (same bits). argmax as the op's contract has it:
    the C call's where it gave one, else the output's."""
    if x.dim() == 2:
        spans = [slice(i, i + SUM2_MAX_ROWS) for i in range(0, x.shape[0], SUM2_MAX_ROWS)]
        chunks = [
            linear_rescored_c(x[span], w_q, w_scale, bounds, None if argmax is None else argmax[span]) for span in spans
        ]
        if chunks and all(c is not None for c in chunks):
            out = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
            if argmax is not None:
                missing = (argmax < 0).nonzero().flatten()
                if missing.numel():
                    argmax[missing] = out[missing].argmax(dim=-1)
            return out
    return composed_rescored(x, w_q, w_scale, bounds, argmax)
