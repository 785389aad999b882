"""GEMV bandwidth: the W8A8 GEMMs of one decode step, against a streaming read measured in the same run.

A decode step of Gemma 3 270M reads ~268 MB of int8 weights: per layer (18) the qkv, o, gate_up and down
projections (5.6 MB, all of it in L3 if timed alone), and the tied 262,144 x 640 output projection (168 MB).
So the step's GEMMs are timed as the engine runs them: 18 layers of distinct weights, then the output
projection, through the engine's CPU GEMM (kernels.cpu.w8a8_gemm.w8a8_gemm_cpu: on CPUs without VNNI the
AVX2 GEMV for M <= 8), at M = 1, 4 and 8 rows. The figures:

  * streaming read: torch sum over a 512 MB float32 tensor, the same threads (the memory's practical limit),
    before the kernels and again after them (a gap between the two says the machine's load changed);
  * step GEMMs: ms, weight GB/s, % of the streaming read; the output projection alone the same way;
  * the baseline kernel in the same run: the AVX2 int8 GEMM (int32 accumulators, then the dequantization in
    PyTorch) that served these calls before the GEMV, where this CPU runs it.

    python -m bench.gemv [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from kernels.cpu.native import cpu_isas
from kernels.cpu.w8a8_gemm import int8_acc_c, w8a8_gemm_cpu
from kernels.w8a8_gemm import w8a8_epilogue

D_MODEL, FFN, QKV, ATTN_OUT, VOCAB, LAYERS = 640, 2048, 1536, 1024, 262_144, 18
STREAM_BYTES = 512 * 2**20


def _best_s(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _weights(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen), torch.rand(n, generator=gen) + 1e-3


def _layer_shapes() -> list[tuple[int, int, bool]]:
    """(N, K, geglu) of one layer's GEMMs, in the order a step runs them."""
    return [(QKV, D_MODEL, False), (D_MODEL, ATTN_OUT, False), (2 * FFN, D_MODEL, True), (D_MODEL, FFN, False)]


def _avx2_baseline(a_q, a_scale, w_q, w_scale, geglu=False):
    acc = int8_acc_c(a_q, w_q, "avx2")
    return w8a8_epilogue(acc.to(torch.float32), a_scale, w_scale, None, None, geglu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    repeats = 3 if args.quick else 10
    gen = torch.Generator().manual_seed(0)
    layers = [[_weights(n, k, gen) + (geglu,) for n, k, geglu in _layer_shapes()] for _ in range(LAYERS)]
    lm_w, lm_s = _weights(VOCAB, D_MODEL, gen)
    step_bytes = sum(w.numel() for layer in layers for w, _, _ in layer) + lm_w.numel()

    x = torch.ones(STREAM_BYTES // 4)
    stream_gbps = STREAM_BYTES / _best_s(lambda: x.sum(), repeats) / 1e9
    print(f"threads {args.threads}, CPU GEMM kernels {cpu_isas()}; streaming read (torch sum over 512 MB): "
          f"{stream_gbps:.1f} GB/s; one step's weights {step_bytes / 1e6:.1f} MB")

    result: dict = {"threads": args.threads, "isas": list(cpu_isas()), "stream_read_gbps": round(stream_gbps, 2),
                    "step_weight_bytes": step_bytes}
    kernels = {"engine": w8a8_gemm_cpu}
    if "avx2" in cpu_isas():
        kernels["avx2_gemm_baseline"] = _avx2_baseline
    for m in (1, 4, 8):
        a = torch.randint(-127, 128, (m, FFN), dtype=torch.int8, generator=gen)
        a_s = torch.rand(m, generator=gen) + 1e-3
        for name, gemm in kernels.items():
            def step():
                for layer in layers:
                    for w, s, geglu in layer:
                        gemm(a[:, :w.shape[1]], a_s, w, s, geglu=geglu)
                gemm(a[:, :D_MODEL], a_s, lm_w, lm_s)

            t_step = _best_s(step, repeats)
            t_lm = _best_s(lambda: gemm(a[:, :D_MODEL], a_s, lm_w, lm_s), repeats)
            for label, t, nbytes in (("step_gemms", t_step, step_bytes), ("lm_head", t_lm, lm_w.numel())):
                gbps = nbytes / t / 1e9
                key = f"{label}_m{m}" + ("" if name == "engine" else f"_{name}")
                result[f"{key}_ms"] = round(t * 1e3, 3)
                result[f"{key}_gbps"] = round(gbps, 2)
                result[f"{key}_pct_of_stream"] = round(100 * gbps / stream_gbps, 1)
                print(f"M={m} {name:20s} {label:10s} {t * 1e3:8.3f} ms  {gbps:6.1f} GB/s  "
                      f"{100 * gbps / stream_gbps:5.1f}% of the streaming read")
    again = STREAM_BYTES / _best_s(lambda: x.sum(), repeats) / 1e9
    print(f"streaming read again after the kernels: {again:.1f} GB/s (the percentages use the first)")
    result["stream_read_after_gbps"] = round(again, 2)
    for m in (4, 8):
        result[f"step_gemms_m{m}_over_m1_x"] = round(result[f"step_gemms_m{m}_ms"] / result["step_gemms_m1_ms"], 2)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
