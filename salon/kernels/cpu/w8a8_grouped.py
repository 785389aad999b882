"""Group-scaled W8A8 GEMMs (w_scale f32[N, K/32], salon.kernels.w8a8_grouped) on x86 CPUs: w8a8_grouped_vnni.c on
AVX-512 VNNI, w8a8_grouped.c on AVX2.

Returns the grouped dequantization before the epilogue, bit for bit the value of
salon.kernels.w8a8_grouped.w8a8_grouped_scaled_ref: per output element the exact int32 sum of each group of 32
channels, times that group's scale, added group after group in order (no fused multiply-add), then times
a_scale[m]. Every element sees the same operations whatever M, the blocking or the thread split, so a row's
result never depends on the batch it sits in. The kernel reads w_scale in its own [N, G] layout (a block of
8 rows' scales is one contiguous run, transposed in registers), so the caller keeps no transposed copy; at
decode sizes it streams every weight and scale byte once per call, each thread its own range of weight
rows, and at prefill sizes each 8-row x 32-channel tile of weights meets up to 64 activation rows while it
is unpacked in registers. The activations are read where they lie (no copy), so a call costs one output
tensor and one C call. The VNNI kernel does the same in blocks of 16 rows, one vpdpbusd per 64 byte products
(the AVX2 kernel needs four instructions per 32), and takes every int8 activation; the AVX2 one declines
activations holding -128.

Packed weights (VNNI). The VNNI kernel also reads a weight matrix in its own packed layout
(w8a8_grouped_vnni_pack): each 16-row block's groups one after another, every group already in the
registers' order (its 8 vectors of 16 rows x 4 channels, XORed with 0x80) and its 16 scales right after it --
float32, or float16 after each pair of groups where every scale of the matrix is a float16 exactly (Gemma's
token table, whose GGUF scales are float16: 10.5 MB less a step). A thread then reads one sequential stream
instead of 16 rows 32 bytes at a time, and does no transposes: at decode sizes, where the call is bound by
reading the weights, it runs faster (measured by `python -m bench.gemv --grouped` and bench.model's packed_*
figures). The bits are
the same (the same operations in the same order). `packed_weights(w_q, w_scale)` makes that copy
once per weight tensor (in huge pages) and keeps it while w_q lives; the VNNI calls of this module,
salon.kernels.cpu.linear_two_terms and salon.kernels.cpu.decoder_block take it by default. A weight changed in place is
packed again on its next call here (its tensors' version counters tell); a decoder block's structs take
their weights as constant.

AMX (Sapphire Rapids and later). Where the CPU has AMX-INT8 and the kernel grants this process the tile state, a
VNNI call on packed weights of more than amx_min_rows() activation rows takes its groups' int32 sums from AMX tiles
(16 activation rows against a packed group, which is already a tile's layout) and keeps only the float epilogue on
the vector unit: the same bits. use_amx switches it (SALON_CPU_AMX=0 keeps a process off it); bench.amx measures it.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.huge_pages import huge_page_arena
from salon.kernels.w8a8_grouped import GROUP, check_grouped

# The grouped GEMMs' one signature (a, lda, w, w_scale, out, ldo, a_scale, M, N, K, nthreads) -> int.
GEMM_ARGS = (
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
# isa -> (source, its one entry point)
_KERNELS = {
    "vnni": (Path(__file__).with_name("w8a8_grouped_vnni.c"), "w8a8_grouped_vnni"),
    "avx2": (Path(__file__).with_name("w8a8_grouped.c"), "w8a8_grouped_avx2"),
}
# isa -> the entry point of the group32 recipe's GEMM in the same source (salon.kernels.cpu.w8a8_group32)
GROUP32_ENTRIES = {"vnni": "w8a8_group32_vnni", "avx2": "w8a8_group32_avx2"}
_SIGNATURES = {isa: {name: GEMM_ARGS, GROUP32_ENTRIES[isa]: GEMM_ARGS} for isa, (_, name) in _KERNELS.items()}
_SIGNATURES["vnni"]["w8a8_grouped_vnni_pack"] = (
    [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int],
    ctypes.c_int,
)
_SIGNATURES["vnni"]["w8a8_grouped_vnni_packed_bytes"] = ([ctypes.c_int64] * 3, ctypes.c_int64)
_SIGNATURES["vnni"]["w8a8_grouped_vnni_amx"] = ([ctypes.c_int], ctypes.c_int)
_SIGNATURES["vnni"]["w8a8_grouped_vnni_amx_rows"] = ([ctypes.c_int64], ctypes.c_int64)
_SIGNATURES["vnni"]["w8a8_grouped_vnni_amx_calls"] = ([], ctypes.c_int64)
# "0" keeps the VNNI kernel off AMX (read by each library that holds the kernel, at its first call)
AMX_ENV = "SALON_CPU_AMX"


def library(isa: str | None = None) -> ctypes.CDLL | None:
    """The library of the kernel for `isa` ("vnni", "avx2"; by default the best this CPU runs), or None where
    this CPU does not run it or there is no C compiler."""
    isa = chosen_isa(isa)
    return native.load(_KERNELS[isa][0], _SIGNATURES[isa]) if isa else None


def chosen_isa(isa: str | None = None) -> str | None:
    """`isa`, or the best this CPU runs; None where this CPU does not run it."""
    isas = native.cpu_isas()
    isa = isa or next(iter(isas), None)
    return isa if isa in isas else None


# id(w_q) -> (weakref to w_q, w_scale, their versions, the packed copy); an entry goes when its w_q does
_packed: dict[int, tuple] = {}
_packed_lock = threading.Lock()
# id(w_q) -> weakref to w_q: weights never packed (keep_rows), the baseline of bench.model's packed figures
_rows: dict[int, weakref.ref] = {}


def keep_rows(w_q: torch.Tensor) -> None:
    """Have the VNNI calls read w_q as it lies, never a packed copy (a baseline to time the packed layout
    against, on another copy of the same weights); it holds while w_q lives."""
    key = id(w_q)
    with _packed_lock:
        if key not in _rows:
            weakref.finalize(w_q, _rows.pop, key, None)
        _rows[key] = weakref.ref(w_q)


def packed_weights(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor | None:
    """The VNNI kernel's packed copy of int8 w_q[N, K] with f32 w_scale[N, K/32] (both contiguous, on the CPU):
    uint8, made on the first call for this w_q and w_scale (or after either changed in place) and kept while w_q
    lives; None where the VNNI kernel does not run here, the shapes are not grouped ones, or keep_rows holds w_q."""
    key = id(w_q)
    hit = _packed.get(key)
    if (
        hit is not None
        and hit[0]() is w_q
        and hit[1] is w_scale
        and hit[2] == w_q._version
        and hit[3] == w_scale._version
    ):
        return hit[4]
    rows = _rows.get(key)
    lib = None if rows is not None and rows() is w_q else library("vnni")
    if (
        lib is None
        or w_q.dtype != torch.int8
        or w_scale.dtype != torch.float32
        or w_q.dim() != 2
        or w_q.shape[1] % GROUP
        or w_q.shape[0] < 1
        or w_q.shape[1] < GROUP
        or tuple(w_scale.shape) != (w_q.shape[0], w_q.shape[1] // GROUP)
        or not w_q.is_contiguous()
        or not w_scale.is_contiguous()
        or w_q.device.type != "cpu"
        or w_scale.device.type != "cpu"
    ):
        return None
    n, k = w_q.shape
    scale_bytes = 2 if torch.equal(w_scale.to(torch.float16).to(torch.float32), w_scale) else 4
    nbytes = lib.w8a8_grouped_vnni_packed_bytes(n, k, scale_bytes)
    packed = huge_page_arena(nbytes)
    if packed is None:
        packed = torch.empty(nbytes, dtype=torch.uint8)
    if lib.w8a8_grouped_vnni_pack(
        w_q.data_ptr(), w_scale.data_ptr(), n, k, scale_bytes, packed.data_ptr(), torch.get_num_threads()
    ):
        return None
    with _packed_lock:
        if hit is None or hit[0]() is not w_q:
            weakref.finalize(w_q, _packed.pop, key, None)
        _packed[key] = (weakref.ref(w_q), w_scale, w_q._version, w_scale._version, packed)
    return packed


def use_amx(on: bool | None = None) -> bool:
    """Whether the VNNI kernel takes its int32 sums from AMX tiles for calls on packed weights of more than
    amx_min_rows() activation rows (prefill sizes; the same bits: see w8a8_grouped_vnni.c), where the CPU has
    AMX-INT8 and the kernel grants this process the tile state. on True or False sets it for every library loaded
    so far that holds the kernel (the decoder block's and the fused Linears' too) and, through SALON_CPU_AMX, for
    those loaded later and for child processes; None only asks. False where the VNNI kernel does not run here."""
    lib = library("vnni")
    if lib is None:
        return False
    if on is not None:
        os.environ[AMX_ENV] = "1" if on else "0"
        for loaded in _kernel_libraries():
            loaded.w8a8_grouped_vnni_amx(1 if on else 0)
    return bool(lib.w8a8_grouped_vnni_amx(-1))


def amx_min_rows(rows: int | None = None) -> int:
    """The activation rows a call must exceed to run on AMX where it is on (63: at decode sizes the tiles' loads and
    stores cost more than they save, and steps of a few dozen rows do not get shorter; bench.amx); rows sets it in
    every library loaded so far that holds the kernel (for bench.amx and the tests), None only asks. The threshold
    before the call."""
    lib = library("vnni")
    if lib is None:
        return 0
    before = lib.w8a8_grouped_vnni_amx_rows(-1)
    if rows is not None:
        for loaded in _kernel_libraries():
            loaded.w8a8_grouped_vnni_amx_rows(rows)
    return before


def amx_calls() -> int:
    """The GEMM calls that have run on AMX in this process so far, over every library loaded that holds the kernel."""
    return sum(lib.w8a8_grouped_vnni_amx_calls() for lib in _kernel_libraries())


def _kernel_libraries() -> list[ctypes.CDLL]:
    """The libraries loaded so far that hold the VNNI kernel, its AMX switches typed."""
    found = []
    for loaded in native.loaded_libraries():
        if getattr(loaded, "w8a8_grouped_vnni_amx", None) is None:
            continue
        for name in ("w8a8_grouped_vnni_amx", "w8a8_grouped_vnni_amx_rows", "w8a8_grouped_vnni_amx_calls"):
            argtypes, restype = _SIGNATURES["vnni"][name]
            fn = getattr(loaded, name)
            fn.argtypes, fn.restype = argtypes, restype
        found.append(loaded)
    return found


def packed_bytes() -> int:
    """The bytes of every packed copy alive in this process."""
    return sum(entry[4].numel() for entry in list(_packed.values()))


def w8a8_grouped_scaled_cpu(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    isa: str | None = None,
    packed: bool = True,
) -> torch.Tensor | None:
    """f32[M, N], the bits of w8a8_grouped_scaled_ref(a_q, a_scale, w_q, w_scale), for int8 a_q[M, K]
    (contiguous columns), int8 w_q[N, K] (contiguous), float32 w_scale[N, K/32] (contiguous) and a_scale[M],
    through the kernel for `isa` (by default the best this CPU runs); ValueError where check_grouped refuses
    the shapes (K not a multiple of 32 among them); None where the kernel does not take the call (not on this
    CPU or no C compiler, not on the CPU, other dtypes or strides, M = 0, or for AVX2 an activation of -128),
    and the caller takes the reference. packed: the VNNI kernel reads packed_weights' copy (False: the weights
    as they lie; the same bits)."""
    if a_q.dtype != torch.int8 or w_q.dtype != torch.int8:
        return None
    check_grouped(a_q, w_q, w_scale)
    m = a_q.shape[0]
    if (
        m == 0
        or a_q.device.type != "cpu"
        or w_q.device.type != "cpu"
        or w_scale.device.type != "cpu"
        or a_scale.device.type != "cpu"
        or a_q.stride(1) != 1
        or not w_q.is_contiguous()
        or not w_scale.is_contiguous()
        or tuple(a_scale.shape) != (m,)
        or not a_scale.is_floating_point()
    ):
        return None
    isa = chosen_isa(isa)
    lib = library(isa)
    if lib is None:
        return None
    a_scale = a_scale.to(torch.float32).contiguous()  # the reference's conversion
    return call_gemm(getattr(lib, _KERNELS[isa][1]), a_q, a_scale, w_q, w_scale, isa if packed else None)


def call_gemm(
    kernel, a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, packed_isa: str | None
) -> torch.Tensor | None:
    """One call of a grouped GEMM's entry point (grouped or group32: the same arguments) on checked operands, the
    weights packed for `packed_isa` where it names one (weight_pointers); f32[M, N], or None where it declines."""
    out = torch.empty((a_q.shape[0], w_q.shape[0]), dtype=torch.float32)
    return None if kernel(*gemm_args(a_q, a_scale, w_q, w_scale, packed_isa, out)) else out


def gemm_args(
    a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, packed_isa: str | None, out
) -> tuple:
    """The arguments of a grouped GEMM's entry point (call_gemm's) writing f32[M, N] `out`, on all the threads."""
    (m, k), n = a_q.shape, w_q.shape[0]
    w_ptr, s_ptr = weight_pointers(w_q, w_scale, packed_isa)
    return (
        a_q.data_ptr(),
        a_q.stride(0),
        w_ptr,
        s_ptr,
        out.data_ptr(),
        n,
        a_scale.data_ptr(),
        m,
        n,
        k,
        torch.get_num_threads(),
    )


def weight_pointers(w_q: torch.Tensor, w_scale: torch.Tensor, isa: str | None) -> tuple[int, int | None]:
    """The weight and scale arguments of a grouped GEMM call in `isa`'s build: the packed copy and NULL (its
    scales inside) for "vnni" where packed_weights makes one, else the tensors as they lie."""
    packed = packed_weights(w_q, w_scale) if isa == "vnni" else None
    return (w_q.data_ptr(), w_scale.data_ptr()) if packed is None else (packed.data_ptr(), None)
