"""The q/k per-head norm, RoPE and KV write as one Triton launch (salon.kernels.rmsnorm_rope_kv) under the
interpreter, on awkward shapes, bit for bit against the Triton family's unfused sequence (rmsnorm_triton, then
rope_neox_triton, for q and for k, then kv_write_triton); padded rows (slot -1) write no cache byte; the
reference composition against the reference ops it composes."""

from __future__ import annotations

import pytest
import torch

from salon.kernels.kv_write import kv_write_ref, kv_write_triton
from salon.kernels.rmsnorm import rmsnorm_triton
from salon.kernels.rmsnorm_rope import compose as compose_rmsnorm_rope
from salon.kernels.rmsnorm_rope import rmsnorm_rope_ref
from salon.kernels.rmsnorm_rope_kv import compose, rmsnorm_rope_kv_ref, rmsnorm_rope_kv_triton
from salon.kernels.rope import rope_neox_triton

unfused_triton = compose(compose_rmsnorm_rope(rmsnorm_triton, rope_neox_triton), kv_write_triton)


def _case(t: int, hq: int, hkv: int, d: int, seed: int, num_blocks: int = 4, block_size: int = 4):
    g = torch.Generator().manual_seed(seed)
    # q, k, v as views into one qkv row, as the model hands them over (strided heads)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 3.0
    q = qkv[:, : hq * d].reshape(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].reshape(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].reshape(t, hkv, d)
    q_norm = 1.0 + 0.3 * torch.randn(d, generator=g)
    k_norm = 1.0 + 0.3 * torch.randn(d, generator=g)
    positions = torch.randint(0, 5000, (t,), generator=g)
    caches = [
        torch.randint(-127, 128, (num_blocks, block_size, hkv, d), generator=g, dtype=torch.int8),
        torch.randint(-127, 128, (num_blocks, block_size, hkv, d), generator=g, dtype=torch.int8),
        torch.rand(num_blocks, block_size, hkv, generator=g),
        torch.rand(num_blocks, block_size, hkv, generator=g),
    ]
    # distinct slots, with padded rows (-1) among them
    slots = torch.randperm(num_blocks * block_size, generator=g)[:t]
    slots[torch.arange(t) % 3 == 1] = -1
    return q, k, v, q_norm, k_norm, positions, caches, slots


# T: one row (decode), a few; Hq: one, odd, a multiple of Hkv; Hkv: one (Gemma 3), two; D: not a power of two,
# a half that is not one, Gemma 3's 256
SHAPES = [(1, 1, 1, 8), (3, 3, 1, 12), (5, 4, 2, 20), (2, 4, 1, 256)]


@pytest.mark.parametrize("t, hq, hkv, d", SHAPES)
def test_one_launch_is_the_unfused_triton_sequence(t, hq, hkv, d):
    q, k, v, q_norm, k_norm, positions, caches, slots = _case(t, hq, hkv, d, seed=t * 100 + d)
    expected_caches = [c.clone() for c in caches]
    expected = unfused_triton(q, k, v, q_norm, k_norm, 1e-6, positions, 10000.0, *expected_caches, slots)
    got = rmsnorm_rope_kv_triton(q, k, v, q_norm, k_norm, 1e-6, positions, 10000.0, *caches, slots)
    assert got.shape == (t, hq, d)
    assert torch.equal(got, expected)
    for c, e in zip(caches, expected_caches):
        assert torch.equal(c, e)


def test_padded_rows_write_no_cache_byte():
    q, k, v, q_norm, k_norm, positions, caches, _ = _case(3, 2, 1, 12, seed=5)
    before = [c.clone() for c in caches]
    rmsnorm_rope_kv_triton(q, k, v, q_norm, k_norm, 1e-6, positions, 10000.0, *caches, torch.full((3,), -1))
    for c, b in zip(caches, before):
        assert torch.equal(c, b)


def test_live_rows_are_written():
    """The write is not skipped altogether: a live row's slot holds its quantized K and V afterwards."""
    q, k, v, q_norm, k_norm, positions, caches, slots = _case(3, 2, 1, 12, seed=6)
    before = [c.clone() for c in caches]
    rmsnorm_rope_kv_triton(q, k, v, q_norm, k_norm, 1e-6, positions, 10000.0, *caches, slots)
    changed = [not torch.equal(c, b) for c, b in zip(caches, before)]
    assert all(changed)


@pytest.mark.parametrize("t, hq, d", [(1, 1, 8), (4, 3, 12)])
def test_q_alone_is_the_unfused_q(t, hq, d):
    """A layer that reads another layer's KV: q only, no cache."""
    q, _, _, q_norm, _, positions, _, _ = _case(t, hq, 1, d, seed=7)
    got = rmsnorm_rope_kv_triton(q, None, None, q_norm, None, 1e-6, positions, 10000.0)
    assert torch.equal(got, unfused_triton(q, None, None, q_norm, None, 1e-6, positions, 10000.0))


def test_reference_is_rmsnorm_rope_then_kv_write():
    q, k, v, q_norm, k_norm, positions, caches, slots = _case(5, 4, 2, 20, seed=8)
    expected_caches = [c.clone() for c in caches]
    kv_write_ref(rmsnorm_rope_ref(k, k_norm, 1e-6, positions, 500.0), v, *expected_caches, slots)
    got = rmsnorm_rope_kv_ref(q, k, v, q_norm, k_norm, 1e-6, positions, 500.0, *caches, slots)
    assert torch.equal(got, rmsnorm_rope_ref(q, q_norm, 1e-6, positions, 500.0))
    for c, e in zip(caches, expected_caches):
        assert torch.equal(c, e)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 7, 64])
def test_gpu_one_launch_is_the_unfused_triton_sequence(t):
    """Compiled, on Gemma 3 270M's heads (4 query heads over 1 KV head of 256): the same bits as the unfused
    compiled kernels (the sum of squares' order and the rotation's float32 operations are theirs)."""
    q, k, v, q_norm, k_norm, positions, caches, slots = _case(t, 4, 1, 256, seed=t, num_blocks=32, block_size=16)
    q, k, v, q_norm, k_norm, positions, slots = (x.cuda() for x in (q, k, v, q_norm, k_norm, positions, slots))
    caches = [c.cuda() for c in caches]
    expected_caches = [c.clone() for c in caches]
    expected = unfused_triton(q, k, v, q_norm, k_norm, 1e-6, positions, 10000.0, *expected_caches, slots)
    got = rmsnorm_rope_kv_triton(q, k, v, q_norm, k_norm, 1e-6, positions, 10000.0, *caches, slots)
    assert torch.equal(got, expected)
    for c, e in zip(caches, expected_caches):
        assert torch.equal(c, e)
    q_alone = rmsnorm_rope_kv_triton(q, None, None, q_norm, None, 1e-6, positions, 10000.0)
    assert torch.equal(q_alone, unfused_triton(q, None, None, q_norm, None, 1e-6, positions, 10000.0))
