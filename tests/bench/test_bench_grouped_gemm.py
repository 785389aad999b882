"""bench/grouped_gemm.py: the rows cover Gemma 3 270M's layer shapes, and the rotating weights are distinct copies
that together exceed twice the L2, cycled one per call (so no call finds its weight in the cache)."""

from __future__ import annotations

import itertools

import torch

from bench.grouped_gemm import ASSUMED_L2_BYTES, GEMMA_LAYERS, OUTPUT, l2_bytes, rotating_weights, weight_bytes


def test_gemma_shapes():
    assert [(k, n) for _, k, n, _ in GEMMA_LAYERS] == [(640, 1536), (1024, 640), (640, 4096), (2048, 640)]
    assert OUTPUT[1:3] == (640, 262_144)
    assert weight_bytes(640, 1536) == 1536 * 640 + 1536 * 20 * 4


def test_rotating_copies_exceed_twice_the_l2_and_differ():
    l2 = 1 << 15
    weights = rotating_weights(64, 96, l2, "cpu")
    assert len(weights) * weight_bytes(64, 96) > 2 * l2
    assert all(w.shape == (96, 64) and s.shape == (96, 2) for w, s in weights)
    assert not any(torch.equal(a[0], b[0]) for a, b in itertools.combinations(weights, 2))
    # a weight larger than the L2 still rotates between two copies
    assert len(rotating_weights(64, 96, 16, "cpu")) == 2


def test_l2_assumed_without_cuda():
    assert l2_bytes("cpu") == ASSUMED_L2_BYTES
