"""The group32 activation recipe's references (salon.kernels.w8a8_group32): the quantization per token and 32 channels
and the GEMM's fixed order, each against a plain float64 loop that rounds to float32 where the contract does
(float64 holds every float32 product exactly and rounds a float32 sum or quotient once, the same as float32 would)."""

from __future__ import annotations

import struct

import pytest
import torch

from salon.kernels.backend import select_ops
from salon.kernels.cpu.linear_two_terms import linear_group32_cpu
from salon.kernels.linear_two_terms import linear_group32_ref
from salon.kernels.quantize import SCALE_FLOOR
from salon.kernels.rmsnorm import rmsnorm_ref
from salon.kernels.w8a8_group32 import quantize_group32_ref, w8a8_group32_ref


def f32(v: float) -> float:
    """v rounded to the nearest float32 (ties to even)."""
    return struct.unpack("f", struct.pack("f", v))[0]


def quantize_loop(x: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
    rows, scales = [], []
    for row in x.tolist():
        q, s = [], []
        for g in range(0, len(row), 32):
            group = row[g : g + 32]
            scale = max(f32(max(abs(v) for v in group) / 127.0), SCALE_FLOOR)
            s.append(scale)
            q += [max(-127, min(127, round(f32(v / scale)))) for v in group]  # round(): half to even
        rows.append(q)
        scales.append(s)
    return rows, scales


def gemm_loop(a_q, a_scale, w_q, w_scale) -> list[list[float]]:
    """The contract's order: s = a_scale * w_scale, p = acc * s, y = p_0 + p_1 + ... (each rounded to float32)."""
    a, sa, w, sw = a_q.tolist(), a_scale.tolist(), w_q.tolist(), w_scale.tolist()
    out = []
    for m in range(len(a)):
        row = []
        for n in range(len(w)):
            y = 0.0
            for g in range(len(sa[m])):
                acc = sum(a[m][k] * w[n][k] for k in range(32 * g, 32 * g + 32))
                scale = sw[n][g] if isinstance(sw[n], list) else sw[n]
                p = f32(float(acc) * f32(sa[m][g] * scale))
                y = p if g == 0 else f32(y + p)
            row.append(y)
        out.append(row)
    return out


def test_rounds_half_to_even_with_the_exact_scale():
    # absmax 127 makes the scale exactly 1.0: every .5 lies on a tie
    group = [0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 126.5, -126.5, 127.0] + [0.0] * 22
    q, s = quantize_group32_ref(torch.tensor([group]))
    assert s.tolist() == [[1.0]]
    assert q[0, :10].tolist() == [0, 2, 2, 4, 0, -2, -2, 126, -126, 127]
    # a scale that is not a power of two: absmax / 127 rounded once to float32
    x = torch.tensor([[0.3] * 31 + [-1.1]], dtype=torch.float32)
    q, s = quantize_group32_ref(x)
    assert s.item() == f32(f32(1.1) / 127.0) and q[0, 31].item() == -127
    assert q[0, 0].item() == round(f32(f32(0.3) / s.item()))


def test_each_group_of_32_channels_has_its_own_scale():
    x = torch.zeros(2, 96)
    x[0, :32] = 1.0
    x[0, 31] = 2.0  # the last channel of group 0
    x[0, 32] = 100.0  # the first of group 1: it must not coarsen group 0
    x[0, 33:64] = 1.0
    x[0, 64:] = -0.01
    x[1, 63] = 5.0
    q, s = quantize_group32_ref(x)
    assert s.shape == (2, 3)
    assert s[0].tolist() == [f32(2.0 / 127), f32(100.0 / 127), f32(f32(0.01) / 127)]
    assert q[0, 0].item() == round(f32(1.0 / s[0, 0].item())) and q[0, 31].item() == 127
    assert q[0, 32].item() == 127 and q[0, 33].item() == 1
    assert (q[0, 64:] == -127).all()
    assert q[1, 63].item() == 127 and (q[1, :63] == 0).all()


def test_an_all_zero_group_gets_the_floor_scale_and_zeros():
    x = torch.zeros(1, 64)
    x[0, 40] = -3.0
    q, s = quantize_group32_ref(x)
    assert s[0, 0].item() == SCALE_FLOOR and (q[0, :32] == 0).all()
    assert s[0, 1].item() == f32(3.0 / 127) and q[0, 40].item() == -127
    y = w8a8_group32_ref(q, s, torch.ones(3, 64, dtype=torch.int8), torch.ones(3, 2))
    assert y.tolist() == [[f32(-127 * f32(3.0 / 127))] * 3]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantization_equals_a_float64_loop(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 160, generator=g) * torch.rand(5, 1, generator=g) * 10
    x[1, 32:64] = 0.0  # an all-zero group
    x[2, 70] = 1e4  # an outlier confined to its group
    q, s = quantize_group32_ref(x)
    q_loop, s_loop = quantize_loop(x)
    assert q.tolist() == q_loop and s.tolist() == s_loop


@pytest.mark.parametrize("per_row_weights", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_equals_the_contracts_order_bit_for_bit(seed, per_row_weights):
    g = torch.Generator().manual_seed(seed)
    a_q = torch.randint(-127, 128, (4, 128), generator=g, dtype=torch.int8)
    a_s = torch.rand(4, 4, generator=g) / 37
    w_q = torch.randint(-127, 128, (6, 128), generator=g, dtype=torch.int8)
    w_s = torch.rand(6, generator=g) / 53 if per_row_weights else torch.rand(6, 4, generator=g) / 53
    assert w8a8_group32_ref(a_q, a_s, w_q, w_s).tolist() == gemm_loop(a_q, a_s, w_q, w_s)


def test_gemm_is_batch_invariant_and_splits_columns_without_changing_bits(monkeypatch):
    from salon.kernels import w8a8_group32

    g = torch.Generator().manual_seed(5)
    a_q = torch.randint(-127, 128, (7, 96), generator=g, dtype=torch.int8)
    a_s = torch.rand(7, 3, generator=g)
    w_q = torch.randint(-127, 128, (50, 96), generator=g, dtype=torch.int8)
    w_s = torch.rand(50, 3, generator=g)
    whole = w8a8_group32_ref(a_q, a_s, w_q, w_s)
    for m in range(7):
        assert torch.equal(w8a8_group32_ref(a_q[m : m + 1], a_s[m : m + 1], w_q, w_s), whole[m : m + 1])
    monkeypatch.setattr(w8a8_group32, "_COLUMNS_PER_PASS", 16)  # 50 columns in four passes
    assert torch.equal(w8a8_group32_ref(a_q, a_s, w_q, w_s), whole)


def test_bad_operands_are_refused_with_what_is_wrong():
    a_q, w_q = torch.zeros(2, 64, dtype=torch.int8), torch.zeros(3, 64, dtype=torch.int8)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_group32_ref(torch.zeros(2, 48))
    with pytest.raises(ValueError, match="a_scale"):
        w8a8_group32_ref(a_q, torch.ones(2), w_q, torch.ones(3, 2))
    with pytest.raises(ValueError, match="w_scale"):
        w8a8_group32_ref(a_q, torch.ones(2, 2), w_q, torch.ones(3, 3))


def test_the_linear_op_is_norm_quantize_gemm_post_norm_residual():
    g = torch.Generator().manual_seed(9)
    x, res = torch.randn(3, 64, generator=g), torch.randn(3, 5, generator=g)
    norm, post = torch.rand(64, generator=g) + 0.5, torch.rand(5, generator=g) + 0.5
    w_q = torch.randint(-127, 128, (5, 64), generator=g, dtype=torch.int8)
    w_s = torch.rand(5, 2, generator=g) / 100
    y = w8a8_group32_ref(*quantize_group32_ref(rmsnorm_ref(x, norm, 1e-6)), w_q, w_s)
    expected = res + rmsnorm_ref(y, post, 1e-6)
    assert torch.equal(linear_group32_ref(x, w_q, w_s, norm, 1e-6, post, res), expected)
    assert select_ops("cpu", "ref", activations="group32").linear_group32 is linear_group32_ref
    # the CPU family's op is its C kernel's (tests/kernels/test_kernels_cpu_group32.py holds it to these bits)
    assert select_ops("cpu", activations="group32").linear_group32 is linear_group32_cpu
