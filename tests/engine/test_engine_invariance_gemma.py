"""Batch and chunk invariance of greedy outputs on the default model (gemma-3-270m, int8).

A request's tokens must be identical alone, batched with other requests (greedy and sampled), with
its prompt prefilled in one chunk or in many, and after preemption (recompute). Prompts come from the
reference data; the 579-token ones cross the 512-token sliding window.
"""

from __future__ import annotations

import json

import pytest

from salon.engine.request import Request, RequestId, SamplingParams
from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import make_core
from tests.model.conftest import reference_path

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma-3-270m", "int8")


@pytest.fixture(scope="module")
def prompts():
    records = [
        json.loads(line) for line in reference_path("greedy_ref_f64.jsonl").read_text().splitlines() if line.strip()
    ]
    return [r["prompt_ids"] for r in records]


def generate(gemma, prompt_sets, budget, kv_bytes=256 << 20):
    core = make_core(gemma, budget=budget, kv_bytes=kv_bytes)
    requests = []
    for i, (ids, params) in enumerate(prompt_sets):
        r = Request(RequestId(f"r{i}"), list(ids), params, frozenset(), 32768)
        core.add(r)
        requests.append(r)
    while core.has_work():
        core.step()
    assert core.kv_manager.num_free_blocks == core.layout.num_blocks
    return [r.output_token_ids for r in requests], core


@pytest.mark.slow
def test_greedy_tokens_alone_batched_and_chunked(gemma, prompts):
    greedy = SamplingParams(max_new_tokens=NEW_TOKENS)
    target_short, target_long = prompts[3], prompts[6]  # 39 and 579 tokens
    alone_short = generate(gemma, [(target_short, greedy)], 4096)[0][0]
    alone_long = generate(gemma, [(target_long, greedy)], 4096)[0][0]
    # Many chunks (prefill in pieces of 37 tokens) ...
    chunked = generate(gemma, [(target_long, greedy)], 37)[0][0]
    assert chunked == alone_long
    # ... and batched with other greedy and sampled requests, prefills and decodes mixed in each step.
    others = [
        (prompts[0], greedy),
        (prompts[7], SamplingParams(NEW_TOKENS, temperature=0.8, seed=1)),
        (prompts[4], SamplingParams(NEW_TOKENS, temperature=1.0, top_k=20, seed=2)),
    ]
    outs, _ = generate(gemma, [others[0], (target_long, greedy), others[1], (target_short, greedy), others[2]], 96)
    assert outs[1] == alone_long
    assert outs[3] == alone_short


@pytest.mark.slow
def test_greedy_tokens_survive_preemption(gemma, prompts):
    greedy = SamplingParams(max_new_tokens=NEW_TOKENS)
    sets = [(p, greedy) for p in prompts[:6]]
    reference, _ = generate(gemma, sets, 128)
    probe_model, _ = gemma
    # About enough blocks for three of the six requests at a time: the newest get preempted.
    from salon.engine.kv.kv_layout import plan_layout

    page = plan_layout(probe_model.config, 16, 1 << 30).page_bytes
    outs, core = generate(gemma, sets, 128, kv_bytes=page * 30)
    assert core.scheduler.num_preemptions > 0
    assert outs == reference
