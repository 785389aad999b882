"""GEMV bandwidth: the W8A8 GEMMs of one decode step, against a streaming read measured in the same run.

A decode step of Gemma 3 270M reads ~268 MB of int8 weights: per layer (18) the qkv, o, gate_up and down
projections (5.6 MB, all of it in L3 if timed alone), and the tied 262,144 x 640 output projection (168 MB).
So the step's GEMMs are timed as the engine runs them: 18 layers of distinct weights, then the output
projection, through the engine's CPU GEMM (salon.kernels.cpu.w8a8_gemm.w8a8_gemm_cpu: on CPUs without VNNI the
AVX2 GEMV for M <= 8), at M = 1, 4 and 8 rows. The figures:

  * streaming read: torch sum over a 512 MB float32 tensor, the same threads (the memory's practical limit),
    before the kernels and again after them (a gap between the two says the machine's load changed);
  * step GEMMs: ms, weight GB/s, % of the streaming read; the output projection alone the same way;
  * the baseline kernel in the same run: the AVX2 int8 GEMM (int32 accumulators, then the dequantization in
    PyTorch) that served these calls before the GEMV, where this CPU runs it;
  * the int8 product ceiling (bench/int8_ceiling.c, the same threads): the exact products per second the
    engine's GEMM instructions reach with every operand in registers, and each GEMM's GMAC/s as a share of
    it. A GEMM near the streaming read is bound by memory, one near the ceiling by its products: on AVX2 (four
    instructions per 32 products) the decode of 4 or more sequences is the second kind;
  * on AVX2, the same ceiling for one int16 term per activation (vpmaddwd on sign-extended int8 weights), in
    the two-term recipe's products: the ceiling of the recipe the engine runs on CPUs without VNNI
    (salon/kernels/w16a8_grouped.py), measured beside the two-term ceiling.

With --int16, the int16-activation GEMM (salon/kernels/cpu/w16a8_grouped.c: one int16 term per activation) on T rows
against the engine's two-term GEMM on the 2T int8 rows of two terms, the same weights with group scales, at T = 1,
4, 16, 64 and 256 on a layer's gate_up and down weights, in alternation (int16_t{T}_{gate_up,down}_speedup_x).

With --grouped, the same weights also with group scales (f32[N, K/32], salon.kernels.w8a8_grouped: +1/8 of the
weight bytes as float32 scales), through the same engine entry point (w8a8_gemm_cpu:
salon/kernels/cpu/w8a8_grouped_vnni.c
on VNNI CPUs, w8a8_grouped.c on AVX2 ones), against the per-row scales, the two timed in alternation so the ratio
grouped / per-row is a same-run figure on this noisy machine: the step's GEMMs and the output projection at
M = 1, 2, 4, 8, 16 (2, 8, 16: decode of 1, 4, 8 sequences with two activation terms), and one prefill shape,
M = 256 on a layer's gate_up (640 -> 2 x 2048, geglu) and down (2048 -> 640) weights; and the 18 layers' grouped
GEMMs at a 64-token prefill chunk's 128 two-term rows, weights from memory (prefill_chunk_m128_layers_*: GMAC/s and
% of the product ceiling, what bounds a cold history's prefill). On a VNNI CPU the grouped
AVX2 kernel is timed against the VNNI one the same way (the baseline the VNNI kernel replaced), and the VNNI
kernel on the weights as they lie (vnni_rows: 16 rows of 32 bytes at a time, transposed in registers) against
the same kernel on its packed copy (salon.kernels.cpu.w8a8_grouped.packed_weights: one sequential stream, what the
engine runs), the same way; and the engine's kernel against itself built with the prefill's prefetch at every
size (vnni_prefill_prefetch, bench/w8a8_grouped_vnni_prefill_prefetch.c: the baseline of its decode prefetch).

With --group32, the group32 activation recipe (salon.kernels.w8a8_group32: one int8 term per token and 32 channels)
against the two int8 terms at Gemma's four projections, decode (M = 1, 8) and prefill (M = 64, 512), the op and the
GEMM alone, alternated: bench/group32_gemm.py (`group32_{linear,gemm}_m{M}_{proj}_two_terms_over_group32_x`, the
median ratio of the rounds, and its range); and the rescored output projection against plain group32
(`rescored_m{M}_lm_head_over_group32_x`).

Huge pages: the step's group-scaled GEMMs (the engine's Gemma path) at M = 2 and 8 (decode of 1 and 4 sequences)
with the weights where torch allocates them (4 KB pages wherever transparent huge pages are "madvise" only)
against the same weights copied into huge pages as the engine's loader places them
(salon/engine/model/huge_pages.py), the two timed in alternation. On VNNI both read the weights as they lie
(the packed copies the engine reads are in huge pages either way).

    python -m bench.gemv [--quick] [--threads N] [--grouped] [--int16] [--group32]
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import torch

from bench.alternate import best_seconds, shortest_seconds
from bench.group32_gemm import group32_section, rescored_section, resident_section
from bench.int16_gemm import int16_section
from salon.engine.model.huge_pages import in_huge_pages
from salon.kernels.cpu import native
from salon.kernels.cpu.native import cpu_isas
from salon.kernels.cpu.w8a8_gemm import int8_acc_c, w8a8_gemm_cpu
from salon.kernels.cpu.w8a8_grouped import GEMM_ARGS as GROUPED_ARGS
from salon.kernels.cpu.w8a8_grouped import w8a8_grouped_scaled_cpu, weight_pointers
from salon.kernels.w8a8_gemm import w8a8_epilogue, w8a8_epilogue_after_scales
from salon.kernels.w8a8_grouped import GROUP

D_MODEL, FFN, QKV, ATTN_OUT, VOCAB, LAYERS = 640, 2048, 1536, 1024, 262_144, 18
STREAM_BYTES = 512 * 2**20


def _best_s(fn, repeats: int) -> float:
    fn()
    return shortest_seconds(fn, repeats)


def _best_pair_s(fn_a, fn_b, repeats: int) -> tuple[float, float]:
    """Best times of fn_a and fn_b after a call of each, run in alternation (bench/alternate.py)."""
    best = best_seconds({"a": fn_a, "b": fn_b}, repeats)
    return best["a"], best["b"]


def int8_product_ceiling_gmacs(threads: int, repeats: int) -> float | None:
    """The best of `repeats` runs of bench/int8_ceiling.c on `threads` threads: the exact int8 products per second
    (G) the engine's GEMM instructions reach on this CPU with every operand in registers (VNNI's vpdpbusd where
    the engine runs the VNNI kernel, else AVX2's four-instruction product); None where it cannot be built."""
    return _ceiling_gmacs(1 if cpu_isas()[:1] == ("vnni",) else 0, threads, repeats)


def int16_activation_ceiling_gmacs(threads: int, repeats: int) -> float | None:
    """The same for the int16-activation recipe (the engine's on CPUs without VNNI): one int16 term per activation
    against sign-extended int8 weights (AVX2's vpmaddwd, 16 products an instruction), counted as the two int8
    products of the two-term recipe each product replaces, so it reads against int8_product_ceiling_gmacs; None
    without AVX2."""
    return _ceiling_gmacs(2, threads, repeats) if "avx2" in cpu_isas() else None


def _ceiling_gmacs(mode: int, threads: int, repeats: int) -> float | None:
    lib = native.load(
        Path(__file__).with_name("int8_ceiling.c"),
        {"int8_products_per_s": ([ctypes.c_int, ctypes.c_int64, ctypes.c_int], ctypes.c_double)},
    )
    if lib is None:
        return None
    return max(lib.int8_products_per_s(mode, 4_000_000, threads) for _ in range(repeats)) / 1e9


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
    parser.add_argument(
        "--grouped",
        action="store_true",
        help="also time group scales (f32[N, K/32]) against per-row scales on the same weights",
    )
    parser.add_argument(
        "--int16",
        action="store_true",
        help="also time the int16-activation GEMM (salon/kernels/cpu/w16a8_grouped.c) against the "
        "engine's two-term GEMM",
    )
    parser.add_argument(
        "--group32",
        action="store_true",
        help="also time the group32 activations (one int8 term per 32 channels) against two int8 terms "
        "(bench/group32_gemm.py)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    repeats = 3 if args.quick else 10
    gen = torch.Generator().manual_seed(0)
    layers = [[_weights(n, k, gen) + (geglu,) for n, k, geglu in _layer_shapes()] for _ in range(LAYERS)]
    lm_w, lm_s = _weights(VOCAB, D_MODEL, gen)
    step_bytes = sum(w.numel() for layer in layers for w, _, _ in layer) + lm_w.numel()

    x = torch.ones(STREAM_BYTES // 4)
    stream_gbps = STREAM_BYTES / _best_s(lambda: x.sum(), repeats) / 1e9
    ceiling = int8_product_ceiling_gmacs(args.threads, repeats)
    int16 = int16_activation_ceiling_gmacs(args.threads, repeats)
    print(
        f"threads {args.threads}, CPU GEMM kernels {cpu_isas()}; streaming read (torch sum over 512 MB): "
        f"{stream_gbps:.1f} GB/s; int8 product ceiling (bench/int8_ceiling.c): "
        f"{'n/a' if ceiling is None else f'{ceiling:.1f} GMAC/s'}; one step's weights {step_bytes / 1e6:.1f} MB"
    )
    if int16 is not None and ceiling is not None:
        print(
            f"  with one int16 term per activation instead of two int8 terms (the engine's recipe without VNNI): "
            f"{int16:.1f} GMAC/s in two-term products, {int16 / ceiling:.2f}x the ceiling above"
        )

    result: dict = {
        "threads": args.threads,
        "isas": list(cpu_isas()),
        "stream_read_gbps": round(stream_gbps, 2),
        "int8_product_ceiling_gmacs": None if ceiling is None else round(ceiling, 2),
        "int16_activation_ceiling_gmacs": None if int16 is None else round(int16, 2),
        "int16_activation_over_int8_ceiling_x": None if int16 is None or ceiling is None else round(int16 / ceiling, 2),
        "step_weight_bytes": step_bytes,
    }
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
                        gemm(a[:, : w.shape[1]], a_s, w, s, geglu=geglu)
                gemm(a[:, :D_MODEL], a_s, lm_w, lm_s)

            t_step = _best_s(step, repeats)
            t_lm = _best_s(lambda: gemm(a[:, :D_MODEL], a_s, lm_w, lm_s), repeats)
            for label, t, nbytes in (("step_gemms", t_step, step_bytes), ("lm_head", t_lm, lm_w.numel())):
                gbps = nbytes / t / 1e9
                key = f"{label}_m{m}" + ("" if name == "engine" else f"_{name}")
                result[f"{key}_ms"] = round(t * 1e3, 3)
                result[f"{key}_gbps"] = round(gbps, 2)
                result[f"{key}_pct_of_stream"] = round(100 * gbps / stream_gbps, 1)
                print(
                    f"M={m} {name:20s} {label:10s} {t * 1e3:8.3f} ms  {gbps:6.1f} GB/s  "
                    f"{100 * gbps / stream_gbps:5.1f}% of the streaming read"
                    f"{_of_ceiling(result, key, m * nbytes / t / 1e9, ceiling)}"
                )
    _huge_pages_section(layers, lm_w, repeats, gen, result)
    if args.grouped:
        _grouped_section(layers, lm_w, lm_s, step_bytes, repeats, gen, result, ceiling)
    if args.int16:
        int16_section(layers[0], repeats, gen, result, args.threads)
    if args.group32:
        group32_section(result, 3 if args.quick else 9, gen)
        rescored_section(result, 3 if args.quick else 9, gen)
        resident_section(result, 3 if args.quick else 9, gen)
    again = STREAM_BYTES / _best_s(lambda: x.sum(), repeats) / 1e9
    print(f"streaming read again after the kernels: {again:.1f} GB/s (the percentages use the first)")
    result["stream_read_after_gbps"] = round(again, 2)
    for m in (4, 8):
        result[f"step_gemms_m{m}_over_m1_x"] = round(result[f"step_gemms_m{m}_ms"] / result["step_gemms_m1_ms"], 2)
    print("RESULT " + json.dumps(result))


def _pct_of_ceiling(result: dict, key: str, gmacs: float, ceiling: float | None) -> float | None:
    """A GEMM's products per second as % of the int8 product ceiling, recorded under `key` (None: no ceiling)."""
    if ceiling is None:
        return None
    pct = 100 * gmacs / ceiling
    result[f"{key}_pct_of_product_ceiling"] = round(pct, 1)
    return pct


def _of_ceiling(result: dict, key: str, gmacs: float, ceiling: float | None) -> str:
    """Records and formats a GEMM's products per second against the int8 product ceiling (none: nothing)."""
    pct = _pct_of_ceiling(result, key, gmacs, ceiling)
    if pct is None:
        return ""
    result[f"{key}_gmacs"] = round(gmacs, 2)
    return f"  {gmacs:6.1f} GMAC/s {pct:5.1f}% of the product ceiling"


def _huge_pages_section(layers, lm_w, repeats: int, gen: torch.Generator, result: dict) -> None:
    """The step's grouped GEMMs with the weights in the allocator's pages against the same weights in huge pages
    (see the module docstring), timed in alternation."""
    small = {"lm.w": lm_w, "lm.s": torch.rand(VOCAB, D_MODEL // GROUP, generator=gen) + 1e-3}
    for i, layer in enumerate(layers):
        for j, (w, _, _) in enumerate(layer):
            small[f"{i}.{j}.w"] = w
            small[f"{i}.{j}.s"] = torch.rand(w.shape[0], w.shape[1] // GROUP, generator=gen) + 1e-3
    huge = in_huge_pages(small)
    print("huge pages: the step's grouped GEMMs with the weights in the allocator's pages and in huge pages")
    for m in (2, 8):  # decode of 1 and 4 sequences with two activation terms
        a = torch.randint(-127, 128, (m, FFN), dtype=torch.int8, generator=gen)
        a_s = torch.rand(m, generator=gen) + 1e-3

        def step(t, a=a, a_s=a_s):
            def run():
                for i, layer in enumerate(layers):
                    for j, (w, _, geglu) in enumerate(layer):
                        _grouped_rows(a[:, : w.shape[1]], a_s, t[f"{i}.{j}.w"], t[f"{i}.{j}.s"], geglu=geglu)
                _grouped_rows(a[:, :D_MODEL], a_s, t["lm.w"], t["lm.s"])

            return run

        t_small, t_huge = _best_pair_s(step(small), step(huge), repeats)
        key = f"huge_pages_step_gemms_m{m}"
        result[f"{key}_small_pages_ms"] = round(t_small * 1e3, 3)
        result[f"{key}_huge_pages_ms"] = round(t_huge * 1e3, 3)
        result[f"{key}_speedup_x"] = round(t_small / t_huge, 3)
        print(
            f"M={m} step_gemms (grouped)  allocator's pages {t_small * 1e3:8.3f} ms  huge pages "
            f"{t_huge * 1e3:8.3f} ms  {t_small / t_huge:5.2f}x"
        )


def _grouped_avx2(a_q, a_scale, w_q, w_scale, geglu=False):
    y = w8a8_grouped_scaled_cpu(a_q, a_scale, w_q, w_scale, isa="avx2")
    return w8a8_epilogue_after_scales(y, None, None, geglu)


def _grouped_rows(a_q, a_scale, w_q, w_scale, geglu=False):
    """The engine's grouped GEMM on the weights as they lie (on VNNI, not its packed copy)."""
    y = w8a8_grouped_scaled_cpu(a_q, a_scale, w_q, w_scale, packed=False)
    return w8a8_epilogue_after_scales(y, None, None, geglu)


def _grouped_prefill_prefetch(a_q, a_scale, w_q, w_scale, geglu=False):
    """The engine's grouped GEMM on its packed copy with the prefill's prefetch at every size
    (bench/w8a8_grouped_vnni_prefill_prefetch.c): the baseline of the decode prefetch."""
    lib = native.load(
        Path(__file__).with_name("w8a8_grouped_vnni_prefill_prefetch.c"), {"w8a8_grouped_vnni": GROUPED_ARGS}
    )
    w_ptr, s_ptr = weight_pointers(w_q, w_scale, "vnni")
    m, k = a_q.shape
    n = w_q.shape[0]
    a_scale = a_scale.to(torch.float32).contiguous()
    y = torch.empty((m, n), dtype=torch.float32)
    if s_ptr is not None or lib.w8a8_grouped_vnni(
        a_q.data_ptr(),
        a_q.stride(0),
        w_ptr,
        None,
        y.data_ptr(),
        n,
        a_scale.data_ptr(),
        m,
        n,
        k,
        torch.get_num_threads(),
    ):
        raise RuntimeError("the prefill-prefetch baseline declined a call the engine's kernel takes")
    return w8a8_epilogue_after_scales(y, None, None, geglu)


def _grouped_section(
    layers, lm_w, lm_s, step_bytes: int, repeats: int, gen: torch.Generator, result: dict, ceiling: float | None
) -> None:
    """Per-row against group scales on the same weights, timed in alternation (see the module docstring); on a
    VNNI CPU also the grouped AVX2 kernel against the engine's (VNNI) one."""

    def group_scales(w):
        return torch.rand(w.shape[0], w.shape[1] // GROUP, generator=gen) + 1e-3

    layers_g = [[(w, group_scales(w), geglu) for w, _, geglu in layer] for layer in layers]
    lm_sg = group_scales(lm_w)
    scale_bytes = sum(s.numel() * 4 for layer in layers_g for _, s, _ in layer) + lm_sg.numel() * 4
    print(f"grouped: the same weights with f32 scales per 32 channels (+{scale_bytes / 1e6:.1f} MB read per step)")
    result["grouped_step_scale_bytes"] = scale_bytes
    pairs = [("per_row", w8a8_gemm_cpu, False)]
    if cpu_isas()[:1] == ("vnni",):
        pairs += [
            ("grouped_avx2", _grouped_avx2, True),
            ("vnni_rows", _grouped_rows, True),
            ("vnni_prefill_prefetch", _grouped_prefill_prefetch, True),
        ]
    for base_name, base_gemm, base_grouped in pairs:
        _grouped_pairs(
            layers,
            layers_g,
            lm_w,
            lm_s,
            lm_sg,
            step_bytes,
            repeats,
            gen,
            result,
            base_name,
            base_gemm,
            base_grouped,
            ceiling,
        )
    _prefill_chunk(layers_g, repeats, gen, result, ceiling)


# A 64-token prefill chunk (the scheduler's solo share for cold histories) with two activation terms a token.
PREFILL_CHUNK_ROWS = 128


def _prefill_chunk(layers_g, repeats: int, gen: torch.Generator, result: dict, ceiling: float | None) -> None:
    """The 18 layers' grouped GEMMs (weights from memory, as a step reads them) at a 64-token prefill chunk's 128
    two-term rows through the kernel the engine's fused layers call (w8a8_grouped_scaled_cpu: the packed copy on
    VNNI, the dequantized output without the epilogue, which those layers fuse): the products per second a cold
    history's prefill gets, against the product ceiling of the same run."""
    m = PREFILL_CHUNK_ROWS
    a = torch.randint(-127, 128, (m, FFN), dtype=torch.int8, generator=gen)
    a_s = torch.rand(m, generator=gen) + 1e-3

    def run():
        for layer in layers_g:
            for w, s, _ in layer:
                if w8a8_grouped_scaled_cpu(a[:, : w.shape[1]], a_s, w, s) is None:
                    raise RuntimeError("the grouped GEMM declined the prefill chunk")

    t = _best_s(run, repeats)
    gmacs = m * sum(w.numel() for layer in layers_g for w, _, _ in layer) / t / 1e9
    result["prefill_chunk_m128_layers_ms"] = round(t * 1e3, 3)
    detail = _of_ceiling(result, "prefill_chunk_m128_layers", gmacs, ceiling) or f"  {gmacs:6.1f} GMAC/s"
    print(f"prefill chunk M={m} (64 tokens, two terms), the step's layer GEMMs: {t * 1e3:8.2f} ms{detail}")


def _grouped_pairs(
    layers, layers_g, lm_w, lm_s, lm_sg, step_bytes, repeats, gen, result, base_name, base_gemm, base_grouped, ceiling
):
    """The engine's grouped GEMMs against base_gemm (on the per-row scales, or base_grouped: on the same group
    scales), timed in alternation."""
    print(f"grouped ({cpu_isas()[0]}) against {base_name}:")
    base_layers, base_lm_s = (layers_g, lm_sg) if base_grouped else (layers, lm_s)
    for m in (1, 2, 4, 8, 16):  # 2, 8, 16: decode at 1, 4, 8 sequences with two activation terms
        a = torch.randint(-127, 128, (m, FFN), dtype=torch.int8, generator=gen)
        a_s = torch.rand(m, generator=gen) + 1e-3

        def step(gemm, lays, lm_scale, a=a, a_s=a_s):
            def run():
                for layer in lays:
                    for w, s, geglu in layer:
                        gemm(a[:, : w.shape[1]], a_s, w, s, geglu=geglu)
                gemm(a[:, :D_MODEL], a_s, lm_w, lm_scale)

            return run

        def lm(gemm, lm_scale, a=a, a_s=a_s):
            return lambda: gemm(a[:, :D_MODEL], a_s, lm_w, lm_scale)

        for label, (t_base, t_grp), nbytes in (
            (
                "step_gemms",
                _best_pair_s(step(base_gemm, base_layers, base_lm_s), step(w8a8_gemm_cpu, layers_g, lm_sg), repeats),
                step_bytes,
            ),
            ("lm_head", _best_pair_s(lm(base_gemm, base_lm_s), lm(w8a8_gemm_cpu, lm_sg), repeats), lm_w.numel()),
        ):
            _record_pair(result, f"{label}_m{m}", base_name, t_base, t_grp, "gbps", nbytes / t_grp / 1e9)
            print(
                f"M={m} {label:10s} {base_name} {t_base * 1e3:8.3f} ms  grouped {t_grp * 1e3:8.3f} ms  "
                f"grouped/{base_name} {t_grp / t_base:5.2f}x"
                f"{_of_ceiling(result, f'{label}_m{m}_grouped', m * nbytes / t_grp / 1e9, ceiling)}"
            )
    m = 256
    a = torch.randint(-127, 128, (m, FFN), dtype=torch.int8, generator=gen)
    a_s = torch.rand(m, generator=gen) + 1e-3
    for index, label in ((2, "gate_up"), (3, "down")):
        w, s_grp, geglu = layers_g[0][index]
        s_base = s_grp if base_grouped else layers[0][index][1]

        def prefill(gemm, scale, w=w, geglu=geglu):
            return lambda: gemm(a[:, : w.shape[1]], a_s, w, scale, geglu=geglu)

        t_base, t_grp = _best_pair_s(prefill(base_gemm, s_base), prefill(w8a8_gemm_cpu, s_grp), repeats)
        macs = m * w.numel()
        _record_pair(result, f"prefill_m{m}_{label}", base_name, t_base, t_grp, "gmacs", macs / t_grp / 1e9)
        share = _pct_of_ceiling(result, f"prefill_m{m}_{label}_grouped", macs / t_grp / 1e9, ceiling)
        pct = "" if share is None else f", {share:.0f}% of the product ceiling"
        print(
            f"prefill M={m} {label:8s} {w.shape[0]}x{w.shape[1]}: {base_name} {t_base * 1e3:8.3f} ms  grouped "
            f"{t_grp * 1e3:8.3f} ms ({macs / t_grp / 1e9:5.1f} GMAC/s{pct})  grouped/{base_name} "
            f"{t_grp / t_base:5.2f}x"
        )


def _record_pair(
    result: dict, key: str, base_name: str, t_base: float, t_grp: float, rate_unit: str, rate: float
) -> None:
    """The RESULT keys of one baseline / grouped pair: both times, the grouped rate, the ratio (the grouped
    figures named by the baseline they were timed against: each pair is its own alternating run)."""
    result[f"{key}_{base_name}_ms"] = round(t_base * 1e3, 3)
    result[f"{key}_grouped_against_{base_name}_ms"] = round(t_grp * 1e3, 3)
    result[f"{key}_grouped_against_{base_name}_{rate_unit}"] = round(rate, 2)
    result[f"{key}_grouped_over_{base_name}_x"] = round(t_grp / t_base, 3)


if __name__ == "__main__":
    main()
