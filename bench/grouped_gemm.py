"""The grouped int8 GEMM (salon.kernels.w8a8_grouped.w8a8_grouped_triton) at Gemma 3 270M's layer shapes, timed on
rotating weights: enough copies of each weight to exceed the device's L2, cycled one per call, so that every call
reads its weights from memory as the model's step does. Reports the weight bytes read per second against the
device-to-device copy bandwidth of the same run (bench.gpu.copy_bandwidth_gbps) as a fraction.

Part of `python -m bench.kernels`; on a CPU (Triton's interpreter) the same code runs at tiny shapes."""

from __future__ import annotations

import itertools
import math
import time

import torch

from bench.gpu import copy_bandwidth_gbps
from salon.kernels.w8a8_grouped import GROUP, w8a8_grouped_triton

# (name, K, N, geglu) of a Gemma 3 270M layer (d_model 640, 4 query heads and 1 KV head of 256, FFN 2048)
GEMMA_LAYERS = [("qkv", 640, 1536, False), ("o", 1024, 640, False), ("gate_up", 640, 2 * 2048, True),
                ("down", 2048, 640, False)]  # fmt: skip
LAYER_MS = (1, 8, 64, 256)
OUTPUT = ("output", 640, 262_144, False)  # the tied embedding as the output projection
OUTPUT_MS = (1, 8, 64)
ASSUMED_L2_BYTES = 64 << 20  # where the device does not say


def l2_bytes(device: str) -> int:
    if device == "cuda":
        size = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
        if size:
            return int(size)
    return ASSUMED_L2_BYTES


def weight_bytes(K: int, N: int) -> int:
    """What one call must read of its weight: the int8 matrix and its float32 scale per row and group."""
    return N * K + N * (K // GROUP) * 4


def rotating_weights(K: int, N: int, l2: int, device: str, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Distinct copies whose bytes together exceed twice the L2: a weight is evicted before it comes round again."""
    copies = max(2, math.ceil(2 * l2 / weight_bytes(K, N)) + 1)
    g = torch.Generator(device=device).manual_seed(seed)
    return [
        (
            torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8, device=device),
            torch.rand(N, K // GROUP, generator=g, device=device) / 50,
        )
        for _ in range(copies)
    ]


def time_rotating_ms(fn, device: str) -> float:
    """Median milliseconds per call: CUDA events through triton.testing.do_bench on a GPU, else the host clock."""
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median"))
    fn()  # compiles (or interprets) once
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]


def bench_grouped(shapes: list[tuple[str, int, int, bool, tuple[int, ...]]], device: str, l2: int, copy_gbps: float):
    rows = []
    for name, K, N, geglu, ms in shapes:
        weights = rotating_weights(K, N, l2, device)
        for M in ms:
            a = torch.randint(-127, 128, (M, K), dtype=torch.int8, device=device)
            a_s = torch.rand(M, device=device) / 50
            turn = itertools.cycle(weights)

            def call():
                w, w_s = next(turn)
                return w8a8_grouped_triton(a, a_s, w, w_s, geglu=geglu)

            t = time_rotating_ms(call, device)
            gbps = weight_bytes(K, N) / (t * 1e-3) / 1e9
            rows.append(
                dict(layer=name, m=M, k=K, n=N, geglu=geglu, weight_copies=len(weights), triton_ms=t,
                     weight_gbps=gbps, copy_frac=gbps / copy_gbps)
            )  # fmt: skip
            print(
                f"grouped {name:8s} M={M:4d} K={K:5d} N={N:7d} {t:8.3f} ms {gbps:7.0f} GB/s of weights "
                f"({gbps / copy_gbps:.0%} of copy, {len(weights)} rotating copies)"
            )
        del weights
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def run(device: str, quick: bool = False) -> dict:
    """The rows on `device` (cuda: Gemma 3 270M's shapes; cpu: tiny shapes in the interpreter) and the copy figure."""
    if device == "cuda":
        l2 = l2_bytes(device)
        copy_gbps = copy_bandwidth_gbps(device, 2048)
        shapes = [(n, k, nn, g, LAYER_MS) for n, k, nn, g in GEMMA_LAYERS] + [(*OUTPUT, OUTPUT_MS)]
    else:  # interpreted: shapes of the same kinds, a pretend L2 small enough that several copies rotate
        l2 = 1 << 14
        copy_gbps = copy_bandwidth_gbps(device, 64)
        shapes = [("qkv", 64, 96, False, (1, 3)), ("gate_up", 64, 64, True, (2,))]
    print(f"grouped GEMM on rotating weights: L2 {l2 >> 10} KiB, copy bandwidth {copy_gbps:.0f} GB/s")
    rows = bench_grouped(shapes, device, l2, copy_gbps)
    return {"l2_bytes": l2, "copy_gbps": copy_gbps, "rows": rows}
