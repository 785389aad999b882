"""The int8 Linear's activation recipes side by side on the Triton family: two int8 terms a token (`linear_two_terms`,
the shipped recipe) against one int8 term a token and 32 channels (`linear_group32`, salon.kernels.w8a8_group32:
half the int8 products), at Gemma 3 270M's layer shapes (bench/grouped_gemm.py's GEMMA_LAYERS) and M = 1, 8, 64, 256.
Each op runs as the model calls it: qkv and gate_up with the RMSNorm in front, o and down with the post-norm and the
residual behind; on rotating weights (bench/grouped_gemm.py: more copies than the L2 holds, one per call), the
same for both recipes.

The two recipes alternate in rounds (A B, then B A, ...); a row gives each recipe's median milliseconds and the
median and range of the rounds' two-term / group32 time ratios (above 1: group32 is faster). On a GPU a measurement
is CUDA-event time through triton.testing.do_bench; on a CPU (Triton's interpreter) the same code runs at tiny
shapes on the host clock, which checks the code, not the kernels' speed.

And the recipe's output projection (salon.kernels.linear_rescored) at Gemma 3 270M's (640 -> 262,144), M = 1 and 8:
the Triton family's op (one read of the weights for both values of every row: w8a8_group32_two_terms_triton)
against its composition of the family's group32 and two-term Linears (two reads) and against the plain group32 op,
alternated the same way: `rescored` rows with composed / one-read and one-read / group32 time ratios.

Part of `python -m bench.gpu` (its `linear_recipes` and `rescored` rows)."""

from __future__ import annotations

import itertools
import statistics
import time

import torch

from bench.grouped_gemm import GEMMA_LAYERS, LAYER_MS, l2_bytes, rotating_weights
from salon.kernels.backend import triton_ops
from salon.kernels.linear_rescored import compose as compose_rescored
from salon.kernels.linear_rescored import row_bounds
from salon.kernels.quantize import quantize_two_terms_triton
from salon.kernels.w8a8_group32_triton import quantize_group32_triton
from salon.loadgen.alternation import paired_ratio

RECIPES = ("two_terms", "group32")
# (name, K, N, norm in front): the interpreter's shapes, of the same kinds as the GPU's
REHEARSE_LAYERS = [("qkv", 64, 96, True), ("down", 64, 40, False)]
REHEARSE_MS = (1, 3)
# Gemma 3 270M's output projection (K, N), the decode Ms of its rows, and the interpreter's stand-in
LM_HEAD = (640, 262_144)
LM_HEAD_MS = (1, 8)
REHEARSE_LM_HEAD = (64, 96)


def time_ms(fn, device: str) -> float:
    """Milliseconds per call: the median of do_bench's CUDA-event timings on a GPU, one call on the host clock else."""
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def layer_calls(K: int, N: int, norm: bool, M: int, l2: int, device: str) -> tuple[dict, int]:
    """({recipe: a call of the Triton family's op of that recipe}, the number of weight copies): the same rotating
    weights and inputs for both."""
    ops = triton_ops()
    g = torch.Generator(device=device).manual_seed(M * 7 + K)
    x = torch.randn(M, K, generator=g, device=device)
    kw: dict = {"eps": 1e-6}
    if norm:
        kw["norm_weight"] = torch.rand(K, generator=g, device=device) + 0.5
    else:  # o and down: Gemma's post-norm, then the residual
        kw["post_norm"] = torch.rand(N, generator=g, device=device) + 0.5
        kw["residual"] = torch.randn(M, N, generator=g, device=device)
    weights = rotating_weights(K, N, l2, device, seed=K + N)
    ops_of = {"two_terms": ops.linear_two_terms, "group32": ops.linear_group32}
    return rotating_calls(
        {recipe: lambda w_q, w_scale, op=op: op(x, w_q, w_scale, **kw) for recipe, op in ops_of.items()}, weights
    ), len(weights)


def rotating_calls(fns: dict, weights: list[tuple]) -> dict:
    """{name: a call of fns[name] on the next of `weights` (its own turn through them, cycled)}."""
    calls = {}
    for name, fn in fns.items():
        turn = itertools.cycle(weights)
        calls[name] = lambda fn=fn, turn=turn: fn(*next(turn))
    return calls


def ratio_fields(prefix: str, a: list[float], b: list[float]) -> dict:
    """{prefix_median_x, prefix_range_x}: the median and range of the rounds' a / b ratios (paired_ratio's)."""
    r = paired_ratio(list(zip(a, b)), digits=6)
    return {f"{prefix}_median_x": r["median"], f"{prefix}_range_x": [r["min"], r["max"]]}


def alternated_ms(calls: dict, rounds: int, device: str) -> dict[str, list[float]]:
    """{recipe: its milliseconds in each round}: every recipe once a round, the order reversed every other round,
    after one untimed call of each (the kernels' compilation)."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {recipe: [] for recipe in calls}
    order = list(calls)
    for r in range(rounds):
        for recipe in order if r % 2 == 0 else reversed(order):
            times[recipe].append(time_ms(calls[recipe], device))
    return times


def row(name: str, M: int, K: int, N: int, times: dict[str, list[float]], copies: int) -> dict:
    return dict(
        layer=name,
        m=M,
        k=K,
        n=N,
        weight_copies=copies,
        two_terms_ms=statistics.median(times["two_terms"]),
        group32_ms=statistics.median(times["group32"]),
        **ratio_fields("two_terms_over_group32", times["two_terms"], times["group32"]),
    )


def run(device: str, rounds: int) -> list[dict]:
    """The rows on `device` (cuda: Gemma 3 270M's layers; cpu: tiny shapes in the interpreter)."""
    if device == "cuda":
        l2 = l2_bytes(device)
        shapes = [(name, k, n, name in ("qkv", "gate_up"), LAYER_MS) for name, k, n, _ in GEMMA_LAYERS]
    else:
        l2 = 1 << 14
        shapes = [(*layer, REHEARSE_MS) for layer in REHEARSE_LAYERS]
    rows = []
    for name, K, N, norm, ms in shapes:
        for M in ms:
            calls, copies = layer_calls(K, N, norm, M, l2, device)
            rows.append(row(name, M, K, N, alternated_ms(calls, rounds, device), copies))
            r = rows[-1]
            print(
                f"linear {name:8s} M={M:4d} K={K:5d} N={N:5d}: two terms {r['two_terms_ms']:8.3f} ms, group32 "
                f"{r['group32_ms']:8.3f} ms, two terms / group32 {r['two_terms_over_group32_median_x']:.2f}x "
                f"({r['two_terms_over_group32_range_x'][0]:.2f}-{r['two_terms_over_group32_range_x'][1]:.2f})"
            )
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def rescored_calls(K: int, N: int, M: int, l2: int, device: str) -> tuple[dict, int]:
    """({variant: a call}, the number of weight copies) of the output projection: the family's one-read op, its
    composition of two Linears, and the plain group32 Linear, on the same rotating weights and input."""
    ops = triton_ops()
    composed = compose_rescored(
        ops.linear_group32, ops.linear_two_terms, quantize_group32_triton, quantize_two_terms_triton
    )
    x = torch.randn(M, K, generator=torch.Generator(device=device).manual_seed(M), device=device)
    weights = [(w_q, w_scale, row_bounds(w_q, w_scale)) for w_q, w_scale in rotating_weights(K, N, l2, device, seed=N)]
    variants = {
        "one_read": lambda w_q, w_scale, bounds: ops.linear_rescored(x, w_q, w_scale, bounds),
        "composed": lambda w_q, w_scale, bounds: composed(x, w_q, w_scale, bounds),
        "group32": lambda w_q, w_scale, bounds: ops.linear_group32(x, w_q, w_scale),
    }
    return rotating_calls(variants, weights), len(weights)


def run_rescored(device: str, rounds: int) -> list[dict]:
    """The output projection's rows on `device` (cuda: Gemma 3 270M's; cpu: a tiny one in the interpreter)."""
    on_gpu = device == "cuda"
    (K, N), ms, l2 = (LM_HEAD, LM_HEAD_MS, l2_bytes(device)) if on_gpu else (REHEARSE_LM_HEAD, (1, 3), 1 << 14)
    rows = []
    for M in ms:
        calls, copies = rescored_calls(K, N, M, l2, device)
        times = alternated_ms(calls, rounds, device)
        rows.append(
            dict(
                m=M,
                k=K,
                n=N,
                weight_copies=copies,
                **{f"{name}_ms": statistics.median(t) for name, t in times.items()},
                **ratio_fields("composed_over_one_read", times["composed"], times["one_read"]),
                **ratio_fields("one_read_over_group32", times["one_read"], times["group32"]),
            )
        )
        r = rows[-1]
        print(
            f"rescored output projection M={M} K={K} N={N}: one read {r['one_read_ms']:.3f} ms, composed "
            f"{r['composed_ms']:.3f} ms ({r['composed_over_one_read_median_x']:.2f}x), group32 {r['group32_ms']:.3f} "
            f"ms (one read / group32 {r['one_read_over_group32_median_x']:.2f}x)"
        )
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows
