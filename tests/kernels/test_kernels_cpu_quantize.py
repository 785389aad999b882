"""The C quantization paths (salon/kernels/cpu/quantize.py, kv_write.py) against the references, bit for bit, in
every build of quantize.c this CPU runs (AVX-512 and AVX2 + FMA, or AVX2 + FMA alone)."""

from __future__ import annotations

import pytest
import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.kv_write import kv_write_cpu
from salon.kernels.cpu.quantize import (
    kernel,
    quantize_int16_cpu,
    quantize_per_token_cpu,
    quantize_two_terms_cpu,
    rmsnorm_quant_cpu,
)
from salon.kernels.kv_write import kv_write_ref
from salon.kernels.quantize import SCALE_FLOOR, quantize_per_token_ref, quantize_two_terms_ref, rmsnorm_quant_ref
from salon.kernels.w16a8_grouped import quantize_int16_ref

ISAS = native.simd_isas()
pytestmark = pytest.mark.skipif(not ISAS, reason="no C quantization kernel for this CPU (needs AVX-512 or AVX2 + FMA)")
each_isa = pytest.mark.parametrize("isa", ISAS)


def test_the_c_kernel_loads():
    assert all(kernel(name, isa) is not None for name in ("quantize_rows", "kv_write_rows") for isa in ISAS)


def rows(m, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m)[:, None]
    if m > 2:
        x[1] = 0.0  # an all-zero row: scale floors, values 0
        x[2, : min(k, 5)] = torch.tensor([127.0, -63.5, 0.5, -1.5, 2.5])[: min(k, 5)]  # exact ties: half to even
    return x


def same(got, ref) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


@each_isa
@pytest.mark.parametrize(
    "m,k",
    [
        (1, 1),
        (3, 7),
        (3, 15),
        (4, 16),
        (5, 17),
        (2, 31),
        (3, 33),
        (33, 640),
        (7, 2049),
        (2, 262),
        (1, 8),
        (2, 9),
        (4, 32),
        (3, 95),
    ],
)
def test_quantize_per_token_is_bit_identical(isa, m, k):
    x = rows(m, k, seed=m * 100 + k)
    assert same(quantize_per_token_cpu(x, isa), quantize_per_token_ref(x))


@each_isa
def test_ties_round_half_to_even_in_every_lane(isa):
    # absmax 127 -> scale 1: every x.5 is a tie, in the vector body (first 32), the 8-wide loop and the tail
    halves = torch.arange(-126, 127, dtype=torch.float32) + 0.5
    x = torch.cat([torch.tensor([127.0]), halves])[None].repeat(3, 1)
    x[1] = x[1].flip(0)
    x[2] = -x[2]
    q, s = quantize_per_token_cpu(x, isa)
    assert torch.equal(s, torch.ones(3))
    assert same((q, s), quantize_per_token_ref(x))


@each_isa
@pytest.mark.parametrize("k", [3, 8, 40, 641])
def test_tiny_and_huge_rows(isa, k):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(7, k, generator=g)
    x[0] = 0.0  # all zeros: the scale floor, zeros
    x[1] *= 1e-40  # subnormal values: absmax / 127 below the floor
    x[2] = x[2] / x[2].abs().max() * 100 * SCALE_FLOOR  # absmax 100 floors: the floor still wins
    x[3] = x[3] / x[3].abs().max() * 200 * SCALE_FLOOR  # absmax 200 floors: just above it
    x[4] = x[4] / x[4].abs().max() * torch.finfo(torch.float32).max  # +-FLT_MAX
    x[5, -1] = -3.0e38  # one huge value at the tail: every other value rounds to 0
    x[6] = -0.0
    q, s = quantize_per_token_cpu(x, isa)
    assert s[0] == SCALE_FLOOR and s[1] == SCALE_FLOOR and s[2] == SCALE_FLOOR and s[3] > SCALE_FLOOR
    assert same((q, s), quantize_per_token_ref(x))


@each_isa
@pytest.mark.parametrize("start,stop", [(10, 250), (3, 290), (1, 18), (5, 6)])
def test_quantize_reads_strided_rows(isa, start, stop):
    x = rows(6, 300, seed=1)[:, start:stop]  # row stride 300, rows not 32-byte aligned, odd tails
    assert same(quantize_per_token_cpu(x, isa), quantize_per_token_ref(x))


def test_rmsnorm_quant_is_bit_identical():
    x = rows(9, 640, seed=2)
    w = torch.rand(640, generator=torch.Generator().manual_seed(3)) + 0.5
    assert same(rmsnorm_quant_cpu(x, w, 1e-6), rmsnorm_quant_ref(x, w, 1e-6))


@each_isa
@pytest.mark.parametrize("t,h,d", [(1, 1, 256), (5, 2, 17), (40, 1, 256), (3, 4, 64), (6, 3, 7), (2, 2, 41)])
def test_kv_write_is_bit_identical(isa, t, h, d):
    g = torch.Generator().manual_seed(t * 10 + h)
    k, v = torch.randn(t, h, d, generator=g) * 4, torch.randn(t, h, d, generator=g)
    k[0, 0] = 0.0  # a zero row: the scale floor
    num_blocks, bs = 9, 8
    slots = torch.randperm(num_blocks * bs, generator=g)[:t]
    caches = [
        torch.zeros(num_blocks, bs, h, d, dtype=torch.int8),
        torch.zeros(num_blocks, bs, h, d, dtype=torch.int8),
        torch.zeros(num_blocks, bs, h),
        torch.zeros(num_blocks, bs, h),
    ]
    expected = [c.clone() for c in caches]
    kv_write_cpu(k, v, *caches, slots, isa=isa)
    kv_write_ref(k, v, *expected, slots)
    assert same(caches, expected)


@each_isa
def test_kv_write_takes_strided_k_and_v(isa):
    qkv = torch.randn(5, 4 + 2 + 2, 24, generator=torch.Generator().manual_seed(6))  # [T, Hq + 2 Hkv, D]
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    slots = torch.tensor([7, 0, 3, 12, 5])
    caches = [
        torch.zeros(2, 8, 2, 24, dtype=torch.int8),
        torch.zeros(2, 8, 2, 24, dtype=torch.int8),
        torch.zeros(2, 8, 2),
        torch.zeros(2, 8, 2),
    ]
    expected = [c.clone() for c in caches]
    kv_write_cpu(k, v, *caches, slots, isa=isa)
    kv_write_ref(k, v, *expected, slots)
    assert same(caches, expected)


@each_isa
def test_results_do_not_depend_on_threads(isa):
    x = rows(300, 640, seed=4)  # large enough for the parallel loop
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = quantize_per_token_cpu(x, isa)
        torch.set_num_threads(2)
        two = quantize_per_token_cpu(x, isa)
    finally:
        torch.set_num_threads(before)
    assert same(one, two) and same(one, quantize_per_token_ref(x))


@pytest.mark.parametrize("m,k", [(1, 1), (3, 7), (4, 16), (5, 17), (3, 33), (33, 640), (7, 2049), (130, 640)])
@pytest.mark.parametrize("threads", [1, 2])
def test_quantize_two_terms_is_bit_identical(m, k, threads):
    assert kernel("quantize_two_terms_rows", "avx2") is not None
    x = rows(m, k, seed=m * 1000 + k)
    x = x + 1e-3 * torch.randn(m, k, generator=torch.Generator().manual_seed(k)) * x.abs().amax(-1, keepdim=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = quantize_two_terms_cpu(x)
    finally:
        torch.set_num_threads(before)
    assert same(got, quantize_two_terms_ref(x))
    q, s = got
    assert q.shape == (2 * m, k) and torch.equal(q[:m], quantize_per_token_ref(x)[0])
    # the second term quantizes what the first left: x is within half a step of the second term's grid, plus
    # the float32 roundings of q1 * s1 and of the residual (an ulp of x each)
    d = q.double() * s.double()[:, None]
    ulp = x.abs().double() * 2.0**-23
    assert ((d[:m] + d[m:] - x.double()).abs() <= 0.5 * s[m:, None].double() + 2 * ulp).all()


@pytest.mark.parametrize("m,k", [(1, 1), (3, 7), (4, 15), (4, 16), (5, 17), (3, 33), (33, 640), (7, 2049), (130, 640)])
@pytest.mark.parametrize("threads", [1, 2])
def test_quantize_int16_is_bit_identical(m, k, threads):
    """salon.kernels.w16a8_grouped's recipe: every tail length of the 16-wide loop, zero rows (the floor), rows of
    every magnitude; the int16 grid is within about half a step of x."""
    assert kernel("quantize_int16_rows", "avx2") is not None
    x = rows(m, k, seed=m * 100 + k)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = quantize_int16_cpu(x)
    finally:
        torch.set_num_threads(before)
    assert same(got, quantize_int16_ref(x))
    q, s = got
    assert q.dtype == torch.int16 and q.abs().max() <= 32767
    # half a step, plus the float32 rounding of x / scale (up to 32767 * 2^-24 of a step)
    assert ((q.double() * s.double()[:, None] - x.double()).abs() <= (0.5 + 2.0**-9) * s.double()[:, None]).all()


def test_quantize_int16_ties_round_half_to_even_and_reads_strided_rows():
    x = torch.zeros(2, 40)
    x[:, 0] = 32767.0  # scale 1: the quotients are the values themselves
    x[0, 1:9] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 32766.5, -32765.5])
    x[1, 20:24] = torch.tensor([3.5, 4.5, -3.5, -4.5])
    q, s = quantize_int16_cpu(x)
    assert torch.equal(s, torch.ones(2))
    assert q[0, 1:9].tolist() == [0, 2, 2, 0, -2, -2, 32766, -32766]
    assert q[1, 20:24].tolist() == [4, 4, -4, -4]
    wide = torch.zeros(2, 100)
    wide[:, 30:70] = x
    assert same(quantize_int16_cpu(wide[:, 30:70]), quantize_int16_ref(x))
