"""The C quantization paths (kernels/cpu/quantize.py, kv_write.py) against the references, bit for bit."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import native
from kernels.cpu.kv_write import kv_write_cpu
from kernels.cpu.quantize import library, quantize_per_token_cpu, rmsnorm_quant_cpu
from kernels.kv_write import kv_write_ref
from kernels.quantize import quantize_per_token_ref, rmsnorm_quant_ref

pytestmark = pytest.mark.skipif(not native.has_avx512(), reason="the C quantization kernels need AVX-512")


def test_the_c_kernel_loads():
    assert library() is not None


def rows(m, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m)[:, None]
    if m > 2:
        x[1] = 0.0  # an all-zero row: scale floors, values 0
        x[2, : min(k, 5)] = torch.tensor([127.0, -63.5, 0.5, -1.5, 2.5])[: min(k, 5)]  # exact ties: half to even
    return x


@pytest.mark.parametrize("m,k", [(1, 1), (3, 15), (4, 16), (5, 17), (33, 640), (7, 2049), (2, 262)])
def test_quantize_per_token_is_bit_identical(m, k):
    x = rows(m, k, seed=m * 100 + k)
    q, s = quantize_per_token_cpu(x)
    q_ref, s_ref = quantize_per_token_ref(x)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)


def test_quantize_reads_strided_rows():
    x = rows(6, 300, seed=1)[:, 10:250]
    assert all(torch.equal(a, b) for a, b in zip(quantize_per_token_cpu(x), quantize_per_token_ref(x)))


def test_rmsnorm_quant_is_bit_identical():
    x = rows(9, 640, seed=2)
    w = torch.rand(640, generator=torch.Generator().manual_seed(3)) + 0.5
    assert all(torch.equal(a, b) for a, b in zip(rmsnorm_quant_cpu(x, w, 1e-6), rmsnorm_quant_ref(x, w, 1e-6)))


@pytest.mark.parametrize("t,h,d", [(1, 1, 256), (5, 2, 17), (40, 1, 256), (3, 4, 64)])
def test_kv_write_is_bit_identical(t, h, d):
    g = torch.Generator().manual_seed(t * 10 + h)
    k, v = torch.randn(t, h, d, generator=g) * 4, torch.randn(t, h, d, generator=g)
    num_blocks, bs = 9, 8
    slots = torch.randperm(num_blocks * bs, generator=g)[:t]
    caches = [torch.zeros(num_blocks, bs, h, d, dtype=torch.int8), torch.zeros(num_blocks, bs, h, d, dtype=torch.int8),
              torch.zeros(num_blocks, bs, h), torch.zeros(num_blocks, bs, h)]
    expected = [c.clone() for c in caches]
    kv_write_cpu(k, v, *caches, slots)
    kv_write_ref(k, v, *expected, slots)
    assert all(torch.equal(a, b) for a, b in zip(caches, expected))


def test_results_do_not_depend_on_threads():
    x = rows(300, 640, seed=4)  # large enough for the parallel loop
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = quantize_per_token_cpu(x)
        torch.set_num_threads(2)
        two = quantize_per_token_cpu(x)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
