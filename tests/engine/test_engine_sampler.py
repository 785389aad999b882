"""The sampler against a plain full-sort reference, the C kernel against the PyTorch path, the use of
randomness, and the statistics."""

from __future__ import annotations

import pytest
import torch

from salon.engine.request import SamplingParams
from salon.engine.worker.sampler import advance_generator, kept_tokens, sample, sample_row, uniform
from salon.kernels.cpu import native
from salon.kernels.cpu.sample import sample_rows_cpu

VOCAB = 262_144


def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p by sorting the whole vocabulary; f64[V] probabilities (0 where dropped)."""
    x = logits.double() / params.temperature
    if 0 < params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        drop_sorted = (torch.cumsum(sorted_probs, -1) - sorted_probs) >= params.top_p
        probs = probs.masked_fill(torch.zeros_like(drop_sorted).scatter_(0, order, drop_sorted), 0.0)
    return probs / probs.sum()


def as_probs(ids, w, vocab):
    probs = torch.zeros(vocab, dtype=torch.float64)
    if ids is None:
        probs += w
    else:
        probs[ids] = w
    return probs / probs.sum()


def logits_of(kind: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(VOCAB, generator=g)
    if kind == "peaked":  # a language model's usual shape: a few likely tokens
        x[torch.randperm(VOCAB, generator=g)[:12]] += 14.0
    elif kind == "spread":  # top-p needs more than 64 candidates but fewer than 2048
        x[torch.randperm(VOCAB, generator=g)[:600]] += 12.0
    return x  # "flat": top-p needs a sort of the whole vocabulary


@pytest.mark.parametrize("kind", ["peaked", "spread", "flat"])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(1, temperature=0.7, top_p=0.9),
        SamplingParams(1, temperature=1.3, top_p=0.5),
        SamplingParams(1, temperature=1.0, top_k=40),
        SamplingParams(1, temperature=0.9, top_k=300, top_p=0.8),
        SamplingParams(1, temperature=1.0),
    ],
)
def test_kept_distribution_matches_full_sort_reference(kind, params):
    x = logits_of(kind)
    got = as_probs(*kept_tokens(x, params), VOCAB)
    ref = reference_probs(x, params)
    assert torch.equal(got > 0, ref > 0), "kept set differs"
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-12)


PARAMS = [
    SamplingParams(1, temperature=1.0),
    SamplingParams(1, temperature=0.8, top_p=0.9),
    SamplingParams(1, temperature=0.8, top_k=5),
    SamplingParams(1, temperature=1.2, top_k=500, top_p=0.7),
]


def test_each_sampled_token_consumes_exactly_one_draw():
    x = logits_of("peaked", seed=3)
    for params in PARAMS:
        a, b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        for _ in range(3):
            sample(x[None], [params], [a])
            advance_generator(b)
        assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))


# The builds of sample.c this CPU runs (AVX-512, AVX2 + FMA); none: the C sampler's tests skip.
ISAS = native.simd_isas()
NO_C_SAMPLER = "no C sampler for this CPU (needs AVX-512 or AVX2 + FMA)"


@pytest.mark.skipif(not ISAS, reason=NO_C_SAMPLER)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["peaked", "spread", "flat"])
def test_c_kernel_draws_the_tokens_of_the_pytorch_path(kind, isa):
    x = logits_of(kind, seed=5)
    us = [0.0, 0.013, 0.25, 0.5, 0.77, 0.999]
    for params in PARAMS:
        rows = torch.stack([x] * len(us))
        got = sample_rows_cpu(
            rows,
            list(range(len(us))),
            [params.temperature] * len(us),
            [params.top_k] * len(us),
            [params.top_p] * len(us),
            us,
            isa,
        )
        assert got is not None, "the C sampler did not run"
        assert got == [sample_row(x, params, u) for u in us], params


def top_bins_rows() -> dict[str, torch.Tensor]:
    """Rows for sample.c's first top-p path (the tokens of the TOP_BINS = 64 highest of 1,024 bins over [min, max],
    at most TOP_TOKENS = 2,048 of them) and its ways back to the full one. Background tokens ~N(0, 1): the range is
    about 25 logits wide, the top bins its highest ~1.5."""
    g = torch.Generator().manual_seed(3)
    rows = {}
    x = torch.randn(VOCAB, generator=g)
    likely = torch.randperm(VOCAB, generator=g)[:40]
    x[likely] = 20.0 - torch.rand(40, generator=g)  # the mass within 1 logit of the max: the cut among them
    x[likely[:6]] = 19.5  # ties in rank order, ids ascending
    rows["cut in the top bins"] = x
    y = x.clone()
    y[torch.randperm(VOCAB, generator=g)[:3000]] = 20.0 - torch.rand(3000, generator=g)  # more than TOP_TOKENS there
    rows["too many tokens in the top bins"] = y
    z = torch.randn(VOCAB, generator=g)
    z[torch.randperm(VOCAB, generator=g)[:50]] = 20.0 - 0.05 * torch.arange(50.0)  # 2.5 wide: the mass reaches lower
    z[torch.randperm(VOCAB, generator=g)[:400]] = 17.0 - torch.rand(400, generator=g)
    rows["cut below the top bins"] = z
    return rows


@pytest.mark.skipif(not ISAS, reason=NO_C_SAMPLER)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("row", ["cut in the top bins", "too many tokens in the top bins", "cut below the top bins"])
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.97])
def test_c_kernel_top_p_draws_the_pytorch_tokens_in_and_past_the_top_bins(row, top_p, isa):
    """Every u of a fine grid (so the kept set's last token, the crossing one, is drawn too): the C sampler's tokens
    are the PyTorch path's on rows whose top-p cut falls among the top bins' tokens, or whose top bins hold too many
    tokens, or whose cut falls below them."""
    x = top_bins_rows()[row]
    params = SamplingParams(1, temperature=1.0, top_p=top_p)
    us = [i / 400 for i in range(400)] + [0.9999]
    got = sample_rows_cpu(
        torch.stack([x] * len(us)), list(range(len(us))), [1.0] * len(us), [0] * len(us), [top_p] * len(us), us, isa
    )
    want = [sample_row(x, params, u) for u in us]
    assert got == want
    assert len(set(want)) > 3


@pytest.mark.skipif(not ISAS, reason=NO_C_SAMPLER)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("vocab", [37, 1021, 100_003])
def test_c_kernel_draws_the_pytorch_tokens_at_any_vocabulary_size(vocab, isa):
    # vocabularies that are no multiple of 8 or 16: the vector passes end in their scalar tails
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(vocab, generator=g) * 2
    x[-3:] += 3.0  # likely tokens in the tail
    x[torch.randperm(vocab, generator=g)[:5]] += 4.0
    us = [0.0, 0.2, 0.45, 0.61, 0.8, 0.97, 0.999]
    for params in [
        *PARAMS,
        SamplingParams(1, temperature=0.7, top_k=20),
        SamplingParams(1, temperature=2.0, top_p=0.6),
    ]:
        rows = torch.stack([x] * len(us))
        got = sample_rows_cpu(
            rows,
            list(range(len(us))),
            [params.temperature] * len(us),
            [params.top_k] * len(us),
            [params.top_p] * len(us),
            us,
            isa,
        )
        assert got == [sample_row(x, params, u) for u in us], params


@pytest.mark.skipif(not ISAS, reason=NO_C_SAMPLER)
def test_c_kernel_scratch_follows_the_vocabulary_size():
    # each thread keeps its scratch between calls: a longer row than any before must grow it
    params = SamplingParams(1, temperature=1.0, top_p=0.8)
    for vocab in (10, VOCAB + 4099, 50):
        x = torch.randn(vocab, generator=torch.Generator().manual_seed(vocab)) * 3
        rows = torch.stack([x] * 3)
        got = sample_rows_cpu(rows, [0, 1, 2], [1.0] * 3, [0] * 3, [0.8] * 3, [0.1, 0.5, 0.9])
        assert got == [sample_row(x, params, u) for u in (0.1, 0.5, 0.9)], vocab


@pytest.mark.skipif(len(ISAS) < 2, reason="one build of the C sampler runs here")
def test_every_build_draws_the_same_tokens():
    # the builds compute the same bits (exp, bins, block masses), so even draws near a boundary agree
    g = torch.Generator().manual_seed(11)
    us = torch.rand(64, generator=g, dtype=torch.float64).tolist()
    for kind in ("peaked", "spread", "flat"):
        x = logits_of(kind, seed=6)[: VOCAB - 5]  # with tails
        for params in PARAMS:
            args = (
                torch.stack([x] * len(us)),
                list(range(len(us))),
                [params.temperature] * len(us),
                [params.top_k] * len(us),
                [params.top_p] * len(us),
                us,
            )
            tokens = [sample_rows_cpu(*args, isa) for isa in ISAS]
            assert all(t == tokens[0] for t in tokens), (kind, params)


@pytest.mark.parametrize("path", ["c", "torch"])
def test_frequencies_follow_the_distribution(path):
    if path == "c" and not ISAS:
        pytest.skip(NO_C_SAMPLER)
    x = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    params = SamplingParams(1, temperature=1.0, top_p=0.9)
    probs = reference_probs(x, params)
    g = torch.Generator().manual_seed(1234)
    n = 20000
    if path == "c":
        draws = sample_rows_cpu(x[None], [0] * n, [1.0] * n, [0] * n, [0.9] * n, [uniform(g) for _ in range(n)])
    else:
        draws = [sample_row(x, params, uniform(g)) for _ in range(n)]
    counts = torch.bincount(torch.tensor(draws), minlength=6).double()
    expected = probs * n
    assert counts[probs == 0].sum() == 0  # dropped by top-p: never drawn
    sigma = (expected * (1 - probs)).sqrt()
    assert torch.all((counts - expected).abs()[probs > 0] < 4 * sigma[probs > 0]), (counts, expected)


def test_rows_are_independent_of_their_batch():
    logits = torch.stack([logits_of("peaked", s) for s in range(4)])
    params = [SamplingParams(1, temperature=0.8, top_p=0.95, seed=s) for s in range(4)]
    params[1] = SamplingParams(1)  # greedy

    def gens():
        return [torch.Generator().manual_seed(s) for s in range(4)]

    together = sample(logits, params, gens())
    for r in range(4):
        alone = sample(logits[r : r + 1], [params[r]], [gens()[r]])
        assert alone[0].token_id == together[r].token_id
    assert together[1].token_id == int(torch.argmax(logits[1]))


def test_greedy_takes_the_first_of_tied_maxima():
    x = torch.zeros(10)
    x[[3, 7]] = 5.0
    assert sample(x[None], [SamplingParams(1)], [None])[0].token_id == 3
