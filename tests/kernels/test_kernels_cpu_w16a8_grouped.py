"""The int16-activation group-scaled GEMM (salon/kernels/cpu/w16a8_grouped.c) against salon.kernels.w16a8_grouped's
reference,
bit for bit: both layouts (M <= 8 pairs, M > 8 transposed) and the 64-row chunks of prefill, short last weight
blocks, K of one group to 64 groups (the group-major copy of rows 2 and 4 KB long among them), 1 to 3 threads,
strided rows, group sums above 2^24 that float32 must round, the extremes of both ranges, batch invariance; and
what it declines. The scales are random floats with random signs over many groups, so a fused multiply-add, a
group added out of order or a product off by one changes the bits."""

from __future__ import annotations

import pytest
import torch

from salon.kernels.cpu.w16a8_grouped import library, w16a8_grouped_cpu
from salon.kernels.w16a8_grouped import w16a8_grouped_ref

needs_kernel = pytest.mark.skipif(library() is None, reason="needs x86-64 with AVX2 and cc")

MS = [1, 2, 3, 4, 5, 8, 9, 17, 64, 65, 130]
KS = [32, 96, 640, 1024, 2048]


def _operands(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-32767, 32768, (m, k), dtype=torch.int16, generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    a_scale = torch.rand(m, generator=g) + 1e-3
    w_scale = torch.randn(n, k // 32, generator=g) * torch.rand(n, k // 32, generator=g).add(0.01)
    return a, a_scale, w, w_scale


def _run(a, a_scale, w, w_scale, threads=None):
    got = w16a8_grouped_cpu(a, a_scale, w, w_scale, threads)
    assert got is not None, "the C kernel declined a call it should take"
    return got


@needs_kernel
@pytest.mark.parametrize("m", MS)
def test_matches_reference_bitwise(m):
    for k in KS:
        n = 13 if k >= 1024 else 37  # a short last block of 5 rows
        a, sa, w, sw = _operands(m, n, k, seed=m * 1009 + k)
        assert torch.equal(_run(a, sa, w, sw), w16a8_grouped_ref(a, sa, w, sw)), (m, n, k)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 8, 9, 130])
def test_any_thread_count(m, threads):
    for n in (1, 8, 9, 31, 200):
        a, sa, w, sw = _operands(m, n, 96, seed=m * 31 + n)
        assert torch.equal(_run(a, sa, w, sw, threads), w16a8_grouped_ref(a, sa, w, sw)), (m, n, threads)


@needs_kernel
@pytest.mark.parametrize("m", [1, 3, 8, 9, 70])
def test_extremes_and_rounded_group_sums(m):
    """Activations of +-32767 against weights of +-127 and -128 (the largest products and sums), and one group
    sum above 2^24 that is odd, so its conversion to float32 rounds (to nearest even)."""
    a, sa, w, sw = _operands(m, 24, 640, seed=m)
    a[:, 32:64] = 32767
    a[:, 64:96] = -32767
    a[:, 96:128] = torch.where(torch.arange(32) % 2 == 0, 32767, -32767).to(torch.int16)
    w[:8, 32:128] = -128
    w[8:16, 32:128] = 127
    w[16:, 32:128] = -127
    a[0, :32] = 32767 - torch.arange(32, dtype=torch.int16)  # against w[0, :32] = 126, 127, ..., 127:
    w[0, :32] = 127  # 133,069,329, odd and above 2^24
    w[0, 0] = 126
    acc = int(a[0, :32].long() @ w[0, :32].long())
    assert acc == 133_069_329 and float(torch.tensor(acc, dtype=torch.float32)) != acc
    assert torch.equal(_run(a, sa, w, sw), w16a8_grouped_ref(a, sa, w, sw))


@needs_kernel
@pytest.mark.parametrize("m", [2, 8, 9, 66])
def test_strided_rows(m):
    a, sa, w, sw = _operands(m, 19, 1024, seed=m + 7)
    wide = torch.zeros(m, 1024 + 96, dtype=torch.int16)
    wide[:, 40:1064] = a
    assert torch.equal(_run(wide[:, 40:1064], sa, w, sw, 2), w16a8_grouped_ref(a, sa, w, sw))
    # every other row of a taller tensor: a stride of 2048 int16 (4 KB)
    tall = torch.zeros(2 * m, 1024, dtype=torch.int16)
    tall[::2] = a
    assert torch.equal(_run(tall[::2], sa, w, sw), w16a8_grouped_ref(a, sa, w, sw))


@needs_kernel
def test_batch_invariance():
    """Row r of an M-row call has the bits of the 1-row call of row r, through every layout and chunk."""
    a, sa, w, sw = _operands(130, 21, 640, seed=11)
    alone = torch.cat([_run(a[r : r + 1], sa[r : r + 1], w, sw) for r in range(130)])
    for m in (2, 3, 4, 5, 8, 9, 64, 65, 130):
        assert torch.equal(_run(a[:m], sa[:m], w, sw), alone[:m]), m


@needs_kernel
def test_declined_calls():
    a, sa, w, sw = _operands(3, 16, 64, seed=5)
    assert w16a8_grouped_cpu(a.to(torch.int32), sa, w, sw) is None
    assert w16a8_grouped_cpu(a, sa, w.to(torch.int16), sw) is None
    assert w16a8_grouped_cpu(a[:0], sa[:0], w, sw) is None
    assert w16a8_grouped_cpu(torch.zeros(3, 128, dtype=torch.int16)[:, ::2], sa, w, sw) is None
    assert w16a8_grouped_cpu(a, sa, torch.zeros(16, 128, dtype=torch.int8)[:, ::2], sw) is None
    assert w16a8_grouped_cpu(a, sa, w, torch.zeros(2, 16).T) is None
    assert w16a8_grouped_cpu(a, sa[:2], w, sw) is None
    assert w16a8_grouped_cpu(a.to("meta"), sa, w, sw) is None
    with pytest.raises(ValueError):
        w16a8_grouped_cpu(a[:, :48], sa, w[:, :48].contiguous(), sw[:, :1].contiguous())
    with pytest.raises(ValueError):
        w16a8_grouped_cpu(a, sa, w, sw[:, :1].contiguous())
    with pytest.raises(ValueError):
        w16a8_grouped_cpu(a, sa, w[:, :32].contiguous(), sw)


@needs_kernel
def test_the_c_entry_point_refuses_what_it_cannot_compute():
    lib = library()
    a = torch.ones(2, 64, dtype=torch.int16)
    w = torch.ones(8, 64, dtype=torch.int8)
    ws, sa, out = torch.ones(8, 2), torch.ones(2), torch.full((2, 8), 7.0)

    def call(m, n, k):
        return lib.w16a8_grouped_avx2(
            a.data_ptr(), 64, w.data_ptr(), ws.data_ptr(), out.data_ptr(), 8, sa.data_ptr(), m, n, k, 1
        )

    for m, n, k in ((0, 8, 64), (2, 0, 64), (2, 8, 0), (2, 8, 48), (2, 8, 16), (6, 8, -32)):
        assert call(m, n, k) == 1, (m, n, k)
    assert torch.all(out == 7.0)
    assert call(2, 8, 64) == 0 and torch.all(out == 64.0)
