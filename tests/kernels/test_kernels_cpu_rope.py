"""salon/kernels/cpu/rope.py: the reference's values from tables that never depend on the batch or on growth."""

from __future__ import annotations

import torch

from salon.kernels.cpu import rope as cpu_rope
from salon.kernels.cpu.rope import CHUNK_POSITIONS, rope_neox_cpu, rope_tables
from salon.kernels.rope import rope_neox_ref


def test_matches_reference_across_chunks_and_bases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 32, generator=g)
    positions = torch.tensor([0, 1, 17, CHUNK_POSITIONS - 1, CHUNK_POSITIONS, 3 * CHUNK_POSITIONS + 5, 40000])
    for base in (10000.0, 1e6):
        torch.testing.assert_close(
            rope_neox_cpu(x, positions, base), rope_neox_ref(x, positions, base), rtol=1e-5, atol=1e-5
        )


def test_a_position_gets_the_same_bits_alone_in_a_batch_and_after_growth():
    cpu_rope._tables.clear()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2, 16, generator=g)
    positions = torch.tensor([3, 900, 5000, 77, 12])
    batched = rope_neox_cpu(x, positions, 1e4)
    small_cos = rope_tables(16, 1e4, 1)[0].clone()
    rope_tables(16, 1e4, 5 * CHUNK_POSITIONS)  # grow
    assert torch.equal(rope_tables(16, 1e4, 1)[0][: small_cos.shape[0]], small_cos)
    for i in range(5):
        assert torch.equal(rope_neox_cpu(x[i : i + 1], positions[i : i + 1], 1e4), batched[i : i + 1])
    cpu_rope._tables.clear()
    assert torch.equal(rope_neox_cpu(x, positions, 1e4), batched)  # a fresh process computes the same


def test_empty_input():
    assert rope_neox_cpu(torch.empty(0, 2, 8), torch.empty(0, dtype=torch.int64), 1e4).shape == (0, 2, 8)


def test_the_c_kernel_gives_the_bits_of_the_tensor_expression():
    """rope.c against the same expression in PyTorch on the same tables: every head-dim tail, strided per-head
    views of a QKV row (as the model passes them), the parallel loop's sizes."""
    assert cpu_rope.library() is not None or not cpu_rope.native.simd_isas()
    g = torch.Generator().manual_seed(2)
    for t, h, d in [(1, 1, 2), (3, 2, 6), (5, 4, 16), (2, 3, 18), (7, 1, 34), (4, 4, 256), (300, 4, 64)]:
        qkv = torch.randn(t, (h + 2) * d, generator=g) * 10
        x = qkv[:, : h * d].reshape(t, h, d)  # row stride (h + 2) * d
        positions = torch.randint(0, 3 * CHUNK_POSITIONS, (t,), generator=g)
        cos, sin = rope_tables(d, 1e4, int(positions.max()) + 1)
        expected = cpu_rope._rope_from_tables(x, positions, cos, sin)
        got = rope_neox_cpu(x, positions, 1e4)
        assert got.is_contiguous() and torch.equal(got, expected), (t, h, d)
