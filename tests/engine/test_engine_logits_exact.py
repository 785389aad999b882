"""Exactness on logits, not only on greedy tokens: a request's logits rows are bit-for-bit the same
alone or batched, prefilled in one chunk or many, with or without a device or host cache hit.

On Gemma 3 270M (int8, the default path) for the fixed cases, and on synthetic-tiny for a seeded
randomized mix of requests, chunk budgets and cache states. Rows are captured through
ModelRunner.logits_observer; every comparison is torch.equal.
"""

from __future__ import annotations

import json
import random

import pytest

from salon.common.prefix_hash import namespace_digest
from salon.engine.prefix.hit import host_hit
from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import BLOCK_SIZE_TOKENS as BS
from tests.engine_testlib import (
    assert_rows_equal,
    logits_rows,
    make_core,
    make_request,
    tokens,
)
from tests.model.conftest import reference_path


def kv_bytes_for(model, num_blocks: int) -> int:
    from salon.engine.kv.kv_layout import plan_layout

    return plan_layout(model.config, BS, 1 << 30).page_bytes * num_blocks


# ---- Gemma: the fixed cases ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma-3-270m", "int8")


@pytest.fixture(scope="module")
def prompts():
    return [
        json.loads(line)["prompt_ids"]
        for line in reference_path("greedy_ref_f64.jsonl").read_text().splitlines()
        if line.strip()
    ]


NS = namespace_digest("gemma-3-270m", "logits-test", "tenant")
NEW = 6


@pytest.mark.slow
def test_gemma_logits_alone_batched_chunked_and_cached(gemma, prompts):
    target = prompts[6] + prompts[3][1:]  # 617 tokens: crosses the 512-token window
    ns_request = lambda rid, ids, **kw: make_request(rid, ids, NEW, namespace=NS, max_context_tokens=32768, **kw)
    alone = logits_rows(
        make_core(gemma, budget=4096, kv_bytes=64 << 20, prefix_caching=False),
        [make_request("t", target, NEW, max_context_tokens=32768)],
    )["t"]

    chunked = logits_rows(
        make_core(gemma, budget=37, kv_bytes=64 << 20, prefix_caching=False),
        [make_request("t", target, NEW, max_context_tokens=32768)],
    )["t"]
    assert_rows_equal(chunked, alone)

    others = [
        make_request("o1", prompts[0], NEW),
        make_request("o2", prompts[7], NEW, temperature=0.8, seed=1),
        make_request("o3", prompts[4], NEW, temperature=1.0, top_k=20, seed=2),
    ]
    batched = logits_rows(
        make_core(gemma, budget=96, kv_bytes=64 << 20, prefix_caching=False),
        [others[0], make_request("t", target, NEW, max_context_tokens=32768), others[1], others[2]],
    )
    assert_rows_equal(batched["t"], alone)

    # Device hit: an earlier request computed the first 405 tokens and its reply on the same engine; the hit
    # runs on into block 25 as far as those tokens agree with the target, and the request writes that block
    # from its middle.
    core = make_core(gemma, budget=256, kv_bytes=64 << 20)
    puts = []
    core.set_host_sink(puts.append)
    first = ns_request("p", target[:405])
    logits_rows(core, [first])
    computed = target[:405] + first.output_token_ids[:-1]
    shared = next(i for i, (a, b) in enumerate(zip(computed + [-1], target)) if a != b)
    second = ns_request("t", target)
    device = logits_rows(core, [second])["t"]
    assert shared % BS and second.num_cached_device_tokens == shared >= 405
    assert_rows_equal(device, alone)

    # Host hit: the same prefix's KV, as the kvstore returns it, on a fresh engine.
    put = puts[0]
    n_blocks = len(put.token_ids) // BS
    hit = host_hit(n_blocks * BS, put.global_kv, put.local_kv, put.local_first_block)
    third = ns_request("t", target)
    host = logits_rows(make_core(gemma, budget=256, kv_bytes=64 << 20), [third], {"t": hit})["t"]
    assert third.num_cached_host_tokens == n_blocks * BS
    assert_rows_equal(host, alone)


# ---- synthetic-tiny: seeded random mixes --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return load_model("synthetic-tiny", "int8")


TINY_NS = namespace_digest("synthetic-tiny", "logits-test", "tenant")


@pytest.mark.parametrize("seed", range(6))
def test_random_mixes_of_requests_chunks_and_cache_states_keep_logits_bitwise(tiny, seed):
    rng = random.Random(seed)
    prompts = [tokens(rng.randint(40 if i == 0 else 5, 160), seed * 10 + i) for i in range(rng.randint(2, 5))]
    new = [rng.randint(1, 8) for _ in prompts]
    sampled = [rng.random() < 0.4 for _ in prompts]

    def request(i, namespace=None):
        kw = dict(temperature=0.9, top_p=0.95, seed=i) if sampled[i] else {}
        return make_request(f"r{i}", prompts[i], new[i], namespace=namespace, **kw)

    reference = {
        f"r{i}": logits_rows(make_core(tiny, budget=4096, prefix_caching=False), [request(i)])[f"r{i}"]
        for i in range(len(prompts))
    }

    budget = rng.choice([3, 7, 16, 64, 4096])
    state = ["none", "device", "host"][seed % 3]
    core = make_core(tiny, budget=budget, kv_bytes=kv_bytes_for(tiny[0], rng.choice([40, 400])))
    host_hits = {}
    if state != "none":  # an earlier request computed a random prefix of one of the prompts
        i = 0
        cut = rng.randint(2 * BS, len(prompts[0]))
        producer = core if state == "device" else make_core(tiny, budget=64)
        puts = []
        producer.set_host_sink(puts.append)
        logits_rows(producer, [make_request("prefix", prompts[i][:cut], 1, namespace=TINY_NS)])
        if state == "host" and puts:
            put = puts[0]
            n = len(put.token_ids) // BS
            host_hits[f"r{i}"] = host_hit(n * BS, put.global_kv, put.local_kv, put.local_first_block)
    requests = [request(i, TINY_NS) for i in range(len(prompts))]
    rows = logits_rows(core, requests, host_hits)
    for rid, want in reference.items():
        assert_rows_equal(rows[rid], want)
    cached = requests[0].num_cached_device_tokens if state == "device" else requests[0].num_cached_host_tokens
    assert (cached > 0) == (state != "none"), (state, cached)
