"""The group32 recipe's C kernels (salon.kernels.w8a8_group32: one int8 term per token and 32 channels) against its
references, bit for bit, in every build this CPU runs: the quantization (quantize.c, AVX-512 and AVX2 builds), the
GEMM (the group32 entry points of w8a8_grouped_vnni.c, on the weights as they lie and on their packed copy, and of
w8a8_grouped.c on AVX2: decode cases, 16- and 8-row blocks with short last ones, the M_CHUNK passes of prefill,
the thread split), and the one-call Linear (linear_two_terms.h's third recipe, and the CPU family's composition
where the call declines). Scales are random floats over many groups, so a fused multiply-add, the row's scale
applied after the sum (the two-term kernels' order) or groups added in another order change the bits."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from salon.kernels import backend
from salon.kernels.cpu import native
from salon.kernels.cpu.linear_two_terms import (
    MAX_ROWS,
    composed_group32,
    linear_group32_cpu,
    linear_two_terms_c,
)
from salon.kernels.cpu.linear_two_terms import library as linear_library
from salon.kernels.cpu.quantize import kernel as quantize_kernel
from salon.kernels.cpu.quantize import quantize_group32_cpu
from salon.kernels.cpu.w8a8_group32 import w8a8_group32_cpu, w8a8_group32_gemm_cpu
from salon.kernels.cpu.w8a8_grouped import library as gemm_library
from salon.kernels.linear_two_terms import linear_group32_ref
from salon.kernels.quantize import SCALE_FLOOR
from salon.kernels.w8a8_group32 import quantize_group32_ref, w8a8_group32_ref

SIMD_ISAS = native.simd_isas()
GEMM_ISAS = [isa for isa in native.cpu_isas() if gemm_library(isa) is not None]
LINEAR_ISAS = [isa for isa in native.cpu_isas() if linear_library(isa) is not None]
needs_quantize = pytest.mark.skipif(not SIMD_ISAS, reason="no C quantization kernel here (needs AVX2 + FMA and cc)")
needs_gemm = pytest.mark.skipif(not GEMM_ISAS, reason="no grouped GEMM kernel here (needs AVX2 and cc)")
# "vnni-packed": the VNNI kernel on its packed copy of the weights (the default); "vnni": on the weights as they lie
each_gemm = pytest.mark.parametrize("isa", (["vnni-packed"] if "vnni" in GEMM_ISAS else []) + GEMM_ISAS)
EPS = 1e-6


# ---- quantization ----


def _activations(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, k // 32).repeat_interleave(32)[None, :]
    x *= torch.rand(m, 1, generator=g).mul(10).add(0.01)
    if m > 2:
        x[1, :32] = 0.0  # an all-zero group: the floor scale, zeros
        x[2, :8] = torch.tensor([127.0, -127.0, 0.5, -1.5, 2.5, -3.5, 126.5, -0.5])  # scale 1: ties to even
    if m > 3 and k >= 64:
        x[3, 32:64] = 1e-39  # a subnormal group: absmax / 127 under the floor
        x[3, 33] = -1e-39
    return x


@needs_quantize
@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("m,k", [(1, 32), (3, 64), (4, 96), (5, 640), (70, 2048), (130, 1152), (7, 32)])
def test_quantization_equals_the_reference_bit_for_bit(isa, m, k):
    x = _activations(m, k, seed=m * 31 + k)
    assert quantize_kernel("quantize_group32_rows", isa) is not None
    q, s = quantize_group32_cpu(x, isa)
    q_ref, s_ref = quantize_group32_ref(x)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    assert s.shape == (m, k // 32) and int(q.min()) >= -127
    if m > 2:
        assert q[2, :8].tolist() == [127, -127, 0, -2, 2, -4, 126, 0]  # half to even
        assert (q[1, :32] == 0).all() and s[1, 0] == SCALE_FLOOR
    if m > 3 and k >= 64:
        assert s[3, 1] == SCALE_FLOOR


@needs_quantize
@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_quantization_reads_strided_rows_splits_rows_over_threads_and_clamps_without_minus_128(isa):
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(80, 1100, generator=g) * 50
    x = wide[:, 30:1054]  # row stride 1100, 80 x 1024 (parallel over rows)
    x[0, :32] = -3.0  # the group's absmax negative only: -127, never -128
    x[1, :32] = torch.linspace(-1.0, 1.0, 32)  # +-absmax both there
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            q, s = quantize_group32_cpu(x, isa)
            q_ref, s_ref = quantize_group32_ref(x.contiguous())
            assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    finally:
        torch.set_num_threads(before)
    assert (q[0, :32] == -127).all() and q[1, 0] == -127 and q[1, 31] == 127 and int(q.min()) == -127
    # a row alone gets the bits it had among the others
    assert all(torch.equal(quantize_group32_cpu(x[i : i + 1], isa)[0], q[i : i + 1]) for i in (0, 41, 79))


def test_quantization_refuses_what_the_reference_refuses():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_group32_cpu(torch.randn(2, 48))
    q, s = quantize_group32_cpu(torch.randn(0, 64))  # no rows: the reference's empty result
    assert q.shape == (0, 64) and s.shape == (0, 2)


# ---- the GEMM ----


def _operands(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    a_scale = torch.rand(m, k // 32, generator=g) * torch.rand(m, 1, generator=g) + 1e-3
    w_scale = torch.randn(n, k // 32, generator=g) * torch.rand(n, k // 32, generator=g).add(0.01)
    return a, a_scale, w, w_scale


def _gemm(a, sa, w, sw, isa):
    got = w8a8_group32_cpu(a, sa, w, sw, isa="vnni", packed=True) if isa == "vnni-packed" else None
    if isa != "vnni-packed":
        got = w8a8_group32_cpu(a, sa, w, sw, isa=isa, packed=False)
    assert got is not None, "the C kernel declined a call it should take"
    return got


MS = [1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 65, 70, 128, 130]
NKS = [(1, 32), (7, 64), (17, 96), (33, 640), (200, 32)]


@needs_gemm
@each_gemm
@pytest.mark.parametrize("m", MS)
def test_gemm_equals_the_reference_bit_for_bit(isa, m):
    for n, k in NKS:
        a, sa, w, sw = _operands(m, n, k, seed=m * 10007 + n * 101 + k)
        assert torch.equal(_gemm(a, sa, w, sw, isa), w8a8_group32_ref(a, sa, w, sw)), (m, n, k)


@needs_gemm
@each_gemm
@pytest.mark.parametrize("m,n,k", [(1, 1153, 640), (8, 641, 2048), (5, 2049, 640), (64, 40, 2048), (150, 33, 2048)])
def test_gemm_of_engine_shapes_and_64_groups(isa, m, n, k):
    a, sa, w, sw = _operands(m, n, k, seed=m + n + k)
    assert torch.equal(_gemm(a, sa, w, sw, isa), w8a8_group32_ref(a, sa, w, sw))


@needs_gemm
@each_gemm
@pytest.mark.parametrize("m", [1, 4, 5, 70])
@pytest.mark.parametrize("a_value,w_value", [(127, 127), (-127, 127), (127, -128), (-127, -128)])
def test_gemm_extreme_values_and_scales_over_many_exponents(isa, m, a_value, w_value):
    """The largest products (|a| = 127 against w = -128): with unit scales the exact integer; with scales over
    many exponents (each group's scale product rounds) the reference's bits."""
    n, k = 19, 1024
    a = torch.full((m, k), a_value, dtype=torch.int8)
    w = torch.full((n, k), w_value, dtype=torch.int8)
    ones_a, ones_w = torch.ones(m, k // 32), torch.ones(n, k // 32)
    assert torch.equal(_gemm(a, ones_a, w, ones_w, isa), torch.full((m, n), float(k * a_value * w_value)))
    g = torch.Generator().manual_seed(m + a_value)
    sw = torch.exp2(torch.randint(-60, 61, (n, k // 32), generator=g).float()) * (
        1 + torch.rand(n, k // 32, generator=g)
    )
    sa = torch.exp2(torch.randint(-40, 41, (m, k // 32), generator=g).float()) * (
        1 + torch.rand(m, k // 32, generator=g)
    )
    assert torch.equal(_gemm(a, sa, w, sw, isa), w8a8_group32_ref(a, sa, w, sw))


@needs_gemm
@each_gemm
def test_gemm_of_zero_activations_keeps_the_references_negative_zeros(isa):
    """All-zero rows against negative weight scales: the contract starts from the first group's product (-0), not
    from +0 (0 + -0 = +0)."""
    a, sa, w, sw = _operands(5, 21, 96, seed=9)
    a[1:3] = 0
    sw[4] = -sw[4].abs()
    got, want = _gemm(a, sa, w, sw, isa), w8a8_group32_ref(a, sa, w, sw)
    assert torch.equal(got, want)
    assert torch.equal(got.signbit(), want.signbit()) and bool(want[1, 4].signbit())


@needs_gemm
@each_gemm
@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_thread_counts_and_batch_invariance(isa, threads):
    """Row i of a 130-row call (three prefill passes) equals the 1-row call of row i and the same row in smaller
    batches (the AVX2 kernel's pair layout at up to 4 rows, the VNNI kernel's decode cases at up to 16)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        a, sa, w, sw = _operands(130, 77, 640, seed=21 + threads)
        full = _gemm(a, sa, w, sw, isa)
        assert torch.equal(full, w8a8_group32_ref(a, sa, w, sw))
        for i in (0, 1, 63, 64, 100, 129):
            assert torch.equal(_gemm(a[i : i + 1], sa[i : i + 1], w, sw, isa), full[i : i + 1])
        for start, rows in ((0, 4), (10, 5), (60, 8), (100, 17)):
            part = slice(start, start + rows)
            assert torch.equal(_gemm(a[part], sa[part], w, sw, isa), full[part])
    finally:
        torch.set_num_threads(before)


@needs_gemm
@each_gemm
def test_gemm_reads_strided_rows_and_takes_per_row_weight_scales(isa):
    a, sa, w, sw = _operands(12, 19, 192, seed=8)
    rows = a[::3]  # row stride 576, contiguous columns
    assert torch.equal(_gemm(rows, sa[::3], w, sw, isa), w8a8_group32_ref(rows, sa[::3], w, sw))
    per_row = sw[:, 0].contiguous()  # one scale per row: the same scale in every group
    assert torch.equal(_gemm(a, sa, w, per_row, isa), w8a8_group32_ref(a, sa, w, per_row))


@needs_gemm
def test_gemm_declines_what_it_cannot_compute_and_the_family_op_takes_the_reference():
    a, sa, w, sw = _operands(3, 9, 64, seed=4)
    with pytest.raises(ValueError, match="a_scale"):
        w8a8_group32_cpu(a, sa[:, :1], w, sw)  # a scale per row is not the recipe
    with pytest.raises(ValueError, match="multiple of 32"):
        w8a8_group32_cpu(a[:, :48], sa[:, :1], w[:, :48], sw[:, :1])
    assert w8a8_group32_cpu(a[:0], sa[:0], w, sw) is None
    a[1, 5] = -128  # the AVX2 kernel's vpsignb cannot negate it: that build declines, the reference runs
    if "avx2" in GEMM_ISAS:
        assert w8a8_group32_cpu(a, sa, w, sw, isa="avx2", packed=False) is None
    assert torch.equal(w8a8_group32_gemm_cpu(a, sa, w, sw), w8a8_group32_ref(a, sa, w, sw))


# ---- the one-call Linear ----


def _linear_case(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g).mul(30).add(0.01)
    w_q = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    w_scale = torch.randn(n, k // 32, generator=g) * torch.rand(n, k // 32, generator=g).add(0.01) / 100
    return x, w_q, w_scale, torch.rand(k, generator=g) * 2, torch.rand(n, generator=g) * 2, torch.randn(m, n) * 5


def _options(norm, post, residual):
    for use_norm, use_post, use_res in itertools.product((False, True), repeat=3):
        yield dict(
            norm_weight=norm if use_norm else None,
            eps=EPS,
            post_norm=post if use_post else None,
            residual=residual if use_res else None,
        )


@pytest.mark.skipif(not LINEAR_ISAS, reason="needs x86-64 with AVX2 and cc")
@pytest.mark.parametrize("isa", LINEAR_ISAS)
@pytest.mark.parametrize(
    "m,n,k", [(1, 1152, 640), (2, 641, 2048), (3, 17, 64), (1, 1, 32), (9, 33, 96), (17, 200, 640), (MAX_ROWS, 48, 128)]
)
def test_one_call_linear_equals_the_reference_bit_for_bit(m, n, k, isa):
    x, w_q, w_scale, norm, post, residual = _linear_case(m, n, k, seed=m * 1000 + n + k)
    for opts in _options(norm, post, residual):
        got = linear_two_terms_c(x, w_q, w_scale, **opts, isa=isa, recipe="group32")
        assert got is not None, "the C call declined a call it should take"
        want = linear_group32_ref(x, w_q, w_scale, **opts)
        assert torch.equal(got, want), {key: v is not None for key, v in opts.items()}
        assert torch.equal(linear_group32_cpu(x, w_q, w_scale, **opts), want)


@pytest.mark.skipif(not LINEAR_ISAS, reason="needs x86-64 with AVX2 and cc")
@pytest.mark.parametrize("isa", LINEAR_ISAS)
@pytest.mark.parametrize("threads", [1, 2])
def test_one_call_linear_threads_strided_rows_and_batch_invariance(isa, threads):
    x, w_q, w_scale, norm, post, residual = _linear_case(19, 300, 640, seed=11)
    wide = torch.zeros(19, 700)
    wide[:, 30:670] = x
    opts = dict(norm_weight=norm, eps=EPS, post_norm=post, residual=residual)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:  # 19 rows (>= ROWS_PARALLEL): the rows' norm, quantization and post-norm split over the threads
        whole = linear_two_terms_c(wide[:, 30:670], w_q, w_scale, **opts, isa=isa, recipe="group32")
        rows = [
            linear_two_terms_c(
                x[i : i + 1], w_q, w_scale, **{**opts, "residual": residual[i : i + 1]}, isa=isa, recipe="group32"
            )
            for i in (0, 7, 18)
        ]
    finally:
        torch.set_num_threads(before)
    assert torch.equal(whole, linear_group32_ref(x, w_q, w_scale, **opts))
    assert all(torch.equal(row, whole[i : i + 1]) for row, i in zip(rows, (0, 7, 18)))


@pytest.mark.skipif(not LINEAR_ISAS, reason="needs x86-64 with AVX2 and cc")
def test_declined_calls_compose_the_cpu_kernels_with_the_same_bits():
    x, w_q, w_scale, norm, post, residual = _linear_case(MAX_ROWS + 6, 40, 64, seed=6)
    opts = dict(norm_weight=norm, eps=EPS, post_norm=post, residual=residual)
    assert linear_two_terms_c(x, w_q, w_scale, **opts, recipe="group32") is None  # more rows than MAX_ROWS
    assert torch.equal(linear_group32_cpu(x, w_q, w_scale, **opts), linear_group32_ref(x, w_q, w_scale, **opts))
    per_row = w_scale[:, 0].contiguous()  # per-row weight scales: the composition (the GEMM takes them)
    assert linear_two_terms_c(x[:2], w_q, per_row, recipe="group32") is None
    assert torch.equal(linear_group32_cpu(x[:2], w_q, per_row), linear_group32_ref(x[:2], w_q, per_row))
    assert torch.equal(composed_group32(x[:3], w_q, w_scale), linear_group32_ref(x[:3], w_q, w_scale))


def test_the_cpu_family_registers_the_one_call_op():
    ops = backend.select_ops("cpu", activations="group32")
    assert ops.linear_group32 is linear_group32_cpu and ops.activations == "group32"
    assert backend.select_ops("cpu", "ref").linear_group32 is linear_group32_ref


@pytest.mark.skipif("avx2" not in LINEAR_ISAS, reason="needs x86-64 with AVX2 and cc")
def test_with_avx512_masked_the_family_op_runs_the_avx2_build_with_the_same_bits():
    """SALON_CPU_ISA=avx2 (a process as on a CPU without AVX-512): the CPU family's op is the AVX2 build's C call."""
    script = (
        "import torch\n"
        "from salon.kernels.backend import select_ops\n"
        "from salon.kernels.cpu import linear_two_terms as lt, native\n"
        "from salon.kernels.linear_two_terms import linear_group32_ref\n"
        "assert native.cpu_isas() == ('avx2',)\n"
        "g = torch.Generator().manual_seed(3)\n"
        "x = torch.randn(5, 640, generator=g) * 7\n"
        "w = torch.randint(-128, 128, (300, 640), dtype=torch.int8, generator=g)\n"
        "s = torch.randn(300, 20, generator=g) / 100\n"
        "assert lt.entry(recipe='group32') is lt.library('avx2').linear_group32_avx2\n"
        "op = select_ops('cpu', activations='group32').linear_group32\n"
        "assert torch.equal(op(x, w, s), linear_group32_ref(x, w, s))\n"
        "print('avx2 ok')\n"
    )
    env = {**os.environ, native.CPU_ISA_ENV: "avx2", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "avx2 ok", done.stderr[-2000:]
