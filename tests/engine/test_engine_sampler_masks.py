"""logit_bias and min_tokens masks (SamplingParams.masked_token_ids) on every sampler path: the PyTorch reference
(sampler.apply_logit_masks, then sample_row), the host sampler's batched call (C kernel rows and reference rows),
and the device sampler, which must give the host sampler's tokens and log-probs exactly."""

from __future__ import annotations

import math
import types

import pytest
import torch

from salon.engine.request import SamplingParams
from salon.engine.worker.device_sampler import DeviceSampler
from salon.engine.worker.sampler import (
    DraftHistory,
    apply_logit_masks,
    kept_tokens,
    sample,
    sample_row,
    uniform,
)
from tests.engine_testlib import make_request

VOCAB = 4096
PROMPT = [2, 5, 9, 11]
STOPS = (7, 8)


def history(num_output: int) -> DraftHistory:
    return DraftHistory(PROMPT, [1] * num_output)


def test_bias_is_added_and_minus_100_and_min_tokens_mask_give_minus_inf():
    logits = torch.arange(10, dtype=torch.float32)
    params = SamplingParams(16, logit_bias=((2, 1.5), (3, -100.0), (9, -0.25)), min_tokens=2, min_tokens_mask_ids=STOPS)
    before = apply_logit_masks(logits, params, 1)
    want = [0.0, 1.0, 3.5, -math.inf, 4.0, 5.0, 6.0, -math.inf, -math.inf, 8.75]
    assert before.tolist() == want
    after = apply_logit_masks(logits, params, 2)  # min_tokens reached: the stop tokens come back
    assert after.tolist() == [0.0, 1.0, 3.5, -math.inf, 4.0, 5.0, 6.0, 7.0, 8.0, 8.75]
    assert logits.tolist() == list(range(10))  # a new row


def row_logits(seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def test_greedy_never_takes_a_banned_or_early_stop_token():
    logits = row_logits(1)
    top = int(torch.argmax(logits))
    params = SamplingParams(8, logit_bias=((top, -100.0),))
    (got,) = sample(logits[None], [params], [None], [history(0)])
    assert got.token_id != top and got.token_id == int(torch.topk(logits, 2).indices[1])
    stop_params = SamplingParams(8, min_tokens=3, min_tokens_mask_ids=(top,))
    assert sample(logits[None], [stop_params], [None], [history(2)])[0].token_id != top
    assert sample(logits[None], [stop_params], [None], [history(3)])[0].token_id == top


def test_log_probs_are_those_of_the_biased_logits():
    logits = row_logits(2)
    params = SamplingParams(8, logit_bias=((5, 4.0), (6, -100.0)), return_logprobs=True, num_top_logprobs=2)
    (got,) = sample(logits[None], [params], [None], [history(0)])
    want = torch.log_softmax(apply_logit_masks(logits, params, 0), dim=-1)
    assert got.logprob == float(want[got.token_id])
    assert got.top_logprobs == tuple(zip(*[x.tolist() for x in reversed(torch.topk(want, 2))]))


SAMPLED = [
    {"temperature": 0.8, "logit_bias": ((3, 5.0), (40, -3.0))},  # finite bias: the C kernel's row
    {"temperature": 1.0, "top_p": 0.9, "logit_bias": ((3, -100.0),)},  # a ban: the reference's row
    {"temperature": 0.7, "top_k": 50, "min_tokens": 3, "min_tokens_mask_ids": STOPS},
    {"temperature": 1.2, "min_p": 0.01, "logit_bias": ((11, 100.0),)},
]


@pytest.mark.parametrize("num_output", [0, 5])
def test_batched_rows_are_the_reference_rows(num_output):
    """sample() on a batch == the PyTorch reference row by row (apply_logit_masks, then sample_row), whichever
    path (C kernel or reference) sample() takes for each row."""
    logits = torch.stack([row_logits(10 + i, 1.0 if i == 1 else 3.0) for i in range(len(SAMPLED))])
    params = [SamplingParams(16, seed=i, **spec) for i, spec in enumerate(SAMPLED)]
    gens = [torch.Generator().manual_seed(i) for i in range(len(SAMPLED))]
    got = sample(logits, params, gens, [history(num_output)] * len(params))
    for r, p in enumerate(params):
        u = uniform(torch.Generator().manual_seed(r))
        want = sample_row(apply_logit_masks(logits[r], p, num_output), p, u)
        assert got[r].token_id == want, r
        masked = p.masked_token_ids(num_output)
        assert got[r].token_id not in masked


def test_a_flat_row_with_a_ban_keeps_the_full_sort_set():
    """top-p over a flat row takes the histogram path; a -inf token must neither widen nor break it."""
    logits = row_logits(3, scale=0.05)
    params = SamplingParams(8, temperature=1.0, top_p=0.5, logit_bias=((0, -100.0), (1, -100.0)))
    x = apply_logit_masks(logits, params, 0)
    ids, _ = kept_tokens(x, params)
    order = torch.argsort(x, descending=True, stable=True)
    w = torch.exp(x[order] - x.max()).double()
    keep = int(((torch.cumsum(w, 0) - w) < 0.5 * w.sum()).sum())
    assert sorted(ids.tolist()) == sorted(order[:keep].tolist())
    assert 0 not in ids.tolist() and 1 not in ids.tolist()


def test_the_device_sampler_gives_the_host_samplers_tokens_with_masks():
    specs = [
        {"logit_bias": ((3, -100.0), (4, 2.5))},
        {"min_tokens": 4, "min_tokens_mask_ids": STOPS, "return_logprobs": True},
        {"temperature": 0.9, "top_p": 0.8, "logit_bias": ((7, 6.0), (100, -100.0)), "num_top_logprobs": 2},
        {"temperature": 1.0, "min_tokens": 3, "min_tokens_mask_ids": STOPS, "repetition_penalty": 1.3},
        {},
    ]

    def reqs():
        return [make_request(f"m{i}", PROMPT, 64, seed=7 + i, **s) for i, s in enumerate(specs)]

    device_reqs, host_reqs = reqs(), reqs()
    sampler = DeviceSampler("cpu")
    for step in range(6):
        # Stop tokens and biased tokens made likely, so the masks decide.
        logits = torch.stack([row_logits(100 * step + i) for i in range(len(specs))])
        logits[:, list(STOPS)] += 8.0
        got, _, _ = sampler.sample(logits, [types.SimpleNamespace(request=r, draft_token_ids=[]) for r in device_reqs])
        want = sample(logits, [r.sampling for r in host_reqs], [r.generator for r in host_reqs], host_reqs)
        assert got == want, step
        for i, (d, h, t) in enumerate(zip(device_reqs, host_reqs, got)):
            assert t.token_id not in h.sampling.masked_token_ids(h.num_output_tokens), (step, i)
            d.output_token_ids.append(t.token_id)
            h.output_token_ids.append(t.token_id)
    # The stop tokens were masked only before min_tokens: afterwards the made-likely stop tokens are taken.
    assert any(t in STOPS for t in host_reqs[1].output_token_ids[4:])
