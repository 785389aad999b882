"""The device sampler on CUDA (skipped without it): the engine picks it by itself on a CUDA device; greedy rows
with and without penalties give the host sampler's ids; sampled rows are batch independent, the same run after
run, keep the reference's set and follow its distribution; speculative rows give the tokens of a run without
drafts. CUDA's exp and scans round differently from the CPU's, so sampled tokens are not compared with the host
sampler's, and log-probs only to float tolerance."""

from __future__ import annotations

import pytest
import torch

from salon.engine.worker.device_sampler import DeviceSampler
from salon.engine.worker.device_sampling import draw_rows, kept_weights
from salon.engine.worker.model_loading import load_model
from salon.engine.worker.sampler import kept_tokens, sample
from tests.engine.test_engine_device_sampler import (
    KEPT_PARAMS,
    SPECS,
    chunks_of,
    engine_requests,
    requests,
    step_logits,
)
from tests.engine.test_engine_speculative import OracleProposer
from tests.engine_testlib import make_core, run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def decode_on_cuda(reqs, steps: int) -> dict[str, list]:
    sampler = DeviceSampler("cuda")
    out: dict[str, list] = {r.request_id: [] for r in reqs}
    for step in range(steps):
        logits = torch.stack([step_logits(r.request_id, step) for r in reqs]).cuda()
        tokens, _, _ = sampler.sample(logits, chunks_of(reqs))
        for r, t in zip(reqs, tokens):
            r.output_token_ids.append(t.token_id)
            out[r.request_id].append(t)
    return out


def test_greedy_rows_are_the_host_samplers_and_logprobs_close():
    greedy = [s for s in SPECS if "temperature" not in s]
    device_reqs, host_reqs = requests(greedy), requests(greedy)
    sampler = DeviceSampler("cuda")
    for step in range(6):
        logits = torch.stack([step_logits(r.request_id, step) for r in device_reqs])
        got, _, _ = sampler.sample(logits.cuda(), chunks_of(device_reqs))
        want = sample(logits, [r.sampling for r in host_reqs], [r.generator for r in host_reqs], host_reqs)
        assert [t.token_id for t in got] == [t.token_id for t in want], step
        for g, w in zip(got, want):
            if w.logprob is not None:
                assert abs(g.logprob - w.logprob) < 1e-4
        for d, h, t in zip(device_reqs, host_reqs, got):
            d.output_token_ids.append(t.token_id)
            h.output_token_ids.append(t.token_id)


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_a_request_draws_the_same_tokens_in_any_batch_and_run(batch):
    spec = {"temperature": 0.9, "top_p": 0.95, "min_p": 0.01, "repetition_penalty": 1.2, "num_top_logprobs": 2}
    alone = decode_on_cuda(requests([spec], "x"), 10)["x0"]
    others = requests(SPECS[: batch - 1])
    together = decode_on_cuda([*others, *requests([spec], "x")], 10)["x0"]
    assert together == alone
    assert decode_on_cuda(requests([spec], "x"), 10)["x0"] == alone


@pytest.mark.parametrize("params", KEPT_PARAMS)
def test_kept_set_is_the_references_on_cuda(params):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 262_144, generator=g)
    x[:, :12] += 14.0
    rows = x.shape[0]
    kept, _ = kept_weights(
        x.cuda(),
        torch.full((rows,), params.temperature, device="cuda"),
        torch.full((rows,), params.top_k, device="cuda"),
        torch.full((rows,), params.top_p, dtype=torch.float64, device="cuda"),
        torch.full((rows,), torch.tensor(params.min_p).log().item() if params.min_p else float("-inf"), device="cuda"),
    )
    for r in range(rows):
        ids, _ = kept_tokens(x[r], params)
        ref = torch.arange(x.shape[1]) if ids is None else ids.sort().values
        assert torch.equal(torch.nonzero(kept[r].cpu()).flatten(), ref), (r, params)


def test_drawn_tokens_follow_the_kept_probabilities_on_cuda():
    x = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2], device="cuda")
    n = 6000
    kept, weights = kept_weights(
        x.expand(n, -1).contiguous(),
        torch.ones(n, device="cuda"),
        torch.full((n,), 6, device="cuda"),
        torch.full((n,), 0.95, dtype=torch.float64, device="cuda"),
        torch.full((n,), -1e9, device="cuda"),
    )
    u = torch.rand(n, generator=torch.Generator("cuda").manual_seed(7), dtype=torch.float64, device="cuda")
    counts = torch.bincount(draw_rows(kept, weights, u), minlength=8).double().cpu()
    probs = (weights[0] / weights[0].sum()).cpu()
    assert counts[probs == 0].sum() == 0
    expected = probs[probs > 0] * n
    assert float(((counts[probs > 0] - expected) ** 2 / expected).sum()) < 20.5


@pytest.fixture(scope="module")
def tiny_cuda():
    return load_model("synthetic-tiny-v4k", "int8", "cuda", kernels="triton")


def test_speculative_rows_on_cuda_give_the_tokens_of_a_run_without_drafts(tiny_cuda):
    plain_core = make_core(tiny_cuda, device="cuda", kernels="triton")
    assert plain_core.runner.device_sampler is not None  # chosen by itself on CUDA
    plain, _ = run(plain_core, engine_requests())
    again, _ = run(make_core(tiny_cuda, device="cuda", kernels="triton"), engine_requests())
    assert again == plain
    reference = {r.request_id: list(r.prompt_token_ids) + plain[r.request_id] for r in engine_requests()}
    core = make_core(tiny_cuda, device="cuda", kernels="triton", speculative_tokens=4, speculative_max_rows=0)
    core.scheduler.proposer = OracleProposer(4, reference, lambda p: p % 3 == 0)
    spec, _ = run(core, engine_requests())
    assert core.num_accepted_draft_tokens > 0
    assert spec == plain


def test_masked_rows_never_take_a_masked_token_and_greedy_ones_are_the_host_samplers():
    specs = [
        {"logit_bias": ((3, -100.0), (4, 2.5)), "return_logprobs": True},
        {"min_tokens": 4, "min_tokens_mask_ids": (7, 8)},
        {"temperature": 0.9, "top_p": 0.8, "logit_bias": ((7, 6.0), (100, -100.0))},
        {"temperature": 1.0, "min_tokens": 3, "min_tokens_mask_ids": (7, 8), "repetition_penalty": 1.3},
    ]
    device_reqs, host_reqs = requests(specs, "mask"), requests(specs, "mask")
    sampler = DeviceSampler("cuda")
    for step in range(6):
        logits = torch.stack([step_logits(r.request_id, step) for r in device_reqs])
        logits[:, [3, 7, 8, 100]] += 8.0  # the masked tokens made likely, so the masks decide
        got, _, _ = sampler.sample(logits.cuda(), chunks_of(device_reqs))
        want = sample(logits, [r.sampling for r in host_reqs], [r.generator for r in host_reqs], host_reqs)
        for i in (0, 1):  # greedy rows
            assert got[i].token_id == want[i].token_id, (step, i)
        for d, h, t in zip(device_reqs, host_reqs, got):
            assert t.token_id not in d.sampling.masked_token_ids(d.num_output_tokens), step
            d.output_token_ids.append(t.token_id)
            h.output_token_ids.append(t.token_id)
