"""bench.gemv --int16: the int16-activation GEMM (salon/kernels/cpu/w16a8_grouped.c: one int16 term per activation)
against the engine's two-term GEMM on the same weights and group scales, timed in alternation."""

from __future__ import annotations

import torch

from bench.alternate import best_seconds
from salon.kernels.cpu.w8a8_gemm import w8a8_gemm_cpu
from salon.kernels.cpu.w16a8_grouped import library, w16a8_grouped_cpu
from salon.kernels.w8a8_grouped import GROUP

TOKENS = (1, 4, 16, 64, 256)


def int16_section(
    layer, repeats: int, gen: torch.Generator, result: dict, threads: int, tokens: tuple[int, ...] = TOKENS
) -> None:
    """T tokens as T int16 rows (salon.kernels.cpu.w16a8_grouped) against the engine's GEMM
    (salon.kernels.cpu.w8a8_gemm, the
    entry point the engine calls for two terms) on their 2T int8 rows, the same weights with group scales, for a
    layer's gate_up and down projections (layer[2], layer[3]) at each T, timed in alternation (best of each; no
    epilogue on either). Keys int16_t{T}_{gate_up,down}_{two_terms_ms,int16_ms,speedup_x}."""
    if library() is None:
        print("int16 GEMM: not built here (needs x86-64 with AVX2 and cc)")
        return
    print(
        "int16 GEMM (salon/kernels/cpu/w16a8_grouped.c): T tokens as T int16 rows against the engine's GEMM on their "
        "2T int8 rows (two terms)"
    )
    for label, (w, _, _) in (("gate_up", layer[2]), ("down", layer[3])):
        n, k = w.shape
        w_scale = torch.rand(n, k // GROUP, generator=gen) / 100 + 1e-4
        for t in tokens:
            a8 = torch.randint(-127, 128, (2 * t, k), dtype=torch.int8, generator=gen)
            s8 = torch.rand(2 * t, generator=gen) + 1e-3
            a16 = torch.randint(-32767, 32768, (t, k), dtype=torch.int16, generator=gen)
            s16 = torch.rand(t, generator=gen) + 1e-3
            best = best_seconds(
                {
                    "two_terms": lambda: w8a8_gemm_cpu(a8, s8, w, w_scale),
                    "int16": lambda: w16a8_grouped_cpu(a16, s16, w, w_scale, threads),
                },
                repeats,
            )
            key = f"int16_t{t}_{label}"
            result[f"{key}_two_terms_ms"] = round(best["two_terms"] * 1e3, 3)
            result[f"{key}_int16_ms"] = round(best["int16"] * 1e3, 3)
            result[f"{key}_speedup_x"] = round(best["two_terms"] / best["int16"], 3)
            print(
                f"T={t:3d} {label:8s} {n}x{k}: two terms {best['two_terms'] * 1e3:8.3f} ms  int16 "
                f"{best['int16'] * 1e3:8.3f} ms  {best['two_terms'] / best['int16']:5.2f}x"
            )
