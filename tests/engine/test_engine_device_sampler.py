"""The device sampler (salon/engine/worker/device_sampler.py) against the host sampler, on CPU tensors.

On a CPU the device sampler's generator is a CPU generator seeded as the request's, so it draws the host
sampler's uniforms, and its arithmetic is the reference's: every token, log-prob and top log-prob must be the
host sampler's exactly. Apart from that: the kept set against sampler.kept_tokens (ties decided by the rank
order), batch independence and run-to-run identity, the drawn distribution, and speculative verification
through an engine (same tokens with drafts as without). The same checks on CUDA: test_engine_device_sampler_gpu.
"""

from __future__ import annotations

import types
import zlib

import pytest
import torch

from salon.engine.request import SamplingParams
from salon.engine.worker.device_sampler import DeviceSampler
from salon.engine.worker.device_sampling import apply_penalties_rows, draw_rows, kept_weights
from salon.engine.worker.model_loading import load_model
from salon.engine.worker.sampler import DraftHistory, apply_penalties, effective_top_k, kept_tokens, sample
from tests.engine.test_engine_speculative import OracleProposer
from tests.engine_testlib import make_core, make_request, run

VOCAB = 4096
PROMPT = [2, 5, 9, 11, 5, 300]
SPECS = [
    {},
    {"repetition_penalty": 1.3, "frequency_penalty": 0.5, "presence_penalty": 0.3},
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 1.1, "top_k": 40, "repetition_penalty": 1.2},
    {"temperature": 0.7, "min_p": 0.05, "return_logprobs": True, "num_top_logprobs": 3},
    {"temperature": 1.0, "num_top_logprobs": 2, "presence_penalty": 0.7, "frequency_penalty": -0.4},
    {"temperature": 0.9, "top_k": 300, "top_p": 0.8, "min_p": 0.001, "return_logprobs": True},
    {"return_logprobs": True, "repetition_penalty": 0.8},
]


def requests(specs=SPECS, prefix="r"):
    return [make_request(f"{prefix}{i}", PROMPT, 64, seed=100 + i, **s) for i, s in enumerate(specs)]


def chunks_of(reqs, drafts=None):
    return [types.SimpleNamespace(request=r, draft_token_ids=(drafts or {}).get(r.request_id, [])) for r in reqs]


def step_logits(request_id: str, step: int) -> torch.Tensor:
    """A logits row that depends only on (request, step): the same in every batch."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{request_id}:{step}".encode()))
    return torch.randn(VOCAB, generator=g) * 3


def decode(sampler: DeviceSampler, reqs, steps: int) -> dict[str, list]:
    """Run `steps` decode steps of the requests, appending each sampled token as the engine does."""
    out: dict[str, list] = {r.request_id: [] for r in reqs}
    for step in range(steps):
        logits = torch.stack([step_logits(r.request_id, step) for r in reqs])
        tokens, _, _ = sampler.sample(logits, chunks_of(reqs))
        for r, t in zip(reqs, tokens):
            r.output_token_ids.append(t.token_id)
            out[r.request_id].append(t)
    return out


def test_every_row_is_the_host_samplers_exactly():
    """Greedy rows with and without penalties, sampled rows, log-probs: the host sampler's tokens and values."""
    device_reqs, host_reqs = requests(), requests()
    sampler = DeviceSampler("cpu")
    for step in range(8):
        logits = torch.stack([step_logits(r.request_id, step) for r in device_reqs])
        got, _, _ = sampler.sample(logits, chunks_of(device_reqs))
        want = sample(logits, [r.sampling for r in host_reqs], [r.generator for r in host_reqs], host_reqs)
        assert got == want, step
        for d, h, t in zip(device_reqs, host_reqs, got):
            d.output_token_ids.append(t.token_id)
            h.output_token_ids.append(t.token_id)


def test_penalties_of_a_row_are_apply_penalties_bits():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, VOCAB, generator=g) * 4
    params = [SPECS[1], {"repetition_penalty": 0.7, "presence_penalty": -1.5}, {}]
    history = [([1, 2, 3], [3, 3, 7, 4000]), ([9], [9, 9, 9]), ([5], [6])]
    counts = torch.zeros(3, VOCAB, dtype=torch.int32)
    seen = torch.zeros(3, VOCAB, dtype=torch.bool)
    for r, (prompt, output) in enumerate(history):
        for t in output:
            counts[r, t] += 1
        seen[r, prompt + output] = True
    p = [SamplingParams(1, **s) for s in params]
    got = apply_penalties_rows(
        logits,
        torch.tensor([x.repetition_penalty for x in p]),
        torch.tensor([x.frequency_penalty for x in p]),
        torch.tensor([x.presence_penalty for x in p]),
        counts,
        seen,
    )
    for r, (prompt, output) in enumerate(history):
        assert torch.equal(got[r], apply_penalties(logits[r], p[r], DraftHistory(prompt, output))), r


def awkward_logits(seed: int) -> torch.Tensor:
    """Rows with many ties (logits on a coarse grid), huge and tiny values, a constant row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.round(torch.randn(4, 512, generator=g) * 2) / 2
    x[1, :7] = 80.0  # a few tokens hold all the mass; exp underflows for the rest
    x[2] = 0.25  # every token tied
    x[3, ::5] = -1e30
    return x


KEPT_PARAMS = [
    SamplingParams(1, temperature=0.7, top_p=0.9),
    SamplingParams(1, temperature=1.3, top_p=0.5),
    SamplingParams(1, temperature=1.0, top_k=40),
    SamplingParams(1, temperature=0.9, top_k=300, top_p=0.8),
    SamplingParams(1, temperature=1.0),
    SamplingParams(1, temperature=0.6, min_p=0.2),
    SamplingParams(1, temperature=1.0, top_k=10, min_p=0.5, top_p=0.95),
    SamplingParams(1, temperature=2.0, top_k=1),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("params", KEPT_PARAMS)
def test_kept_set_is_the_references(seed, params):
    """Exactly the reference's kept set: as many tokens, the same logits; among tokens tied at the cut the
    lower ids (the rank order's tie rule, where torch.topk's choice is unspecified)."""
    x = awkward_logits(seed)
    rows = x.shape[0]
    kept, weights = kept_weights(
        x,
        torch.full((rows,), params.temperature),
        torch.full((rows,), params.top_k),
        torch.full((rows,), params.top_p, dtype=torch.float64),
        torch.full((rows,), torch.tensor(params.min_p).log().item() if params.min_p else float("-inf")),
    )
    for r in range(rows):
        ids, w = kept_tokens(x[r], params)
        ref = torch.arange(x.shape[1]) if ids is None else ids
        mine = torch.nonzero(kept[r]).flatten()
        assert mine.numel() == ref.numel(), (r, params)
        assert torch.equal(x[r, mine].sort().values, x[r, ref].sort().values), (r, params)
        by_rank = torch.sort(x[r], descending=True, stable=True).indices[: mine.numel()]
        assert torch.equal(mine, by_rank.sort().values), (r, params)
        assert torch.equal(weights[r, mine].sort().values, w.sort().values), (r, params)
        assert torch.all(weights[r][~kept[r]] == 0)


def test_min_p_cuts_top_k_like_effective_top_k():
    x = awkward_logits(5)
    for p in (0.01, 0.3, 0.9):
        params = SamplingParams(1, temperature=0.8, min_p=p)
        kept, _ = kept_weights(
            x,
            torch.full((4,), 0.8),
            torch.zeros(4, dtype=torch.int64),
            torch.ones(4, dtype=torch.float64),
            torch.full((4,), torch.tensor(p, dtype=torch.float64).log().item()),
        )
        assert kept.sum(-1).tolist() == [effective_top_k(x[r], params) for r in range(4)]


def test_drawn_tokens_follow_the_kept_probabilities():
    """A seeded chi-square check: 6000 draws over a vocabulary of 8 against the kept probabilities."""
    x = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2])
    n = 6000
    rows = x.expand(n, -1).contiguous()
    kept, weights = kept_weights(
        rows, torch.ones(n), torch.full((n,), 6), torch.full((n,), 0.95, dtype=torch.float64), torch.full((n,), -1e9)
    )
    u = torch.rand(n, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    counts = torch.bincount(draw_rows(kept, weights, u), minlength=8).double()
    probs = weights[0] / weights[0].sum()
    assert counts[probs == 0].sum() == 0  # dropped: never drawn
    expected = probs[probs > 0] * n
    chi2 = float(((counts[probs > 0] - expected) ** 2 / expected).sum())
    # 6 kept tokens, 5 degrees of freedom: P(chi2 > 20.5) < 0.001.
    assert chi2 < 20.5, (counts, expected)


def test_a_rounding_overshoot_takes_the_last_kept_token():
    kept = torch.tensor([[True, False, True, False]])
    weights = torch.tensor([[1.0, 0.0, 2.0, 0.0]], dtype=torch.float64)
    assert draw_rows(kept, weights, torch.tensor([1.0], dtype=torch.float64)).tolist() == [2]
    assert draw_rows(kept, weights, torch.tensor([0.0], dtype=torch.float64)).tolist() == [0]


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_a_request_draws_the_same_tokens_in_any_batch(batch):
    """The same request (seeded, penalties, min_p) alone and among batch - 1 other requests; and two runs."""
    spec = {"temperature": 0.9, "top_p": 0.95, "min_p": 0.01, "repetition_penalty": 1.2, "num_top_logprobs": 2}
    alone = decode(DeviceSampler("cpu"), requests([spec], "x"), 10)["x0"]
    others = requests(SPECS[: batch - 1])
    mixed = [*others[: len(others) // 2], *requests([spec], "x"), *others[len(others) // 2 :]]
    together = decode(DeviceSampler("cpu"), mixed, 10)["x0"]
    assert together == alone
    assert decode(DeviceSampler("cpu"), requests([spec], "x"), 10)["x0"] == alone


def test_a_resumed_request_skips_the_draws_of_the_tokens_it_came_with():
    """A failover resume's tokens each used one draw: its first sampled token takes the seed's next draw."""
    sampler = DeviceSampler("cpu")
    fresh = make_request("a", PROMPT, 8, seed=9, temperature=1.0)
    resumed = make_request("b", PROMPT, 8, seed=9, temperature=1.0)
    resumed.output_token_ids = [5, 6]
    logits = step_logits("a", 0)[None]
    draws = [sampler.sample(logits, chunks_of([fresh]))[0][0].token_id for _ in range(3)]
    assert draws[2] != draws[0]
    assert sampler.sample(logits, chunks_of([resumed]))[0][0].token_id == draws[2]


@pytest.fixture(scope="module")
def tiny():
    return load_model("synthetic-tiny-v4k", "int8")


def device_sampled(core):
    core.runner.device_sampler = DeviceSampler("cpu")
    return core


ENGINE_SPECS = [
    {"temperature": 0.9, "top_p": 0.9},
    {"repetition_penalty": 1.3, "frequency_penalty": 0.4},
    {"temperature": 0.8, "top_k": 20, "presence_penalty": 0.6, "return_logprobs": True},
    {"return_logprobs": True, "num_top_logprobs": 2},
]


def engine_requests():
    prompts = [[2] + [(7 * i + 13 * s) % 3000 + 50 for i in range(12)] + [60, 61, 62, 60, 61, 62] for s in range(4)]
    return [make_request(f"e{i}", p, 16, seed=40 + i, **s) for i, (p, s) in enumerate(zip(prompts, ENGINE_SPECS))]


def test_engine_with_the_device_sampler_gives_the_host_samplers_tokens(tiny):
    host, _ = run(make_core(tiny), engine_requests())
    device, _ = run(device_sampled(make_core(tiny)), engine_requests())
    assert device == host


@pytest.mark.parametrize("corrupt_every", [0, 3])
def test_speculative_rows_give_the_tokens_of_a_run_without_drafts(tiny, corrupt_every):
    """Drafts verified as extra rows (penalties counting the drafts before a row, the generator rewound to
    the produced rows) leave every request's tokens as without drafts: an oracle proposes each request's
    true continuation, every draft right (0) or every third one wrong (3)."""
    plain, _ = run(device_sampled(make_core(tiny)), engine_requests())
    reference = {r.request_id: list(r.prompt_token_ids) + plain[r.request_id] for r in engine_requests()}
    core = device_sampled(make_core(tiny, speculative_tokens=4, speculative_max_rows=0))
    core.scheduler.proposer = OracleProposer(4, reference, lambda p: corrupt_every > 0 and p % corrupt_every == 0)
    spec, _ = run(core, engine_requests())
    assert core.num_accepted_draft_tokens > 0
    assert (core.num_accepted_draft_tokens < core.num_draft_tokens) == (corrupt_every > 0)
    assert spec == plain
