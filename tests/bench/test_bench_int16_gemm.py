"""The int16-activation probe (bench/int16_gemm.c) against its reference, bit for bit: full int16 and int8
ranges (group sums above 2^24, where the float conversion rounds), rows not a multiple of its 4-row step,
short last weight blocks, strided rows and any thread count; and what it declines."""

import pytest
import torch

from bench.int16_gemm import probe_available, w16a8_grouped_probe, w16a8_grouped_ref

needs_probe = pytest.mark.skipif(not probe_available(), reason="needs x86-64 with AVX2 and cc")


def _case(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-32768, 32768, (m, k), dtype=torch.int16, generator=g)
    a[0, :32] = 32767 - torch.arange(32, dtype=torch.int16)  # row 0, weight row 0, group 0: a sum of 133,069,329,
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    w[0, :32] = 127  # above 2^24 and odd, so float32 cannot hold it: the conversion's rounding is exercised
    w[0, 0] = 126
    ws = torch.rand(n, k // 32, generator=g) / 100 + 1e-4
    a_s = torch.rand(m, generator=g) + 1e-3
    return a, a_s, w, ws


@needs_probe
@pytest.mark.parametrize("m,n,k", [(1, 8, 32), (3, 13, 64), (4, 16, 640), (7, 41, 96), (9, 640, 2048),
                                   (17, 4096, 64)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_probe_equals_the_reference_bit_for_bit(m, n, k, threads):
    a, a_s, w, ws = _case(m, n, k, seed=m * 100 + n + k)
    want = w16a8_grouped_ref(a, a_s, w, ws)
    assert torch.equal(w16a8_grouped_probe(a, a_s, w, ws, threads), want)
    acc = int(a[0, :32].long() @ w[0, :32].long())
    assert acc == 133_069_329 and float(torch.tensor(acc, dtype=torch.float32)) != acc


@needs_probe
def test_strided_rows_and_declined_shapes():
    a, a_s, w, ws = _case(6, 24, 128, seed=3)
    wide = torch.zeros(6, 200, dtype=torch.int16)
    wide[:, 40:168] = a
    assert torch.equal(w16a8_grouped_probe(wide[:, 40:168], a_s, w, ws, 2), w16a8_grouped_ref(a, a_s, w, ws))
    with pytest.raises(ValueError):
        w16a8_grouped_probe(a.to(torch.int32), a_s, w, ws)
    with pytest.raises(ValueError):
        w16a8_grouped_probe(a[:, :100], a_s, w[:, :100].contiguous(), ws[:, :3].contiguous())
