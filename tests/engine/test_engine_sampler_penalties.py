"""Repetition / frequency / presence penalties and min_p against plain references written from vLLM's
definitions; the C sampler with min_p against the PyTorch path; rows alone vs batched; range checks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from salon.common.errors import InvalidArgument
from salon.engine.api.validation import check_penalties
from salon.engine.request import SamplingParams
from salon.engine.worker.sampler import apply_penalties, effective_top_k, kept_tokens, sample, sample_row
from salon.kernels.cpu import native
from salon.kernels.cpu.sample import sample_rows_cpu

VOCAB = 4096


@dataclass
class History:
    prompt_token_ids: list[int]
    output_token_ids: list[int]


def reference_penalties(logits: torch.Tensor, p: SamplingParams, h: History) -> torch.Tensor:
    """vLLM's apply_penalties written out token by token (float32, same operation order)."""
    out = logits.clone()
    for t in set(h.prompt_token_ids) | set(h.output_token_ids):
        v = out[t]
        out[t] = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
    for t in set(h.output_token_ids):
        out[t] = out[t] - p.frequency_penalty * torch.tensor(float(h.output_token_ids.count(t)))
        out[t] = out[t] - p.presence_penalty
    return out


def reference_min_p_kept(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """vLLM's min_p: probabilities after temperature, keep those >= min_p * the largest (float64 here)."""
    probs = torch.softmax(logits.double() / p.temperature, -1)
    return probs >= p.min_p * probs.max()


def logits_of(seed: int, vocab: int = VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn(vocab, generator=g)
    x[torch.randperm(vocab, generator=g)[:20]] += 6.0
    return x


def history_of(seed: int) -> History:
    g = torch.Generator().manual_seed(seed)
    return History(
        torch.randint(0, VOCAB, (300,), generator=g).tolist(), torch.randint(0, 50, (40,), generator=g).tolist()
    )  # outputs repeat tokens


@pytest.mark.parametrize(
    "p",
    [
        SamplingParams(1, repetition_penalty=1.3),
        SamplingParams(1, repetition_penalty=0.8),
        SamplingParams(1, frequency_penalty=0.5),
        SamplingParams(1, presence_penalty=-0.7),
        SamplingParams(1, repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.4),
    ],
)
def test_penalties_match_the_reference_exactly(p):
    for seed in range(3):
        x, h = logits_of(seed), history_of(seed)
        got = apply_penalties(x, p, h)
        assert torch.equal(got, reference_penalties(x, p, h))
        assert not torch.equal(got, x)


def test_repetition_penalty_changes_the_greedy_token():
    x = torch.tensor([1.0, 3.0, 2.5, -1.0])
    h = History([1], [])
    p = SamplingParams(1, repetition_penalty=1.5)  # token 1: 3.0 / 1.5 = 2.0 < 2.5
    assert sample(x[None], [SamplingParams(1)], [None])[0].token_id == 1
    assert sample(x[None], [p], [None], [h])[0].token_id == 2
    assert apply_penalties(x, p, History([3], []))[3] == -1.5  # a negative logit is multiplied


def test_frequency_and_presence_count_only_the_output():
    x = torch.zeros(8)
    got = apply_penalties(
        x,
        SamplingParams(1, frequency_penalty=0.5, presence_penalty=1.0),
        History(prompt_token_ids=[1, 2], output_token_ids=[3, 3, 3, 4]),
    )
    assert got.tolist() == [0.0, 0.0, 0.0, -2.5, -1.5, 0.0, 0.0, 0.0]


def test_penalties_without_history_are_refused():
    with pytest.raises(ValueError, match="history"):
        sample(logits_of(0)[None], [SamplingParams(1, presence_penalty=0.5)], [None])


@pytest.mark.parametrize(
    "p",
    [
        SamplingParams(1, temperature=1.0, min_p=0.05),
        SamplingParams(1, temperature=0.6, min_p=0.2),
        SamplingParams(1, temperature=1.5, min_p=0.01, top_k=8),
        SamplingParams(1, temperature=1.0, min_p=0.02, top_p=0.9),
    ],
)
def test_min_p_keeps_the_reference_set(p):
    for seed in range(3):
        x = logits_of(seed)
        ids, w = kept_tokens(x, p)
        kept = torch.zeros(VOCAB, dtype=torch.bool)
        kept[ids if ids is not None else slice(None)] = w > 0
        ref = reference_min_p_kept(x, p)
        if p.top_k or p.top_p < 1.0:
            assert bool((kept & ~ref).sum() == 0), "kept a token min_p drops"
            assert int(kept.sum()) <= int(ref.sum())
        else:
            assert torch.equal(kept, ref)
        assert effective_top_k(x, p) == (min(int(ref.sum()), p.top_k) if p.top_k else int(ref.sum()))


@pytest.mark.skipif(not native.simd_isas(), reason="no C sampler for this CPU (needs AVX-512 or AVX2 + FMA)")
@pytest.mark.parametrize("isa", native.simd_isas())
def test_c_kernel_with_min_p_and_penalties_draws_the_pytorch_tokens(isa):
    us = [0.0, 0.1, 0.5, 0.93, 0.999]
    params = [
        SamplingParams(1, temperature=0.9, min_p=0.05, repetition_penalty=1.2, seed=1),
        SamplingParams(1, temperature=1.3, min_p=0.1, top_p=0.8, frequency_penalty=0.4, seed=2),
    ]
    for p in params:
        x = apply_penalties(logits_of(7, 262_144), p, History([5, 6, 7], [8, 8, 9]))
        rows = torch.stack([x] * len(us))
        got = sample_rows_cpu(
            rows,
            list(range(len(us))),
            [p.temperature] * len(us),
            [effective_top_k(x, p)] * len(us),
            [p.top_p] * len(us),
            us,
            isa,
        )
        assert got == [sample_row(x, p, u) for u in us]


def test_rows_with_penalties_are_independent_of_their_batch():
    logits = torch.stack([logits_of(s) for s in range(4)])
    params = [
        SamplingParams(1, temperature=0.8, min_p=0.05, repetition_penalty=1.3, seed=1),
        SamplingParams(1, repetition_penalty=1.3),  # greedy with a penalty
        SamplingParams(1, temperature=1.0, top_p=0.9, frequency_penalty=0.6, presence_penalty=0.2, seed=3),
        SamplingParams(1, temperature=0.7),
    ]
    hist = [history_of(s) for s in range(4)]

    def gens():
        return [torch.Generator().manual_seed(s) for s in range(4)]

    together = sample(logits, params, gens(), hist)
    for r in range(4):
        alone = sample(logits[r : r + 1], [params[r]], [gens()[r]], [hist[r]])
        assert alone[0].token_id == together[r].token_id
    assert together[1].token_id == int(torch.argmax(apply_penalties(logits[1], params[1], hist[1])))


def test_logprobs_are_the_models_not_the_penalized():
    x = torch.log_softmax(logits_of(2), -1)
    h = History([int(x.argmax())], [])
    out = sample(x[None], [SamplingParams(1, repetition_penalty=2.0, return_logprobs=True)], [None], [h])[0]
    assert out.logprob == pytest.approx(float(x[out.token_id]), abs=1e-6)


@pytest.mark.parametrize(
    "args,field",
    [
        ((0.0, 0.0, 0.0, 0.0), "repetition_penalty"),
        ((math.inf, 0.0, 0.0, 0.0), "repetition_penalty"),
        ((1.0, 2.5, 0.0, 0.0), "frequency_penalty"),
        ((1.0, 0.0, -3.0, 0.0), "presence_penalty"),
        ((1.0, 0.0, 0.0, 1.5), "min_p"),
        ((1.0, 0.0, 0.0, math.nan), "min_p"),
    ],
)
def test_out_of_range_values_name_the_field(args, field):
    with pytest.raises(InvalidArgument, match=f"sampling.{field}"):
        check_penalties(*args)
    check_penalties(1.2, -2.0, 2.0, 1.0)  # the range limits themselves are valid
