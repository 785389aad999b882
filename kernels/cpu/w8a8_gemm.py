"""CPU fast path of the W8A8 GEMM; same signature and bit-identical results as kernels.w8a8_gemm.w8a8_gemm_ref.

Exact ways to get the int32 accumulator acc = a_q @ w_q^T, best first:

- The AVX-512 VNNI kernel of w8a8_acc.c, at any M, VNNI_ROW_BLOCK rows at a time: 64 byte products per
  instruction, the weights read once per call (decode is bound by reading them at small batches, by
  the multiplies at large ones). Measured here (2 cores) against the AVX2 kernel: the 262,144 x 640 output
  projection at 32 rows 9.9 ms vs 37 ms, at 1 row 2.7 ms vs 2.7 ms; a 256 x 4096 x 640 prefill GEMM 1.8 ms
  vs 8.7 ms for the float path.
- Without VNNI, the AVX2 kernel for M < SMALL_M_ROWS (decode, small batches) or for any M on a weight of
  LARGE_WEIGHT_ELEMENTS or more (the output projection, which the float path would widen to 670 MB every
  call), C_ROW_BLOCK rows at a time.
- Otherwise, or without a C compiler: float32 GEMMs (MKL) on int8-valued operands. A float32 dot is exact
  while every partial sum stays below 2^24, which holds for K chunks of at most 1024 (1024*127*127 < 2^24);
  chunk results are added in float64 (exact), so the f32 value of the sum equals float32(int32 acc)
  exactly. Weights are widened to float32 a block of rows at a time, so no float copy of the weights is kept.

The C kernels are compiled with the system C compiler on first use and loaded with ctypes. Each output
element depends only on its own row and column, so results never depend on M, the row blocking or the
thread split.

Epilogue, in the reference's order: y = float(acc) * a_scale[m] * w_scale[n]; + bias; geglu; + residual.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from kernels.w8a8_gemm import EXACT_F32_CHUNK_K, w8a8_epilogue

# The AVX2 kernel beats the float path below this many rows (or for weights of LARGE_WEIGHT_ELEMENTS or
# more, which the float path would widen to float32 every call), in C_ROW_BLOCK rows at a time.
SMALL_M_ROWS = 64
LARGE_WEIGHT_ELEMENTS = 1 << 24
C_ROW_BLOCK = 32
# The VNNI kernel beats the float path at every M; rows go through it VNNI_ROW_BLOCK at a time so that the
# uint8 activations of one call (VNNI_ROW_BLOCK x K bytes) stay in the L2 cache.
VNNI_ROW_BLOCK = 256
# Rows of w widened to float32 per block in the float path (bounds the temporary to ~40 MB at K=640).
_W_BLOCK_ROWS = 16384

_C_SOURCE = Path(__file__).with_name("w8a8_acc.c")
_lib_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_failed = False


@functools.cache
def cpu_isas() -> tuple[str, ...]:
    """The C kernels this CPU can run, best first: "vnni" (AVX-512 VNNI), "avx2"; () when neither."""
    try:
        flags = set(next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")),
                         "").split())
    except OSError:
        return ()
    isas = []
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        isas.append("vnni")
    if "avx2" in flags:
        isas.append("avx2")
    return tuple(isas) if "avx2" in isas else ()


def _load_library(build_dir: Path | None = None) -> ctypes.CDLL | None:
    """Compiles (once per source version) and loads the C kernels; None where that is not possible."""
    global _lib, _lib_failed
    with _lib_lock:
        if _lib is not None or _lib_failed:
            return _lib
        try:
            if not cpu_isas():
                raise OSError("no AVX2")
            source = _C_SOURCE.read_text()
            digest = hashlib.sha256(source.encode()).hexdigest()[:16]
            out_dir = build_dir or Path(tempfile.gettempdir()) / "salon-kernels"
            out_dir.mkdir(parents=True, exist_ok=True)
            so_path = out_dir / f"w8a8_acc_{digest}.so"
            if not so_path.exists():
                src = out_dir / f"w8a8_acc_{digest}.c"
                src.write_text(source)
                tmp = out_dir / f"w8a8_acc_{digest}.{threading.get_ident()}.so"
                subprocess.run(["cc", "-O3", "-mavx2", "-fopenmp", "-shared", "-fPIC", "-o", str(tmp), str(src)],
                               check=True, capture_output=True, timeout=120)
                tmp.replace(so_path)  # atomic: concurrent builders never load a half-written file
            lib = ctypes.CDLL(str(so_path))
            lib.w8a8_acc_avx2.restype = None
            lib.w8a8_acc_avx2.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [ctypes.c_int]
            lib.w8a8_acc_vnni.restype = None
            lib.w8a8_acc_vnni.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 5 + [ctypes.c_int]
            _lib = lib
        except (OSError, subprocess.SubprocessError):
            _lib_failed = True
        return _lib


def int8_acc_c(a_q: torch.Tensor, w_q: torch.Tensor, isa: str | None = None) -> torch.Tensor | None:
    """Exact int32 a_q @ w_q^T through one call of a C kernel (the best one, or `isa`), or None when
    it is unavailable."""
    lib = _load_library()
    isas = cpu_isas()
    isa = isa or (isas[0] if isas else None)
    if lib is None or isa not in isas:
        return None
    m, k = a_q.shape
    n = w_q.shape[0]
    w = w_q.contiguous()
    out = torch.empty((m, n), dtype=torch.int32)
    threads = torch.get_num_threads()
    if isa == "vnni":
        kp, mp = (k + 63) // 64 * 64, (m + 3) // 4 * 4
        a_u8 = torch.full((mp, kp), 128, dtype=torch.uint8)
        torch.bitwise_xor(a_q.view(torch.uint8), 0x80, out=a_u8[:m, :k])  # int8 x -> uint8 x + 128
        lib.w8a8_acc_vnni(a_u8.data_ptr(), w.data_ptr(), out.data_ptr(), m, mp, n, k, kp, threads)
    else:
        kp = (k + 31) // 32 * 32
        a16 = torch.zeros((m, kp), dtype=torch.int16)
        a16[:, :k] = a_q
        lib.w8a8_acc_avx2(a16.data_ptr(), w.data_ptr(), out.data_ptr(), m, n, k, kp, threads)
    return out


def int8_acc_c_blocked(a_q: torch.Tensor, w_q: torch.Tensor, isa: str | None = None) -> torch.Tensor | None:
    """int8_acc_c over blocks of rows (exact, so the blocking never changes a result); None when no C
    kernel runs here."""
    isas = cpu_isas()
    isa = isa or (isas[0] if isas else None)
    rows = VNNI_ROW_BLOCK if isa == "vnni" else C_ROW_BLOCK
    parts = []
    for m0 in range(0, a_q.shape[0], rows):
        part = int8_acc_c(a_q[m0:m0 + rows], w_q, isa)
        if part is None:
            return None
        parts.append(part)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def int8_acc_f32(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """float32[M, N] holding exactly float32(int32 a_q @ w_q^T), via float32 GEMMs on K chunks <= 1024."""
    m, k = a_q.shape
    n = w_q.shape[0]
    a = a_q.to(torch.float32)
    out = torch.empty((m, n), dtype=torch.float32)
    for n0 in range(0, n, _W_BLOCK_ROWS):
        wb = w_q[n0:n0 + _W_BLOCK_ROWS].to(torch.float32)
        if k <= EXACT_F32_CHUNK_K:
            torch.matmul(a, wb.T, out=out[:, n0:n0 + wb.shape[0]])
            continue
        acc = torch.zeros((m, wb.shape[0]), dtype=torch.float64)
        for k0 in range(0, k, EXACT_F32_CHUNK_K):
            acc += (a[:, k0:k0 + EXACT_F32_CHUNK_K] @ wb[:, k0:k0 + EXACT_F32_CHUNK_K].T).to(torch.float64)
        out[:, n0:n0 + wb.shape[0]] = acc
    return out


def w8a8_gemm_cpu(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    geglu: bool = False,
) -> torch.Tensor:
    """-> f32[M, N], or f32[M, N/2] with geglu. Bit-identical to w8a8_gemm_ref."""
    if a_q.dtype != torch.int8 or w_q.dtype != torch.int8:
        raise ValueError("a_q and w_q must be int8")
    if a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"shape mismatch: a_q {tuple(a_q.shape)} w_q {tuple(w_q.shape)}")
    isas = cpu_isas()
    use_c = "vnni" in isas or a_q.shape[0] < SMALL_M_ROWS or w_q.numel() >= LARGE_WEIGHT_ELEMENTS
    acc = int8_acc_c_blocked(a_q, w_q) if use_c else None
    y = acc.to(torch.float32) if acc is not None else int8_acc_f32(a_q, w_q)
    return w8a8_epilogue(y, a_scale, w_scale, bias, residual, geglu)
