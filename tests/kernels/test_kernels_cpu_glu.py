"""The GeGLU and SwiGLU contracts (salon/kernels/glu.py) and their C kernels (salon/kernels/cpu/glu.c), bit for bit: row
lengths around the 8 lanes, strided rows, values across the whole range (the exp's clamps at -87 and 88, its
zero below -87, huge and tiny gates); and the contract against gelu_tanh and silu in float64. A fused
multiply-add, a reordered product or torch's own gelu changes the bits (checked against mutated kernels by
hand)."""

from __future__ import annotations

import math

import pytest
import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.glu import geglu_cpu, library, swiglu_cpu
from salon.kernels.glu import exp_ref, geglu_ref, gelu_tanh_ref, silu_ref, swiglu_ref

needs_kernel = pytest.mark.skipif(not native.simd_isas() or library() is None, reason="needs x86-64 with AVX2 and cc")
GLUS = [pytest.param(geglu_cpu, geglu_ref, id="geglu"), pytest.param(swiglu_cpu, swiglu_ref, id="swiglu")]


def _gelu_tanh_f64(g: torch.Tensor) -> torch.Tensor:
    """gelu_tanh in float64, in the sigmoid form (the tanh form cancels to nothing for negative g)."""
    x = g.double()
    return x / (1 + torch.exp(-2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    return (got.double() - want).abs() / (want.abs() * 2.0**-23)


@needs_kernel
@pytest.mark.parametrize("kernel,ref", GLUS)
@pytest.mark.parametrize("f", [1, 7, 8, 9, 16, 31, 1024, 2048])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_kernel_matches_contract_bitwise(m, f, kernel, ref):
    g = torch.Generator().manual_seed(m * 10_000 + f)
    y = torch.randn(m, 2 * f, generator=g) * torch.logspace(-4, 2, m)[:, None]
    assert torch.equal(kernel(y), ref(y))


@needs_kernel
@pytest.mark.parametrize("kernel,ref", GLUS)
def test_every_range_of_the_gate_gives_the_contract_bits(kernel, ref):
    """Gates from -1e6 to 1e6: z past both clamps, the zero below -87, exp near its limits, g^3 overflowing."""
    gates = torch.cat(
        [
            torch.linspace(-60, 60, 40_001),
            -torch.logspace(-30, 6, 999),
            torch.logspace(-30, 6, 999),
            torch.tensor([0.0, -0.0, 5.61, 5.62, -5.55, -5.56]),
        ]
    )
    ups = torch.randn(gates.numel(), generator=torch.Generator().manual_seed(1)) * 3
    y = torch.cat([gates, ups])[None, :]  # one row: gate columns first, then up
    assert torch.equal(kernel(y), ref(y))
    assert torch.isfinite(kernel(y)).all()


@needs_kernel
@pytest.mark.parametrize("kernel,ref", GLUS)
def test_a_prefill_split_over_threads_gives_the_contract_bits(kernel, ref):
    """A prefill's rows (past glu.c's GLU_PARALLEL_MIN_OUTPUTS) go over torch's threads: each row's bits as on one."""
    y = torch.randn(301, 2 * 1040, generator=torch.Generator().manual_seed(3)) * 4
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernel(y)
        torch.set_num_threads(max(threads, 2))
        split = kernel(y)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, ref(y)) and torch.equal(alone, split)


@needs_kernel
@pytest.mark.parametrize("kernel,ref", GLUS)
def test_strided_rows_are_read_where_they_lie(kernel, ref):
    wide = torch.randn(5, 4200, generator=torch.Generator().manual_seed(2))
    y = wide[:, 50:4146]  # row stride 4200, 2 x 2048 columns
    assert not y.is_contiguous()
    assert torch.equal(kernel(y), ref(y.contiguous()))


def test_contract_is_gelu_tanh_to_a_few_ulps():
    g = torch.linspace(-2, 12, 300_001)
    assert _ulps(gelu_tanh_ref(g), _gelu_tanh_f64(g))[g != 0].max() <= 4
    ours, theirs = gelu_tanh_ref(g), torch.nn.functional.gelu(g, approximate="tanh")
    assert (ours.double() - theirs.double()).abs().max() <= 4e-6  # torch's own, in its own rounding


def test_silu_contract_is_silu_to_a_few_ulps():
    g = torch.linspace(-10, 12, 300_001)
    want = g.double() / (1 + torch.exp(-g.double()))
    assert _ulps(silu_ref(g), want)[g != 0].max() <= 4
    assert (silu_ref(g).double() - torch.nn.functional.silu(g).double()).abs().max() <= 4e-6


def test_contract_keeps_the_negative_tail_where_torch_cancels():
    """Below -2 gelu_tanh is a tail: the contract keeps its digits (within 200 ulps: z's own rounding), where
    the tanh form torch computes, 0.5 g (1 + tanh(a)), loses them all."""
    g = torch.linspace(-9.5, -2, 100_001)
    want = _gelu_tanh_f64(g)
    assert _ulps(gelu_tanh_ref(g), want).max() <= 200
    assert _ulps(torch.nn.functional.gelu(g, approximate="tanh"), want).max() > 1e5


def test_exp_is_exp_to_a_few_ulps_and_zero_below_its_range():
    z = torch.linspace(-86.9, 88.0, 400_001)
    assert _ulps(exp_ref(z), torch.exp(z.double())).max() <= 3
    assert torch.equal(exp_ref(torch.tensor([-87.01, -1000.0, float("-inf")])), torch.zeros(3))


@pytest.mark.parametrize("ref,name", [(geglu_ref, "geglu"), (swiglu_ref, "swiglu")])
def test_reference_refuses_what_is_not_gate_and_up_columns(ref, name):
    for bad in (torch.zeros(2, 3), torch.zeros(4), torch.zeros(2, 4, dtype=torch.float64)):
        with pytest.raises(ValueError, match=name):
            ref(bad)
