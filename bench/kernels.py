"""Kernel benchmark: the Triton kernels against the PyTorch path and the device's peak.

On a CUDA device (sized for one H200, a few minutes with --quick):
  * W8A8 GEMM: int8 TOPS vs the int8 dense peak, GB/s for decode-sized M, vs torch (torch._int_mm + dequant
    where cuBLAS accepts the shape, and a bf16 matmul of the same size);
  * paged decode attention (MQA 4x1 heads of 256, int8 KV, block 16): GB/s of KV actually read vs HBM peak,
    decode batch 1..256 and contexts to 32k, global and 512-token window; vs the PyTorch reference and vs
    torch scaled_dot_product_attention over a dense bf16 KV of the same context;
  * prefill attention, KV write, RMSNorm+quantize and RoPE: time and GB/s vs the PyTorch reference;
  * the grouped int8 GEMM at Gemma 3 270M's layer shapes (qkv, o, gate_up, down at M = 1, 8, 64, 256; the
    640 x 262,144 output projection at M = 1, 8, 64) on weights rotating through more than the L2: GB/s of
    weight bytes vs the device-to-device copy bandwidth of the same run (bench/grouped_gemm.py).
Without CUDA it says so, checks each kernel against its reference in Triton's interpreter on small shapes, runs
the grouped GEMM rows at tiny shapes there and times the PyTorch references on the CPU.
Ends with one line `RESULT {json}`.

    python -m bench.kernels [--quick]
On a GPU machine, the GPU tests first:  python -m pytest tests/kernels -m gpu -q
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time

import torch
import torch.nn.functional as F

from bench import grouped_gemm
from salon.kernels.kv_write import kv_write_ref, kv_write_triton
from salon.kernels.paged_attention import PagedAttentionArgs, paged_attention_ref, paged_attention_triton
from salon.kernels.quantize import rmsnorm_quant_ref, rmsnorm_quant_triton
from salon.kernels.rope import rope_neox_ref, rope_neox_triton
from salon.kernels.w8a8_gemm import w8a8_gemm_ref, w8a8_gemm_triton
from salon.kernels.w8a8_grouped import w8a8_grouped_scaled_ref, w8a8_grouped_triton

# Dense (no sparsity) peaks by device name: HBM GB/s and int8 tensor-core TOPS.
DEVICE_PEAKS = {
    "H200": (4800.0, 1979.0),
    "H100": (3350.0, 1979.0),  # SXM
    "A100": (2039.0, 624.0),
    "L40S": (864.0, 733.0),
}
HEADS_Q, HEADS_KV, HEAD_DIM, BLOCK_SIZE, WINDOW = 4, 1, 256, 16, 512


def device_peaks(name: str) -> tuple[float | None, float | None]:
    for key, peaks in DEVICE_PEAKS.items():
        if key in name:
            return peaks
    return None, None


def time_ms(fn, *, rep_ms: int = 100) -> float:
    """Median CUDA-event time of fn in milliseconds."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


# ---------------------------------------------------------------- paged decode inputs


def paged_inputs(batch: int, context: int, q_len: int, device: str, seed: int = 0):
    """Random int8 cache holding `batch` sequences of `context` tokens in shuffled blocks."""
    g = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = math.ceil(context / BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, HEADS_KV, HEAD_DIM)
    k_cache = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8, device=device)
    v_cache = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8, device=device)
    k_scale = torch.rand(shape[:3], generator=g, device=device) / 100
    v_scale = torch.rand(shape[:3], generator=g, device=device) / 100
    tables = torch.randperm(num_blocks, generator=g, device=device).to(torch.int32).view(batch, blocks_per_seq)
    q = torch.randn(batch * q_len, HEADS_Q, HEAD_DIM, generator=g, device=device)
    qsl = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * q_len
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, k_scale, v_scale, tables, qsl, seq_lens


def kv_bytes_read(batch: int, context: int, window: int | None) -> int:
    keys = min(context, window) if window else context
    per_key = 2 * HEADS_KV * (HEAD_DIM + 4)  # K and V rows, int8, plus their float32 scales
    return batch * keys * per_key


# ---------------------------------------------------------------- GPU sections


def bench_gemm(quick: bool, int8_peak_tops: float | None, hbm_peak: float | None) -> dict:
    rows = []
    ms = [1, 16, 256, 4096] if quick else [1, 8, 16, 64, 128, 256, 1024, 4096, 16384]
    shapes = [(640, 4096, True), (2048, 640, False), (8192, 8192, False)]
    for K, N, geglu in shapes:
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device="cuda")
        w_s = torch.rand(N, device="cuda") / 50
        for M in ms:
            a = torch.randint(-127, 128, (M, K), dtype=torch.int8, device="cuda")
            a_s = torch.rand(M, device="cuda") / 50
            t_triton = time_ms(lambda: w8a8_gemm_triton(a, a_s, w, w_s, geglu=geglu))
            t_ref = time_ms(lambda: w8a8_gemm_ref(a, a_s, w, w_s, geglu=geglu), rep_ms=50)
            t_int_mm = None
            if M > 16 and M % 8 == 0 and K % 8 == 0 and N % 8 == 0:

                def int_mm():
                    y = torch._int_mm(a, w.T).float() * a_s[:, None] * w_s[None, :]
                    return F.gelu(y[:, : N // 2], approximate="tanh") * y[:, N // 2 :] if geglu else y

                try:
                    t_int_mm = time_ms(int_mm)
                except RuntimeError as e:  # cuBLAS rejects some int8 layouts; the row then has no int_mm figure
                    print(f"torch._int_mm unavailable for M={M} K={K} N={N}: {e}")
            a_bf, w_bf = a.to(torch.bfloat16), w.to(torch.bfloat16)
            t_bf16 = time_ms(lambda: a_bf @ w_bf.T)
            tops = 2 * M * N * K / (t_triton * 1e-3) / 1e12
            gbps = (M * K + N * K + M * (N // 2 if geglu else N) * 4) / (t_triton * 1e-3) / 1e9
            row = dict(
                m=M,
                k=K,
                n=N,
                geglu=geglu,
                triton_ms=t_triton,
                torch_ref_ms=t_ref,
                torch_int_mm_ms=t_int_mm,
                bf16_matmul_ms=t_bf16,
                tops=tops,
                gbps=gbps,
                int8_peak_frac=tops / int8_peak_tops if int8_peak_tops else None,
                hbm_peak_frac=gbps / hbm_peak if hbm_peak else None,
            )
            rows.append(row)
            print(
                f"gemm M={M:5d} K={K:5d} N={N:6d} geglu={geglu!s:5} triton {t_triton:8.3f} ms "
                f"({tops:7.1f} TOPS, {gbps:7.0f} GB/s) ref {t_ref:8.3f} ms int_mm "
                f"{'-' if t_int_mm is None else f'{t_int_mm:.3f}'} ms bf16 {t_bf16:.3f} ms"
            )
    return {"rows": rows}


def bench_decode(quick: bool, hbm_peak: float | None) -> dict:
    rows = []
    batches = [1, 64, 256] if quick else [1, 8, 32, 64, 128, 256]
    contexts = [4096, 32768] if quick else [1024, 4096, 16384, 32768]
    for batch in batches:
        for context in contexts:
            inputs = paged_inputs(batch, context, 1, "cuda")
            q, k_cache, v_cache, k_scale, v_scale, tables, qsl, seq_lens = inputs
            for window in (None, WINDOW):
                args = PagedAttentionArgs(*inputs, HEAD_DIM**-0.5, window)
                t = time_ms(lambda: paged_attention_triton(args))
                gbps = kv_bytes_read(batch, context, window) / (t * 1e-3) / 1e9
                t_ref = time_ms(lambda: paged_attention_ref(args), rep_ms=50) if batch <= 64 else None
                rows.append(
                    dict(
                        batch=batch,
                        context_tokens=context,
                        window=window,
                        triton_ms=t,
                        gbps=gbps,
                        hbm_peak_frac=gbps / hbm_peak if hbm_peak else None,
                        torch_ref_ms=t_ref,
                        sdpa_bf16_ms=None,
                    )
                )
            # SDPA over a dense bf16 copy of the same (global) context: the unpaged, unquantized baseline
            k = (
                (k_cache.float() * k_scale[..., None])
                .to(torch.bfloat16)[tables.long()]
                .view(batch, -1, HEADS_KV, HEAD_DIM)
            )
            v = (
                (v_cache.float() * v_scale[..., None])
                .to(torch.bfloat16)[tables.long()]
                .view(batch, -1, HEADS_KV, HEAD_DIM)
            )
            qd = q.view(batch, 1, HEADS_Q, HEAD_DIM).transpose(1, 2).to(torch.bfloat16)
            kd, vd = k[:, :context].transpose(1, 2), v[:, :context].transpose(1, 2)
            rows[-2]["sdpa_bf16_ms"] = time_ms(
                functools.partial(F.scaled_dot_product_attention, qd, kd, vd, enable_gqa=True)
            )
            del k, v, kd, vd, inputs, k_cache, v_cache
            torch.cuda.empty_cache()
            for r in rows[-2:]:
                print(
                    f"decode B={batch:3d} ctx={context:6d} window={str(r['window']):>4} triton "
                    f"{r['triton_ms']:8.3f} ms "
                    f"{r['gbps']:7.0f} GB/s ref {r['torch_ref_ms'] or float('nan'):8.3f} ms "
                    f"sdpa(bf16 dense) {r['sdpa_bf16_ms'] or float('nan'):8.3f} ms"
                )
    return {"rows": rows}


def bench_prefill(quick: bool) -> dict:
    rows = []
    for prompt in [4096] if quick else [1024, 4096, 16384]:
        inputs = paged_inputs(1, prompt, prompt, "cuda")
        q = inputs[0]
        for window in (None, WINDOW):
            args = PagedAttentionArgs(*inputs, HEAD_DIM**-0.5, window)
            t = time_ms(lambda: paged_attention_triton(args))
            t_ref = time_ms(lambda: paged_attention_ref(args), rep_ms=50)
            rows.append(dict(prompt_tokens=prompt, window=window, triton_ms=t, torch_ref_ms=t_ref))
        k = torch.randn(1, HEADS_KV, prompt, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        qd = q.view(1, prompt, HEADS_Q, HEAD_DIM).transpose(1, 2).to(torch.bfloat16)
        t_sdpa = time_ms(lambda: F.scaled_dot_product_attention(qd, k, k, is_causal=True, enable_gqa=True))
        rows[-2]["sdpa_bf16_ms"] = t_sdpa
        for r in rows[-2:]:
            print(
                f"prefill T={prompt:6d} window={str(r['window']):>4} triton {r['triton_ms']:8.3f} ms "
                f"ref {r['torch_ref_ms']:8.3f} ms sdpa(bf16 causal, global) {t_sdpa:8.3f} ms"
            )
    return {"rows": rows}


def bench_small_ops(hbm_peak: float | None) -> dict:
    out = {}
    x = torch.randn(4096, 2048, device="cuda")
    w = torch.randn(2048, device="cuda") + 1
    t, t_ref = time_ms(lambda: rmsnorm_quant_triton(x, w, 1e-6)), time_ms(lambda: rmsnorm_quant_ref(x, w, 1e-6))
    out["rmsnorm_quant"] = dict(triton_ms=t, torch_ref_ms=t_ref, gbps=x.numel() * 5 / (t * 1e-3) / 1e9)
    xr = torch.randn(8192, HEADS_Q, HEAD_DIM, device="cuda")
    pos = torch.randint(0, 32768, (8192,), device="cuda")
    t, t_ref = time_ms(lambda: rope_neox_triton(xr, pos, 1e6)), time_ms(lambda: rope_neox_ref(xr, pos, 1e6))
    out["rope_neox"] = dict(triton_ms=t, torch_ref_ms=t_ref, gbps=xr.numel() * 8 / (t * 1e-3) / 1e9)
    k = torch.randn(8192, HEADS_KV, HEAD_DIM, device="cuda")
    caches = [torch.zeros(1024, BLOCK_SIZE, HEADS_KV, HEAD_DIM, dtype=torch.int8, device="cuda") for _ in range(2)]
    scales = [torch.zeros(1024, BLOCK_SIZE, HEADS_KV, device="cuda") for _ in range(2)]
    slots = torch.randperm(1024 * BLOCK_SIZE, device="cuda")[:8192]
    t = time_ms(lambda: kv_write_triton(k, k, *caches, *scales, slots))
    t_ref = time_ms(lambda: kv_write_ref(k, k, *caches, *scales, slots))
    out["kv_write"] = dict(triton_ms=t, torch_ref_ms=t_ref, gbps=2 * k.numel() * 5 / (t * 1e-3) / 1e9)
    for name, r in out.items():
        frac = f" ({r['gbps'] / hbm_peak:.0%} of HBM)" if hbm_peak else ""
        print(
            f"{name:14s} triton {r['triton_ms']:.3f} ms, {r['gbps']:.0f} GB/s{frac}; torch {r['torch_ref_ms']:.3f} ms"
        )
    return out


def run_cuda(quick: bool) -> dict:
    name = torch.cuda.get_device_name()
    hbm_peak, int8_peak = device_peaks(name)
    print(f"device {name}: HBM peak {hbm_peak} GB/s, int8 dense peak {int8_peak} TOPS (None: unknown device)")
    gemm = bench_gemm(quick, int8_peak, hbm_peak)
    decode = bench_decode(quick, hbm_peak)
    prefill = bench_prefill(quick)
    small = bench_small_ops(hbm_peak)
    grouped = grouped_gemm.run("cuda", quick)
    long_decode = [r for r in decode["rows"] if r["context_tokens"] >= 16384 and r["window"] is None]
    big_gemm = [r for r in gemm["rows"] if r["m"] >= 1024]
    return {
        "cuda": True,
        "device": name,
        "hbm_peak_gbps": hbm_peak,
        "int8_peak_tops": int8_peak,
        "decode_attn_best_gbps": max(r["gbps"] for r in long_decode),
        "decode_attn_best_hbm_frac": max((r["hbm_peak_frac"] or 0) for r in long_decode) if hbm_peak else None,
        "gemm_best_tops": max(r["tops"] for r in big_gemm),
        "gemm_best_int8_peak_frac": max((r["int8_peak_frac"] or 0) for r in big_gemm) if int8_peak else None,
        "gemm": gemm["rows"],
        "decode": decode["rows"],
        "prefill": prefill["rows"],
        "small_ops": small,
        "grouped_copy_gbps": grouped["copy_gbps"],
        "grouped_l2_bytes": grouped["l2_bytes"],
        "grouped_best_copy_frac": max(r["copy_frac"] for r in grouped["rows"]),
        "grouped_gemm": grouped["rows"],
    }


# ---------------------------------------------------------------- CPU fallback


def run_cpu(quick: bool) -> dict:
    print(
        "no CUDA device: GPU figures (GB/s, TOPS, speed vs torch/SDPA) not measured; "
        "checking kernels in the Triton interpreter and timing the PyTorch references on CPU"
    )
    torch.manual_seed(0)
    errors = {}
    a = torch.randint(-127, 128, (5, 70), dtype=torch.int8)
    w = torch.randint(-127, 128, (42, 70), dtype=torch.int8)
    a_s, w_s, res = torch.rand(5), torch.rand(42), torch.randn(5, 21)
    errors["w8a8_gemm"] = (
        (
            w8a8_gemm_triton(a, a_s, w, w_s, residual=res, geglu=True)
            - w8a8_gemm_ref(a, a_s, w, w_s, residual=res, geglu=True)
        )
        .abs()
        .max()
        .item()
    )
    w_g = torch.rand(42, 64 // 32) / 50
    a_g = torch.randint(-127, 128, (5, 64), dtype=torch.int8)
    w_q = torch.randint(-127, 128, (42, 64), dtype=torch.int8)
    errors["w8a8_grouped"] = (
        (w8a8_grouped_triton(a_g, a_s, w_q, w_g) - w8a8_grouped_scaled_ref(a_g, a_s, w_q, w_g)).abs().max().item()
    )
    x, wn = torch.randn(9, 37), torch.randn(37) + 1
    errors["rmsnorm_quant_int8_steps"] = (
        (rmsnorm_quant_triton(x, wn, 1e-6)[0].int() - rmsnorm_quant_ref(x, wn, 1e-6)[0].int()).abs().max().item()
    )
    xr, pos = torch.randn(5, 4, 16), torch.tensor([0, 1, 100, 5000, 32000])
    errors["rope_neox"] = (rope_neox_triton(xr, pos, 1e6) - rope_neox_ref(xr, pos, 1e6)).abs().max().item()
    for q_len, label in ((1, "paged_decode"), (40, "paged_prefill")):
        batch, context = 3, 40
        inputs = paged_inputs(batch, context, q_len, "cpu")
        inputs = (inputs[0][:, :, :16].contiguous(), *(t[..., :16].contiguous() for t in inputs[1:3]), *inputs[3:])
        args = PagedAttentionArgs(*inputs, 0.25, 24)
        errors[label] = (paged_attention_triton(args) - paged_attention_ref(args)).abs().max().item()
    for name, err in errors.items():
        print(f"interpreter check {name:26s} max abs error vs reference {err:.3g}")

    torch.set_num_threads(1)
    timings = {}
    a1 = torch.randint(-127, 128, (1, 640), dtype=torch.int8)
    w1 = torch.randint(-127, 128, (4096, 640), dtype=torch.int8)
    t0 = time.perf_counter()
    for _ in range(5):
        w8a8_gemm_ref(a1, torch.rand(1), w1, torch.rand(4096), geglu=True)
    timings["gemm_ref_m1_k640_n4096_ms"] = (time.perf_counter() - t0) / 5 * 1e3
    contexts = [1024] if quick else [1024, 4096]
    for context in contexts:
        args = PagedAttentionArgs(*paged_inputs(1, context, 1, "cpu"), HEAD_DIM**-0.5, None)
        t0 = time.perf_counter()
        for _ in range(3):
            paged_attention_ref(args)
        timings[f"decode_ref_b1_ctx{context}_ms"] = (time.perf_counter() - t0) / 3 * 1e3
    for name, ms in timings.items():
        print(f"cpu torch reference {name}: {ms:.2f}")
    grouped = grouped_gemm.run("cpu")
    return {
        "cuda": False,
        "interpreter_max_abs_err": errors,
        "cpu_ref_timings": timings,
        "grouped_copy_gbps": grouped["copy_gbps"],
        "grouped_l2_bytes": grouped["l2_bytes"],
        "grouped_best_copy_frac": max(r["copy_frac"] for r in grouped["rows"]),
        "grouped_gemm": grouped["rows"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes (a few minutes on one GPU)")
    args = parser.parse_args()
    result = run_cuda(args.quick) if torch.cuda.is_available() else run_cpu(args.quick)
    print("RESULT " + json.dumps(result, default=float))


if __name__ == "__main__":
    main()
