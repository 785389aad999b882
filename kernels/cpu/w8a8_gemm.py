"""CPU fast path of the W8A8 GEMM; same signature and bit-identical results as kernels.w8a8_gemm.w8a8_gemm_ref.

Two exact ways to get the int32 accumulator acc = a_q @ w_q^T, chosen by the number of rows M:

- M < SMALL_M_ROWS (decode, small batches), or any M for a weight of LARGE_WEIGHT_ELEMENTS or more (the
  262,144 x 640 output projection, which the float path would widen to 670 MB every call): a small C kernel (AVX2, compiled with the system C compiler on first
  use, loaded with ctypes) reads the int8 weights directly -- batch-1 decode is bound by reading
  the weights, so reading 1 byte per weight instead of 4 is the point. Activations are widened to
  int16 once; ``_mm256_madd_epi16`` multiplies int16 pairs into int32 sums (|a*w| <= 127*127, no
  saturation) accumulated in int32. Each output element depends only on its own row and column,
  so results never depend on M or the thread split; rows go through it C_ROW_BLOCK at a time (measured
  here on the output projection: 32 rows 57 ms, 48 rows at once 119 ms, 64 rows by the float path 431 ms).
- otherwise (prefill) or without a C compiler: float32 GEMMs (MKL) on int8-valued operands. A
  float32 dot is exact while every partial sum stays below 2^24, which holds for K chunks of at
  most 1024 (1024*127*127 < 2^24); chunk results are added in float64 (exact), so the f32 value of
  the sum equals float32(int32 acc) exactly. Weights are widened to float32 a block of rows at a
  time, so no float copy of the weights is kept.

Epilogue, in the reference's order: y = float(acc) * a_scale[m] * w_scale[n]; + bias; geglu; + residual.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from kernels.w8a8_gemm import EXACT_F32_CHUNK_K, w8a8_epilogue

SMALL_M_ROWS = 64
LARGE_WEIGHT_ELEMENTS = 1 << 24
C_ROW_BLOCK = 32
# Rows of w widened to float32 per block in the float path (bounds the temporary to ~40 MB at K=640).
_W_BLOCK_ROWS = 16384

_C_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>

/* out[m*N + n] = sum_k a[m*Kp + k] * w[n*K + k]; a is int16 with rows padded (zeros) to Kp >= K,
   Kp a multiple of 32. Rows of w are visited in parallel; four activation rows share each load of w. */
static inline int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static inline __m256i load_w16(const int8_t *wr, int64_t k, int64_t K) {
    if (k + 16 <= K) return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k)));
    int8_t tmp[16] = {0};
    for (int64_t i = 0; k + i < K && i < 16; i++) tmp[i] = wr[k + i];
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)tmp));
}

void w8a8_acc_i32(const int16_t *a, const int8_t *w, int32_t *out, int64_t M, int64_t N, int64_t K,
                  int64_t Kp, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *wr = w + n * K;
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) {
            __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
            const int16_t *a0 = a + m * Kp, *a1 = a0 + Kp, *a2 = a1 + Kp, *a3 = a2 + Kp;
            for (int64_t k = 0; k < K; k += 16) {
                __m256i wv = load_w16(wr, k, K);
                c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(a0 + k))));
                c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(a1 + k))));
                c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(a2 + k))));
                c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(a3 + k))));
            }
            out[m * N + n] = hsum(c0); out[(m + 1) * N + n] = hsum(c1);
            out[(m + 2) * N + n] = hsum(c2); out[(m + 3) * N + n] = hsum(c3);
        }
        for (; m < M; m++) {
            __m256i c0 = _mm256_setzero_si256(), c1 = c0;
            const int16_t *a0 = a + m * Kp;
            int64_t k = 0;
            for (; k + 32 <= K; k += 32) {
                __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k)));
                __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k + 16)));
                c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)(a0 + k))));
                c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(a0 + k + 16))));
            }
            for (; k < K; k += 16)
                c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(load_w16(wr, k, K), _mm256_loadu_si256((const __m256i *)(a0 + k))));
            out[m * N + n] = hsum(_mm256_add_epi32(c0, c1));
        }
    }
}
"""

_lib_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_failed = False


def _cpu_has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _load_library(build_dir: Path | None = None) -> ctypes.CDLL | None:
    """Compiles (once per source version) and loads the C kernel; None where that is not possible."""
    global _lib, _lib_failed
    with _lib_lock:
        if _lib is not None or _lib_failed:
            return _lib
        try:
            if not _cpu_has_avx2():
                raise OSError("no AVX2")
            digest = hashlib.sha256(_C_SOURCE.encode()).hexdigest()[:16]
            out_dir = build_dir or Path(tempfile.gettempdir()) / "salon-kernels"
            out_dir.mkdir(parents=True, exist_ok=True)
            so_path = out_dir / f"w8a8_acc_{digest}.so"
            if not so_path.exists():
                src = out_dir / f"w8a8_acc_{digest}.c"
                src.write_text(_C_SOURCE)
                tmp = out_dir / f"w8a8_acc_{digest}.{threading.get_ident()}.so"
                subprocess.run(["cc", "-O3", "-mavx2", "-fopenmp", "-shared", "-fPIC", "-o", str(tmp), str(src)],
                               check=True, capture_output=True, timeout=120)
                tmp.replace(so_path)  # atomic: concurrent builders never load a half-written file
            lib = ctypes.CDLL(str(so_path))
            lib.w8a8_acc_i32.restype = None
            lib.w8a8_acc_i32.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [ctypes.c_int]
            _lib = lib
        except (OSError, subprocess.SubprocessError):
            _lib_failed = True
        return _lib


def int8_acc_c(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
    """Exact int32 a_q @ w_q^T through the C kernel, or None when it is unavailable."""
    lib = _load_library()
    if lib is None:
        return None
    m, k = a_q.shape
    n = w_q.shape[0]
    kp = (k + 31) // 32 * 32
    a16 = torch.zeros((m, kp), dtype=torch.int16)
    a16[:, :k] = a_q
    w = w_q.contiguous()
    out = torch.empty((m, n), dtype=torch.int32)
    lib.w8a8_acc_i32(a16.data_ptr(), w.data_ptr(), out.data_ptr(), m, n, k, kp, torch.get_num_threads())
    return out


def int8_acc_c_blocked(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
    """int8_acc_c over blocks of C_ROW_BLOCK rows (exact, so the blocking never changes a result)."""
    parts = []
    for m0 in range(0, a_q.shape[0], C_ROW_BLOCK):
        part = int8_acc_c(a_q[m0:m0 + C_ROW_BLOCK], w_q)
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
    use_c = a_q.shape[0] < SMALL_M_ROWS or w_q.numel() >= LARGE_WEIGHT_ELEMENTS
    acc = int8_acc_c_blocked(a_q, w_q) if use_c else None
    y = acc.to(torch.float32) if acc is not None else int8_acc_f32(a_q, w_q)
    return w8a8_epilogue(y, a_scale, w_scale, bias, residual, geglu)
