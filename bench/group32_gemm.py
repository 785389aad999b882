"""The group32 activation recipe (salon.kernels.w8a8_group32: one int8 term per token and 32 channels) against the two
int8 terms it would replace, on the CPU family's kernels, at Gemma 3 270M's projections (qkv 640 -> 1536, o 1024 ->
640, gate_up 640 -> 2 x 2048, down 2048 -> 640; grouped weights with one scale per row and 32 channels) for
decode (M = 1, 8 tokens) and prefill (M = 64, 512).

Two pairs per projection and M, each timed in alternating rounds (A B, then B A, ...):

  * `linear`: the engine's op on float activations, quantization included -- salon.kernels.cpu.linear_two_terms'
    linear_two_terms_cpu against linear_group32_cpu (one C call up to its MAX_ROWS, the composition of the CPU
    family's kernels above);
  * `gemm`: the GEMM alone on activations already quantized -- the two terms' 2M int8 rows through the grouped
    GEMM (salon.kernels.cpu.w8a8_grouped) against group32's M rows through its own entry point
    (salon.kernels.cpu.w8a8_group32): half the int8 products.

A round of a decode M calls each kernel once on each of LAYERS distinct copies of the projection's weights, as a
decode step does (weights read from memory, not a cache that one weight fits in); a prefill M's round calls it on
PREFILL_COPIES copies, the pass repeated to take at least MIN_MEASURE_S (the mean a pass). Each round gives one time
ratio two terms / group32 (above 1: group32 faster); the figure is the median ratio over the rounds with its range
(`group32_{linear,gemm}_m{M}_{proj}_two_terms_over_group32_x`, `..._range`), and the medians of both times.

And the recipe's output projection at Gemma 3 270M's (640 -> 262,144), decode M = 1 and 8: the engine's rescored
op (salon.kernels.linear_rescored: group32 for every row, the candidates' two-term values, each row's argmax)
against the plain group32 op on the same weights (RESCORED_COPIES copies, one a call, so each call reads its weights
from memory), alternated the same way: `rescored_m{M}_lm_head_over_group32_x` (above 1: the selection's cost) with
its range and both medians.

And what the group32 GEMM's instructions allow: the GEMM at M = 1 and 8 on one copy of Gemma's gate_up weights, called
again and again at its C entry point so they stay in the cores' L2 (the best of RESIDENT_CALLS calls: no weight read
from memory, no Python check), in GMAC/s, against the int8 product ceiling (bench/int8_ceiling.c: vpdpbusd alone, every
operand in registers), the two alternated: `group32_resident_m{M}_gate_up_of_ceiling` with its range. Besides its 8
vpdpbusd, a group of 32 channels costs each row 5 more vector instructions (the two chains' sum, the conversion, the
activation scale times the weight scale, the product, the sum; each rounded on its own by the recipe's contract): the
figure says what they leave of the ceiling.

    python -m bench.group32_gemm [--quick] [--threads N]      (also bench.gemv --group32)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable

import torch

from bench.alternate import shortest_seconds
from salon.kernels.cpu.linear_two_terms import library, linear_group32_cpu, linear_rescored_cpu, linear_two_terms_cpu
from salon.kernels.cpu.quantize import quantize_group32_cpu, quantize_two_terms_cpu
from salon.kernels.cpu.w8a8_group32 import w8a8_group32_cpu
from salon.kernels.cpu.w8a8_grouped import GROUP32_ENTRIES, chosen_isa, gemm_args, w8a8_grouped_scaled_cpu
from salon.kernels.cpu.w8a8_grouped import library as gemm_library
from salon.kernels.linear_rescored import row_bounds
from salon.kernels.w8a8_grouped import GROUP
from salon.loadgen.alternation import alternated_pairs

# (name, K, N) of a Gemma 3 270M layer's projections (d_model 640, 4 query heads and 1 KV head of 256, FFN 2048)
PROJECTIONS = (("qkv", 640, 1536), ("o", 1024, 640), ("gate_up", 640, 4096), ("down", 2048, 640))
DECODE_MS = (1, 8)
PREFILL_MS = (64, 512)
LAYERS = 18
PREFILL_COPIES = 2
# A measurement repeats its pass over the copies until it takes about this long (short ones are mostly jitter).
MIN_MEASURE_S = 0.02
# Gemma 3 270M's output projection (K, N) and the copies of its weights a rescored round rotates through (2 x 168 MB:
# more than the last-level cache holds)
LM_HEAD = (640, 262_144)
RESCORED_COPIES = 2
# A projection whose weights stay in the cores' L2 (Gemma 3 270M's gate_up, split over 2 threads) and the calls a
# resident measurement makes (the best call's time)
RESIDENT = ("gate_up", 640, 4096)
RESIDENT_CALLS = 200


def _weights(n: int, k: int, copies: int, gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        (
            torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen),
            torch.rand(n, k // GROUP, generator=gen) / 100 + 1e-4,
        )
        for _ in range(copies)
    ]


def alternated_ratios(
    a: Callable[[], object], b: Callable[[], object], rounds: int, min_seconds: float = MIN_MEASURE_S
) -> tuple[list[float], list[float]]:
    """Wall seconds a call of a() and of b() takes in `rounds` rounds, a measured first on even rounds and b first on
    odd ones, after one untimed call of each (packed weights, builds, page faults): ([a's], [b's]). Each
    measurement makes as many calls as bring the slower one's to at least min_seconds (by the second calls' times),
    and gives the mean."""
    a(), b()
    calls = 1
    for fn in (a, b):
        start = time.perf_counter()
        fn()
        calls = max(calls, math.ceil(min_seconds / max(time.perf_counter() - start, 1e-9)))

    def mean_seconds(fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls

    pairs = alternated_pairs(lambda: mean_seconds(a), lambda: mean_seconds(b), rounds)
    return [t for t, _ in pairs], [t for _, t in pairs]


def _record(result: dict, key: str, two: list[float], g32: list[float]) -> str:
    ratios = [t / g for t, g in zip(two, g32)]
    median = statistics.median(ratios)
    result[f"{key}_two_terms_ms"] = round(statistics.median(two) * 1e3, 3)
    result[f"{key}_group32_ms"] = round(statistics.median(g32) * 1e3, 3)
    result[f"{key}_two_terms_over_group32_x"] = round(median, 3)
    result[f"{key}_two_terms_over_group32_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return (
        f"two terms {statistics.median(two) * 1e3:9.3f} ms  group32 {statistics.median(g32) * 1e3:9.3f} ms  "
        f"ratio {median:5.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    )


def group32_section(
    result: dict,
    rounds: int,
    gen: torch.Generator,
    projections=PROJECTIONS,
    ms: tuple[int, ...] = DECODE_MS + PREFILL_MS,
    layers: int = LAYERS,
) -> None:
    """The module's pairs for each projection and M (see the module docstring), recorded in `result`."""
    if library() is None:
        print("group32: the C kernels are not built here (needs x86-64 with AVX2 and cc)")
        return
    print(
        f"group32 (one int8 term per 32 channels) against two int8 terms, {rounds} alternated rounds, threads "
        f"{torch.get_num_threads()}: the median time ratio two terms / group32 and its range"
    )
    for name, k, n in projections:
        decode_weights = _weights(n, k, layers, gen)
        for m in ms:
            weights = decode_weights if m in DECODE_MS else decode_weights[:PREFILL_COPIES]
            x = torch.randn(m, k, generator=gen) * 3
            q2, s2 = quantize_two_terms_cpu(x)
            q32, s32 = quantize_group32_cpu(x)

            def linear_two(x=x, weights=weights):
                for w, s in weights:
                    linear_two_terms_cpu(x, w, s)

            def linear_g32(x=x, weights=weights):
                for w, s in weights:
                    linear_group32_cpu(x, w, s)

            def gemm_two(q=q2, s_a=s2, weights=weights):
                for w, s in weights:
                    w8a8_grouped_scaled_cpu(q, s_a, w, s)

            def gemm_g32(q=q32, s_a=s32, weights=weights):
                for w, s in weights:
                    w8a8_group32_cpu(q, s_a, w, s)

            for kind, two, g32 in (("linear", linear_two, linear_g32), ("gemm", gemm_two, gemm_g32)):
                line = _record(result, f"group32_{kind}_m{m}_{name}", *alternated_ratios(two, g32, rounds))
                print(f"  {kind:6s} M={m:3d} {name:8s} {n:5d}x{k:<5d} x{len(weights):2d}: {line}")
        del decode_weights


def rescored_section(result: dict, rounds: int, gen: torch.Generator, shape=LM_HEAD, copies=RESCORED_COPIES) -> None:
    """The rescored output projection against the plain group32 op (see the module docstring), in `result`."""
    if library() is None:
        return
    k, n = shape
    weights = [(w, s, row_bounds(w, s)) for w, s in _weights(n, k, copies, gen)]
    print(f"the rescored output projection against plain group32, {n}x{k} x{copies}, {rounds} alternated rounds:")
    for m in DECODE_MS:
        x = torch.randn(m, k, generator=gen) * 3
        x[:, torch.randint(0, k, (4,), generator=gen)] *= 20.0  # a hidden state's outlier channels
        argmax = torch.empty(m, dtype=torch.int64)

        def rescored(x=x, argmax=argmax):
            for w, s, bounds in weights:
                linear_rescored_cpu(x, w, s, bounds, argmax)

        def group32(x=x):
            for w, s, _ in weights:
                linear_group32_cpu(x, w, s)

        res, g32 = alternated_ratios(rescored, group32, rounds)
        ratios = [r / g for r, g in zip(res, g32)]
        key = f"rescored_m{m}_lm_head"
        result[f"{key}_ms"] = round(statistics.median(res) / copies * 1e3, 3)
        result[f"{key}_group32_ms"] = round(statistics.median(g32) / copies * 1e3, 3)
        result[f"{key}_over_group32_x"] = round(statistics.median(ratios), 3)
        result[f"{key}_over_group32_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        print(
            f"  M={m}: rescored {result[f'{key}_ms']:.3f} ms  group32 {result[f'{key}_group32_ms']:.3f} ms a call  "
            f"ratio {statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"
        )


def resident_gmacs(m: int, gen: torch.Generator, shape=RESIDENT) -> float | None:
    """GMAC/s of the group32 GEMM at m rows on one copy of `shape`'s weights (packed where the engine packs them),
    called RESIDENT_CALLS times straight at its C entry point so the weights stay in the cores' L2 and no Python
    check is timed: the best call's (None where the C kernels are not built here)."""
    isa = chosen_isa(None)
    lib = gemm_library(isa)
    if lib is None:
        return None
    _, k, n = shape
    ((w, s),) = _weights(n, k, 1, gen)
    q, s_a = quantize_group32_cpu(torch.randn(m, k, generator=gen))
    s_a = s_a.contiguous()
    out = torch.empty((m, n), dtype=torch.float32)
    args = gemm_args(q, s_a, w, s, isa, out)  # the packed copy lives as long as w
    entry = getattr(lib, GROUP32_ENTRIES[isa])
    if entry(*args):
        return None
    return m * n * k / shortest_seconds(lambda: entry(*args), RESIDENT_CALLS) / 1e9


def resident_section(result: dict, rounds: int, gen: torch.Generator, shape=RESIDENT, ms=DECODE_MS) -> None:
    """The group32 GEMM on weights that stay in the cores' L2 against the int8 product ceiling (see the module
    docstring), alternated, in `result`."""
    from bench.gemv import int8_product_ceiling_gmacs  # here: bench.gemv imports this module

    if library() is None:
        return
    name, k, n = shape
    threads = torch.get_num_threads()
    print(
        f"the group32 GEMM on L2-resident weights ({name} {n}x{k}) against the int8 product ceiling, {rounds} rounds:"
    )
    for m in ms:
        pairs = alternated_pairs(
            lambda: resident_gmacs(m, gen, shape) or math.nan,
            lambda: int8_product_ceiling_gmacs(threads, 1) or math.nan,
            rounds,
        )
        rates, ceilings = [g for g, _ in pairs], [c for _, c in pairs]
        shares = [g / c for g, c in pairs]
        key = f"group32_resident_m{m}_{name}"
        result[f"{key}_gmacs"] = round(statistics.median(rates), 1)
        result[f"{key}_ceiling_gmacs"] = round(statistics.median(ceilings), 1)
        result[f"{key}_of_ceiling"] = round(statistics.median(shares), 3)
        result[f"{key}_of_ceiling_range"] = [round(min(shares), 3), round(max(shares), 3)]
        print(
            f"  M={m}: {result[f'{key}_gmacs']:.1f} GMAC/s, ceiling {result[f'{key}_ceiling_gmacs']:.1f}: "
            f"{statistics.median(shares):.3f} of it ({min(shares):.3f}-{max(shares):.3f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds a pair (else 9)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict = {"threads": args.threads}
    group32_section(result, 3 if args.quick else 9, torch.Generator().manual_seed(0))
    rescored_section(result, 3 if args.quick else 9, torch.Generator().manual_seed(1))
    resident_section(result, 3 if args.quick else 9, torch.Generator().manual_seed(2))
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
