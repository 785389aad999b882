"""The VNNI grouped GEMM's AMX tiles (salon/kernels/cpu/w8a8_grouped_vnni.c): on a CPU with AMX-INT8 whose kernel
grants the tile state, calls on packed weights of more than amx_min_rows() activation rows (63 by default) take their
int32 sums from the tile unit -- bit for bit the references and the VNNI loops. The tests lower the threshold to 0 so
that every shape runs on the tiles: both contracts (group32's scale per row and group, the grouped GEMM's per row),
float32 and float16 weight scales, full and short 16-row chunks (the decode prefetch distances up to 16 rows),
short last weight blocks, odd group counts, the extreme int8 values, one to three threads, the rescored output
projection's selection. At the default threshold and with the switch off the calls stay on VNNI (the call counter
says which ran); SALON_CPU_AMX=0 keeps a process off AMX. Skipped where there is no AMX."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from salon.kernels.cpu.linear_two_terms import library as linear_library
from salon.kernels.cpu.linear_two_terms import linear_rescored_c
from salon.kernels.cpu.w8a8_group32 import w8a8_group32_cpu
from salon.kernels.cpu.w8a8_grouped import AMX_ENV, amx_calls, amx_min_rows, use_amx, w8a8_grouped_scaled_cpu
from salon.kernels.linear_rescored import linear_rescored_ref, row_bounds
from salon.kernels.w8a8_group32 import w8a8_group32_ref
from salon.kernels.w8a8_grouped import w8a8_grouped_scaled_ref


@pytest.fixture
def amx(monkeypatch):
    """AMX on for the test at every row count (skipped where it cannot be): yields the default threshold; the
    process's state and environment restored after."""
    monkeypatch.setenv(AMX_ENV, os.environ.get(AMX_ENV, "1"))
    before = use_amx()
    if not use_amx(True):
        use_amx(before)
        pytest.skip("needs AMX (AMX-INT8 and a kernel that grants the tile state)")
    linear_library()  # loaded before the threshold is set: it holds the kernel too
    default = amx_min_rows(0)
    yield default
    amx_min_rows(default)
    use_amx(before)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def operands(m: int, n: int, k: int, seed: int, half: bool = False):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s_w = (torch.rand(n, k // 32, generator=g) + 0.05) * 2.0 ** torch.randint(-9, -4, (n, k // 32), generator=g)
    if half:  # every scale a float16: packed with float16 scales
        s_w = s_w.to(torch.float16).to(torch.float32)
    s_a32 = torch.rand(m, k // 32, generator=g) * 2.0 ** torch.randint(-6, 2, (m, k // 32), generator=g)
    s_a = torch.rand(m, generator=g) + 0.01
    return a, w, s_w, s_a32, s_a


def both_contracts(a, w, s_w, s_a32, s_a):
    return w8a8_group32_cpu(a, s_a32, w, s_w), w8a8_grouped_scaled_cpu(a, s_a, w, s_w)


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("m", [1, 5, 8, 15, 16, 17, 31, 33, 64, 70, 100])
@pytest.mark.parametrize("n, k", [(517, 640), (40, 2048), (17, 96)])
def test_amx_calls_give_the_references_bits(amx, m, n, k, half):
    a, w, s_w, s_a32, s_a = operands(m, n, k, seed=m * 31 + n + k + half, half=half)
    calls = amx_calls()
    got32, got = both_contracts(a, w, s_w, s_a32, s_a)
    assert amx_calls() == calls + 2  # both ran on the tiles
    assert same_bits(got32, w8a8_group32_ref(a, s_a32, w, s_w))
    assert same_bits(got, w8a8_grouped_scaled_ref(a, s_a, w, s_w))
    use_amx(False)
    assert all(same_bits(x, y) for x, y in zip(both_contracts(a, w, s_w, s_a32, s_a), (got32, got)))
    assert amx_calls() == calls + 2  # off: the VNNI loops


def test_the_extreme_values_sum_exactly(amx):
    """Every activation -128 against weights of -128 and 127: the largest sums the int32 lanes hold, the correction
    for the unsigned weights at its largest."""
    a, w, s_w, s_a32, s_a = operands(20, 64, 640, seed=3)
    a.fill_(-128)
    w[::2] = -128
    w[1::2] = 127
    got32, got = both_contracts(a, w, s_w, s_a32, s_a)
    assert same_bits(got32, w8a8_group32_ref(a, s_a32, w, s_w))
    assert same_bits(got, w8a8_grouped_scaled_ref(a, s_a, w, s_w))


@pytest.mark.parametrize("threads", [1, 3])
def test_the_thread_split_keeps_the_bits(amx, threads, request):
    a, w, s_w, s_a32, s_a = operands(40, 1000, 640, seed=11)
    before = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(before))
    torch.set_num_threads(threads)
    assert same_bits(w8a8_group32_cpu(a, s_a32, w, s_w), w8a8_group32_ref(a, s_a32, w, s_w))


def test_the_rows_threshold(amx):
    """By default calls of up to 63 rows stay on VNNI and calls of 64 run on the tiles, the same bits."""
    assert amx == 63
    amx_min_rows(amx)
    a, w, s_w, s_a32, _ = operands(64, 300, 640, seed=5)
    calls = amx_calls()
    for m, tiles in ((63, 0), (64, 1)):
        got = w8a8_group32_cpu(a[:m], s_a32[:m], w, s_w)
        assert same_bits(got, w8a8_group32_ref(a[:m], s_a32[:m], w, s_w)), m
        assert amx_calls() == calls + tiles, m


@pytest.mark.parametrize("m, n, k", [(12, 4099, 96), (16, 20000, 640), (32, 50, 160)])
def test_the_rescored_projection_keeps_its_bits_and_argmax(amx, m, n, k):
    """The selection's epilogue runs inside the tiles' block loop, the candidates' two-term tiles after it on VNNI."""
    g = torch.Generator().manual_seed(m + n)
    x = torch.randn(m, k, generator=g)
    w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    w_scale = (torch.rand(n, k // 32, generator=g) + 0.05) * 2.0**-7
    bounds = row_bounds(w_q, w_scale)
    want = linear_rescored_ref(x, w_q, w_scale, bounds)
    argmax = torch.full((m,), -7, dtype=torch.int64)
    calls = amx_calls()
    got = linear_rescored_c(x, w_q, w_scale, bounds, argmax)
    assert amx_calls() == calls + 1
    assert same_bits(got, want)
    assert argmax.tolist() == want.argmax(-1).tolist()


@pytest.mark.parametrize("value, want", [("0", "False"), ("1", "True")])
def test_the_environment_switch(amx, value, want):
    code = "from salon.kernels.cpu.w8a8_grouped import use_amx; print(use_amx())"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, AMX_ENV: value}, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == want
