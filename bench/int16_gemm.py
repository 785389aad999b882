"""The int16-activation probe (bench/int16_gemm.c): one int16 term per activation against the engine's int8
weights and per-32-channel scales, a recipe the engine does not run yet. Its reference here states the
contract; tests/bench/test_bench_int16_gemm.py holds the probe to it bit for bit, and bench.gemv --int16 times
it against the engine's two-term GEMM on the same weights."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from bench.alternate import best_seconds
from kernels.cpu import native
from kernels.cpu.w8a8_gemm import w8a8_gemm_cpu
from kernels.w8a8_grouped import GROUP

_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {"w16a8_grouped_probe": ([_P, _I, _P, _P, _P, _I, _P, _I, _I, _I, ctypes.c_int], ctypes.c_int)}


def _library():
    return native.load(Path(__file__).with_name("int16_gemm.c"), _SIGNATURES)


def probe_available() -> bool:
    return _library() is not None


def w16a8_grouped_probe(a: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                        threads: int | None = None) -> torch.Tensor:
    """a int16[M, K] (rows may be strided), a_scale f32[M], w_q int8[N, K], w_scale f32[N, K/32] -> f32[M, N]."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the probe needs x86-64 with AVX2 and a C compiler")
    m, k = a.shape
    n = w_q.shape[0]
    if (a.dtype != torch.int16 or a.stride(1) != 1 or w_q.dtype != torch.int8 or not w_q.is_contiguous()
            or tuple(w_q.shape) != (n, k) or w_scale.dtype != torch.float32 or not w_scale.is_contiguous()
            or tuple(w_scale.shape) != (n, k // GROUP) or a_scale.dtype != torch.float32
            or tuple(a_scale.shape) != (m,) or not a_scale.is_contiguous()):
        raise ValueError("w16a8_grouped_probe: int16[M, K] rows, f32[M], int8[N, K], f32[N, K/32]")
    out = torch.empty(m, n, dtype=torch.float32)
    if lib.w16a8_grouped_probe(a.data_ptr(), a.stride(0), w_q.data_ptr(), w_scale.data_ptr(), out.data_ptr(), n,
                               a_scale.data_ptr(), m, n, k, threads or torch.get_num_threads()):
        raise ValueError(f"w16a8_grouped_probe declined M={m}, K={k}")
    return out


def w16a8_grouped_ref(a: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor
                      ) -> torch.Tensor:
    """The contract: each group's exact integer sum (float64 holds it exactly: |sum| < 2^28) rounded to float32,
    times the group's weight scales, added in group order (each product and sum rounded), then a_scale."""
    m, k = a.shape
    y = torch.zeros(m, w_q.shape[0], dtype=torch.float32)
    for g in range(k // GROUP):
        cols = slice(g * GROUP, (g + 1) * GROUP)
        acc = (a[:, cols].to(torch.float64) @ w_q[:, cols].to(torch.float64).T).to(torch.float32)
        y = y + acc * w_scale[:, g]
    return y * a_scale[:, None]


def int16_section(layer, repeats: int, gen: torch.Generator, result: dict, threads: int) -> None:
    """bench.gemv --int16: the probe on T int16 rows against the engine's GEMM (kernels.cpu.w8a8_gemm, the
    entry point the engine calls) on the 2T int8 rows of two terms, the same weights with group scales, for a
    layer's gate_up and down projections at T = 4, 16, 64 and 256 tokens, timed in alternation (best of each;
    no epilogue on either)."""
    if not probe_available():
        print("int16 probe: not built here (needs x86-64 with AVX2 and cc)")
        return
    print("int16 probe (bench/int16_gemm.c, not the engine's recipe): T tokens as T int16 rows against the engine's "
          "GEMM on their 2T int8 rows (two terms)")
    for label, (w, _, _) in (("gate_up", layer[2]), ("down", layer[3])):
        n, k = w.shape
        w_scale = torch.rand(n, k // GROUP, generator=gen) / 100 + 1e-4
        for tokens in (4, 16, 64, 256):
            a8 = torch.randint(-127, 128, (2 * tokens, k), dtype=torch.int8, generator=gen)
            s8 = torch.rand(2 * tokens, generator=gen) + 1e-3
            a16 = torch.randint(-32767, 32768, (tokens, k), dtype=torch.int16, generator=gen)
            s16 = torch.rand(tokens, generator=gen) + 1e-3
            best = best_seconds({"two_terms": lambda: w8a8_gemm_cpu(a8, s8, w, w_scale),
                                 "int16": lambda: w16a8_grouped_probe(a16, s16, w, w_scale, threads)}, repeats)
            key = f"int16_probe_t{tokens}_{label}"
            result[f"{key}_two_terms_ms"] = round(best["two_terms"] * 1e3, 3)
            result[f"{key}_int16_ms"] = round(best["int16"] * 1e3, 3)
            result[f"{key}_speedup_x"] = round(best["two_terms"] / best["int16"], 3)
            print(f"T={tokens:3d} {label:8s} {n}x{k}: two terms {best['two_terms'] * 1e3:8.3f} ms  int16 "
                  f"{best['int16'] * 1e3:8.3f} ms  {best['two_terms'] / best['int16']:5.2f}x")
