"""bench.sampler's baseline (bench/sample_full_histogram.c: sample.c with every row through the bins, the mass
histogram over every token and the walk) draws the tokens of the engine's build and of the PyTorch path on a row
whose top-p cut falls among the top bins' tokens, and with every token kept (top_p 1), where the engine's build
takes its short paths: the pair times the paths and nothing else."""

import pytest
import torch

from bench.sampler import BASELINE
from salon.engine.request import SamplingParams
from salon.engine.worker.sampler import sample_row
from salon.kernels.cpu import native
from salon.kernels.cpu.sample import sample_rows_cpu


@pytest.mark.skipif(not native.simd_isas(), reason="no C sampler for this CPU (needs AVX-512 or AVX2 + FMA)")
@pytest.mark.parametrize("top_p", [0.5, 0.95, 1.0])
def test_the_baseline_draws_the_engine_builds_tokens(top_p):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(50_000, generator=g)
    x[torch.randperm(50_000, generator=g)[:30]] = 12.0 - torch.rand(30, generator=g)
    us = [i / 200 for i in range(200)]
    args = (torch.stack([x] * len(us)), list(range(len(us))), [0.7] * len(us), [0] * len(us), [top_p] * len(us), us)
    want = [sample_row(x, SamplingParams(1, temperature=0.7, top_p=top_p), u) for u in us]
    assert sample_rows_cpu(*args, source=BASELINE) == want
    assert sample_rows_cpu(*args) == want
