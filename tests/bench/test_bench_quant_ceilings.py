"""bench/quant_ceilings.py's fake quantization: the kernels' int8 rounding, per row or per group of columns."""

from __future__ import annotations

import torch

from bench.quant_ceilings import FakeQuantLinear, fake_quantize
from salon.kernels.quantize import quantize_per_token_ref


def test_one_group_per_row_is_the_kernels_per_token_quantization():
    x = torch.randn(7, 96, generator=torch.Generator().manual_seed(0))
    q, scale = quantize_per_token_ref(x)
    assert torch.equal(fake_quantize(x, 96), q.float() * scale[:, None])


def test_groups_of_32_reproduce_a_q8_0_tensor_and_a_row_scale_does_not():
    # Q8_0 blocks: int8 values with one scale per 32, each block reaching +-127 (as the GGUF's token table)
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (4, 64), generator=gen).float()
    q[:, 0], q[:, 32] = 127.0, -127.0
    scales = torch.tensor([[0.5, 0.03125], [1.0, 0.25], [0.125, 2.0], [4.0, 0.0625]])
    x = q * scales.repeat_interleave(32, dim=1)
    assert torch.equal(fake_quantize(x, 32), x)
    assert not torch.equal(fake_quantize(x, 64), x)


def test_fake_quant_linear_rounds_weights_and_activations():
    gen = torch.Generator().manual_seed(2)
    w, x = torch.randn(5, 64, generator=gen), torch.randn(3, 64, generator=gen)
    exact = FakeQuantLinear(w, None, None, activation_terms=0)
    assert torch.equal(exact(x), x @ w.T)
    both = FakeQuantLinear(w, None, 32, activation_terms=1)
    assert torch.equal(both(x), fake_quantize(x, 64) @ fake_quantize(w, 32).T)
    per_row = FakeQuantLinear(w, None, 0, activation_terms=0)
    assert torch.equal(per_row(x), x @ fake_quantize(w, 64).T)
    first = fake_quantize(x, 64)
    two_terms = FakeQuantLinear(w, None, None, activation_terms=2)
    assert torch.equal(two_terms(x), (first + fake_quantize(x - first, 64)) @ w.T)
