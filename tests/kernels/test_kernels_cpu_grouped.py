"""The group-scaled W8A8 kernels (salon/kernels/cpu/w8a8_grouped.c on AVX2, w8a8_grouped_vnni.c on AVX-512 VNNI, the
latter on the weights as they lie and on its packed copy), each one this CPU runs, against the grouped reference,
bit for bit: every shape, the AVX2 kernel's two layouts (M <= 4 and M > 4), the VNNI kernel's decode cases
(M <= 16) and 16-row blocks, the M_CHUNK passes of prefill, the thread split, batch invariance, and their place
in w8a8_gemm_cpu; the packed layout's bytes, and the packed copy's life (kept, repacked after an in-place
change, dropped with its weights). Scales are random floats over
many groups, so a fused multiply-add or a change in the order the groups are added changes the bits (checked
against mutated kernels by hand)."""

from __future__ import annotations

import gc
import platform
import shutil

import pytest
import torch

from salon.kernels.cpu import native
from salon.kernels.cpu import w8a8_grouped as grouped_cpu
from salon.kernels.cpu.w8a8_gemm import w8a8_gemm_cpu
from salon.kernels.cpu.w8a8_grouped import library, packed_weights, w8a8_grouped_scaled_cpu
from salon.kernels.w8a8_gemm import w8a8_gemm_ref
from salon.kernels.w8a8_grouped import GROUP, w8a8_grouped_scaled_ref

needs_kernel = pytest.mark.skipif(
    "avx2" not in native.cpu_isas() or library() is None, reason="needs x86-64 with AVX2 and cc"
)
ISAS = native.cpu_isas()
# "vnni-packed": the VNNI kernel on its packed copy of the weights (the default); "vnni": on the weights as they lie
each_isa = pytest.mark.parametrize("isa", (["vnni-packed"] if "vnni" in ISAS else []) + list(ISAS))
needs_vnni = pytest.mark.skipif("vnni" not in ISAS or library("vnni") is None, reason="needs AVX-512 VNNI and cc")


def _operands(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    a_scale = torch.rand(m, generator=g) + 1e-3
    # random signs and magnitudes: every group's product has its own rounding
    w_scale = torch.randn(n, k // GROUP, generator=g) * torch.rand(n, k // GROUP, generator=g).add(0.01)
    return a, a_scale, w, w_scale


def _call(a, sa, w, sw, isa):
    if isa == "vnni-packed":
        return w8a8_grouped_scaled_cpu(a, sa, w, sw, isa="vnni")
    return w8a8_grouped_scaled_cpu(a, sa, w, sw, isa=isa, packed=False)


def _run(a, sa, w, sw, isa):
    got = _call(a, sa, w, sw, isa)
    assert got is not None, "the C kernel declined a call it should take"
    return got


MS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 64, 130]
NS = [1, 7, 8, 9, 15, 16, 17, 64, 200]
KS = [32, 64, 96, 640]


@needs_kernel
@each_isa
@pytest.mark.parametrize("m", MS)
def test_matches_reference_bitwise(isa, m):
    for n in NS:
        for k in KS:
            a, sa, w, sw = _operands(m, n, k, seed=m * 10007 + n * 101 + k)
            assert torch.equal(_run(a, sa, w, sw, isa), w8a8_grouped_scaled_ref(a, sa, w, sw)), (m, n, k)


@needs_kernel
@each_isa
@pytest.mark.parametrize("m,n,k", [(4, 640, 2048), (8, 1536, 640), (7, 2048, 640), (200, 64, 2048)])
def test_engine_shapes_and_many_groups(isa, m, n, k):
    """Gemma-3-270M-like shapes: up to 64 groups per row, so an FMA or a reordered sum shows."""
    a, sa, w, sw = _operands(m, n, k, seed=m + n + k)
    assert torch.equal(_run(a, sa, w, sw, isa), w8a8_grouped_scaled_ref(a, sa, w, sw))


@needs_kernel
@each_isa
@pytest.mark.parametrize("m", [1, 4, 5, 70])  # both layouts and two prefill passes
@pytest.mark.parametrize("a_value,w_value", [(127, 127), (-127, 127), (127, -128), (-127, -128), (-127, -127)])
def test_extreme_values_are_exact(isa, m, a_value, w_value):
    """|w| = 128 against |a| = 127 is the largest pair vpmaddubsw sums (2 * 128 * 127 < 2^15); with unit scales
    the result is the exact integer, and with scales over many exponents it is still the reference's bits."""
    n, k = 11, 1024
    a = torch.full((m, k), a_value, dtype=torch.int8)
    w = torch.full((n, k), w_value, dtype=torch.int8)
    ones = torch.ones(n, k // GROUP)
    assert torch.equal(_run(a, torch.ones(m), w, ones, isa), torch.full((m, n), float(k * a_value * w_value)))
    g = torch.Generator().manual_seed(m)
    exponents = torch.randint(-60, 61, (n, k // GROUP), generator=g).to(torch.float32)
    sw = torch.exp2(exponents) * (1 + torch.rand(n, k // GROUP, generator=g))
    sa = torch.exp2(torch.randint(-30, 31, (m,), generator=g).to(torch.float32))
    assert torch.equal(_run(a, sa, w, sw, isa), w8a8_grouped_scaled_ref(a, sa, w, sw))


@needs_kernel
@each_isa
def test_random_values_with_scales_over_many_exponents(isa):
    a, sa, w, _ = _operands(6, 37, 960, seed=3)
    g = torch.Generator().manual_seed(4)
    exponents = torch.randint(-100, 101, (37, 30), generator=g).to(torch.float32)
    sw = torch.exp2(exponents) * torch.randn(37, 30, generator=g)
    assert torch.equal(_run(a, sa, w, sw, isa), w8a8_grouped_scaled_ref(a, sa, w, sw))


@needs_kernel
@each_isa
@pytest.mark.parametrize("threads", [1, 2])
def test_thread_count_does_not_change_results(isa, threads):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for m, n in ((3, 2), (8, 200), (65, 33)):  # fewer 8-row blocks than threads, too
            a, sa, w, sw = _operands(m, n, 320, seed=threads * 100 + m)
            assert torch.equal(_run(a, sa, w, sw, isa), w8a8_grouped_scaled_ref(a, sa, w, sw))
    finally:
        torch.set_num_threads(before)


@needs_kernel
@each_isa
def test_batch_invariance(isa):
    """Row i of an M-row call (the transposed layout, three prefill passes) equals the 1-row call of row i (the
    pair layout) and the same row in a 4-row call."""
    a, sa, w, sw = _operands(130, 77, 640, seed=21)
    full = _run(a, sa, w, sw, isa)
    for i in (0, 1, 63, 64, 100, 129):
        assert torch.equal(_run(a[i : i + 1], sa[i : i + 1], w, sw, isa), full[i : i + 1])
    for start, rows in ((0, 4), (10, 5), (60, 8), (120, 10)):
        assert torch.equal(
            _run(a[start : start + rows], sa[start : start + rows], w, sw, isa), full[start : start + rows]
        )


@needs_kernel
@each_isa
def test_strided_activation_rows_are_read_where_they_lie(isa):
    a, sa, w, sw = _operands(12, 19, 192, seed=8)
    rows = a[::3]  # row stride 576, contiguous columns
    assert torch.equal(_run(rows, sa[::3], w, sw, isa), w8a8_grouped_scaled_ref(rows, sa[::3], w, sw))


@needs_kernel
@each_isa
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k", [(5, 1024), (64, 2048), (65, 1024), (130, 2048)])
def test_aliasing_row_strides_and_super_blocks(isa, threads, m, k):
    """Row strides that are a multiple of 512 bytes (copied to a longer stride on AVX2), with more than one
    chunk of rows and 517 weight rows (65 blocks: several super blocks a thread, and a short last block)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        a, sa, w, sw = _operands(m, 517, k, seed=m * 7 + k + threads)
        assert torch.equal(_run(a, sa, w, sw, isa), w8a8_grouped_scaled_ref(a, sa, w, sw))
    finally:
        torch.set_num_threads(before)


@needs_kernel
@each_isa
def test_strided_rows_with_an_aliasing_stride_are_copied_whole(isa):
    """K = 640 of rows 1,024 bytes apart: the copy takes each row's K bytes from where it lies."""
    wide, sa, _, _ = _operands(70, 1, 1024, seed=41)
    _, _, w, sw = _operands(1, 33, 640, seed=42)
    rows = wide[:, :640]
    assert torch.equal(_run(rows, sa, w, sw, isa), w8a8_grouped_scaled_ref(rows, sa, w, sw))


@pytest.mark.parametrize("geglu", [False, True])
@pytest.mark.parametrize("m", [1, 6, 40])
def test_gemm_with_grouped_scales_matches_reference(m, geglu):
    a, sa, w, sw = _operands(m, 64, 640, seed=30 + m)
    bias, residual = torch.randn(64), torch.randn(m, 32 if geglu else 64)
    got = w8a8_gemm_cpu(a, sa, w, sw, bias=bias, residual=residual, geglu=geglu)
    assert torch.equal(got, w8a8_gemm_ref(a, sa, w, sw, bias=bias, residual=residual, geglu=geglu))


@each_isa
def test_activation_of_minus_128_is_exact_or_declined(isa):
    """VNNI takes -128 (the activations are vpdpbusd's signed operand); AVX2 declines it (vpsignb's negation
    wraps) and w8a8_gemm_cpu takes the reference: either way the result is the reference's."""
    a, sa, w, sw = _operands(5, 17, 96, seed=5)
    a[2, 40] = -128
    a[4, :] = -128
    got = _call(a, sa, w, sw, isa)
    if isa == "avx2":
        assert got is None
    else:
        assert torch.equal(got, w8a8_grouped_scaled_ref(a, sa, w, sw))
    assert torch.equal(w8a8_gemm_cpu(a, sa, w, sw), w8a8_gemm_ref(a, sa, w, sw))


def test_declines_what_it_does_not_handle():
    a, sa, w, sw = _operands(3, 8, 64, seed=6)
    assert w8a8_grouped_scaled_cpu(a[:, ::2], sa, w[:, ::2], sw[:, :1]) is None  # strided columns
    assert w8a8_grouped_scaled_cpu(a, sa, w.t().contiguous().t(), sw) is None  # weights not contiguous
    assert w8a8_grouped_scaled_cpu(a, sa[:2], w, sw) is None  # a_scale of the wrong length
    assert w8a8_grouped_scaled_cpu(a.to(torch.int16), sa, w, sw) is None  # not int8


def test_k_not_a_multiple_of_32_is_refused():
    a, sa, w, _ = _operands(2, 4, 48, seed=7)
    sw = torch.rand(4, 1)
    with pytest.raises(ValueError, match="multiple of 32"):
        w8a8_gemm_cpu(a, sa, w, sw)
    with pytest.raises(ValueError, match="multiple of 32"):
        w8a8_gemm_ref(a, sa, w, sw)
    with pytest.raises(ValueError, match="multiple of 32"):
        w8a8_grouped_scaled_cpu(a, sa, w, sw)


def test_this_x86_cpu_runs_the_kernel():
    """On an x86-64 CPU with AVX2 and a C compiler the kernel must load and take engine-like calls (a silent
    fallback to the reference would pass every test above while losing the fast path)."""
    if platform.machine() != "x86_64" or shutil.which("cc") is None or "avx2" not in native.cpu_flags():
        pytest.skip("not x86-64 with AVX2 and a C compiler")
    assert library() is not None
    for m in (1, 8, 256):
        a, sa, w, sw = _operands(m, 640, 2048, seed=12 + m)
        assert w8a8_grouped_scaled_cpu(a, sa, w, sw) is not None


def test_this_vnni_cpu_runs_the_vnni_kernel():
    """On a CPU with AVX-512 VNNI the default is the VNNI kernel (an AVX2 fallback would pass every test above
    at a quarter of the speed): it takes an activation of -128, which the AVX2 kernel declines."""
    if not {"avx512f", "avx512bw", "avx512_vnni"} <= native.cpu_flags() or shutil.which("cc") is None:
        pytest.skip("not an AVX-512 VNNI CPU with a C compiler")
    assert native.cpu_isas()[0] == "vnni" and library("vnni") is not None
    a, sa, w, sw = _operands(3, 40, 640, seed=13)
    a[1, 7] = -128
    assert torch.equal(w8a8_grouped_scaled_cpu(a, sa, w, sw), w8a8_grouped_scaled_ref(a, sa, w, sw))


def _layout(w: torch.Tensor, sw: torch.Tensor, scale_bytes: int) -> torch.Tensor:
    """w8a8_grouped_vnni_pack's layout built by hand from its description: a 64-byte header (magic "SLSVNNI1",
    scale bytes, N, K as int64), then per 16-row block its units: one group's weights and float32 scales, or two
    groups' weights and then their float16 scales (an odd last group alone, then 32 bytes of zeros). A group's
    weights: vector i lane r = w[16b + r, 32g + 4i .. 32g + 4i + 3] XOR 0x80 (8 x 64 bytes); its scales: the 16
    rows'. A short block's missing rows repeat its first row."""
    n, k = w.shape
    header = torch.tensor([int.from_bytes(b"SLSVNNI1", "little"), scale_bytes, n, k], dtype=torch.int64)
    out = [header.view(torch.uint8), torch.zeros(32, dtype=torch.uint8)]
    dtype, unit = (torch.float32, 1) if scale_bytes == 4 else (torch.float16, 2)
    groups = k // GROUP
    for b in range(-(-n // 16)):
        rows = [16 * b + r if 16 * b + r < n else 16 * b for r in range(16)]
        for u in range(0, groups, unit):
            members = range(u, min(u + unit, groups))
            for g in members:
                tile = w[rows, GROUP * g : GROUP * (g + 1)].view(torch.uint8) ^ 0x80  # [16 rows, 32 channels]
                out.append(tile.reshape(16, 8, 4).permute(1, 0, 2).reshape(-1))  # vector i: channels 4i .. 4i+3
            out += [sw[rows, g].to(dtype).contiguous().view(torch.uint8) for g in members]
            if len(members) < unit:
                out.append(torch.zeros(32, dtype=torch.uint8))
    return torch.cat(out)


@needs_vnni
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("n,k", [(1, 32), (16, 64), (17, 96), (40, 640), (33, 160)])
def test_packed_layout_bytes(n, k, half):
    """float16 scales where every scale is one exactly (the token table's, from the GGUF), float32 otherwise."""
    _, _, w, sw = _operands(1, n, k, seed=n + k)
    if half:
        sw = sw.to(torch.float16).to(torch.float32)
    got = packed_weights(w, sw)
    assert got.dtype == torch.uint8 and torch.equal(got, _layout(w, sw, 2 if half else 4))


@needs_vnni
@pytest.mark.parametrize("m", [1, 2, 5, 16, 17, 70])
def test_packed_float16_scales_give_the_reference_bits(m):
    a, sa, w, sw = _operands(m, 517, 640, seed=m + 60)
    sw = sw.to(torch.float16).to(torch.float32)  # every scale a float16: packed with float16 scales
    got = _run(a, sa, w, sw, "vnni-packed")
    assert packed_weights(w, sw).numel() == 64 + 33 * 20 * (512 + 32)
    assert torch.equal(got, w8a8_grouped_scaled_ref(a, sa, w, sw))


@needs_vnni
def test_packed_copy_is_kept_repacked_after_an_in_place_change_and_dropped_with_its_weights():
    a, sa, w, sw = _operands(3, 50, 640, seed=51)
    first = packed_weights(w, sw)
    assert packed_weights(w, sw) is first
    assert first.numel() == 64 + 4 * 20 * 576  # header, 4 blocks of 16 rows (the last one short), 20 groups
    assert grouped_cpu.packed_bytes() >= first.numel()
    w[7, 100] = -w[7, 100] - 1  # in place: the next call packs again
    assert torch.equal(_run(a, sa, w, sw, "vnni-packed"), w8a8_grouped_scaled_ref(a, sa, w, sw))
    assert packed_weights(w, sw) is not first
    sw[49, 3] *= -3.0
    assert torch.equal(_run(a, sa, w, sw, "vnni-packed"), w8a8_grouped_scaled_ref(a, sa, w, sw))
    other = sw.clone()  # equal values, another tensor: packed for it
    assert packed_weights(w, other) is not packed_weights(w, sw)
    key = id(w)
    assert key in grouped_cpu._packed
    del w
    gc.collect()
    assert key not in grouped_cpu._packed


def test_packed_weights_decline_what_the_layout_does_not_hold():
    _, _, w, sw = _operands(1, 8, 64, seed=52)
    assert packed_weights(w, sw[:, :1].contiguous()) is None  # not grouped scales of these weights
    assert packed_weights(w[:, ::2], sw[:, :1]) is None  # not contiguous
    assert packed_weights(w.to(torch.int16), sw) is None
    assert packed_weights(w, sw.double()) is None


@needs_vnni
def test_weights_kept_in_rows_are_never_packed():
    a, sa, w, sw = _operands(2, 20, 640, seed=53)
    grouped_cpu.keep_rows(w)
    assert packed_weights(w, sw) is None
    assert torch.equal(_run(a, sa, w, sw, "vnni-packed"), w8a8_grouped_scaled_ref(a, sa, w, sw))
    other = w.clone()  # the same values in another tensor: packed as usual
    assert packed_weights(other, sw) is not None
    key = id(w)
    del w
    gc.collect()
    assert key not in grouped_cpu._rows
