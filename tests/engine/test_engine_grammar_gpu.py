"""Constrained rows on CUDA (skipped without it): the bitmask applied where the logits are, and the device
sampler drawing only allowed tokens, the same alone as in a batch, run after run."""

from __future__ import annotations

import pytest
import torch

from salon.engine.worker.device_sampler import DeviceSampler
from tests.engine.test_engine_device_sampler import chunks_of, requests
from tests.engine.test_engine_grammar_parts import masked_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def decode_masked(reqs, steps: int) -> list[list[int]]:
    sampler = DeviceSampler("cuda")
    out: list[list[int]] = [[] for _ in reqs]
    for step in range(steps):
        logits, allowed = masked_step(reqs, step, "cuda")
        tokens, _, _ = sampler.sample(logits, chunks_of(reqs))
        for i, (r, t) in enumerate(zip(reqs, tokens)):
            assert allowed[i, t.token_id], (r.request_id, step)
            r.output_token_ids.append(t.token_id)
            out[i].append(t.token_id)
    return out


def test_masked_rows_draw_allowed_tokens_the_same_alone_and_batched():
    batched = decode_masked(requests(), 6)
    assert decode_masked(requests(), 6) == batched
    for i in range(len(batched)):
        assert decode_masked(requests()[i : i + 1], 6) == [batched[i]]
