"""The per-head RMSNorm and RoPE in one C call (salon/kernels/cpu/rmsnorm_rope.c) against the CPU family's two calls
(rmsnorm_cpu, then rope_neox_cpu) bit for bit, and against the reference composition to float rounding:
decode rows and prefill chunks, heads read where they lie in a fused qkv row, positions out of order and far
apart; and the calls it declines compose the two kernels."""

from __future__ import annotations

import pytest
import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.rmsnorm import rmsnorm_cpu
from salon.kernels.cpu.rmsnorm_rope import library, rmsnorm_rope_c, rmsnorm_rope_cpu
from salon.kernels.cpu.rope import rope_neox_cpu
from salon.kernels.rmsnorm_rope import rmsnorm_rope_ref

needs_kernel = pytest.mark.skipif(not native.simd_isas() or library() is None, reason="needs x86-64 AVX2 and cc")
EPS = 1e-6


def _case(t: int, h: int, d: int, seed: int, extra: int = 0):
    g = torch.Generator().manual_seed(seed)
    row = torch.randn(t, h * d + extra, generator=g) * torch.rand(t, 1, generator=g).mul(20).add(0.01)
    x = row[:, : h * d].reshape(t, h, d)  # heads inside a wider row, as q inside qkv
    weight = torch.rand(d, generator=g) * 2
    positions = torch.randint(0, 40_000, (t,), generator=g)
    return x, weight, positions


@needs_kernel
@pytest.mark.parametrize(
    "t,h,d,extra",
    [
        (1, 4, 256, 512),
        (1, 1, 256, 0),
        (3, 4, 64, 128),
        (70, 4, 256, 512),
        (16, 9, 64, 0),
        (200, 2, 128, 0),
        (2, 3, 18, 5),
    ],
)
def test_one_call_has_the_two_kernels_bits(t, h, d, extra):
    x, weight, positions = _case(t, h, d, seed=t + h + d, extra=extra)
    for base in (10_000.0, 1_000_000.0):
        got = rmsnorm_rope_c(x, weight, EPS, positions, base)
        assert got is not None and got.is_contiguous() and got.shape == (t, h, d)
        assert torch.equal(got, rope_neox_cpu(rmsnorm_cpu(x, weight, EPS), positions, base))
        torch.testing.assert_close(got, rmsnorm_rope_ref(x, weight, EPS, positions, base), rtol=1e-4, atol=1e-4)
        for i in range(0, t, max(1, t // 3)):  # a row alone: the bits it had among the others
            assert torch.equal(
                rmsnorm_rope_c(x[i : i + 1], weight, EPS, positions[i : i + 1].clone(), base), got[i : i + 1]
            )


@needs_kernel
def test_declined_calls_compose_the_two_kernels():
    x, weight, positions = _case(3, 2, 64, seed=1)
    assert rmsnorm_rope_c(x, weight, EPS, -positions - 1, 10_000.0) is None  # negative positions
    assert rmsnorm_rope_c(x.double(), weight, EPS, positions, 10_000.0) is None
    assert rmsnorm_rope_c(x, weight[:32], EPS, positions, 10_000.0) is None
    odd, w_odd, _ = _case(3, 2, 2047, seed=2)
    assert rmsnorm_rope_c(odd, w_odd, EPS, positions, 10_000.0) is None  # odd head size
    big, w_big, _ = _case(3, 1, 2048, seed=3)
    assert rmsnorm_rope_c(big, w_big, EPS, positions, 10_000.0) is None  # past the row buffer
    assert torch.equal(
        rmsnorm_rope_cpu(big, w_big, EPS, positions, 10_000.0),
        rope_neox_cpu(rmsnorm_cpu(big, w_big, EPS), positions, 10_000.0),
    )
