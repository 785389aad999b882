"""Prefix caching in the engine core (synthetic-tiny, in process): device hits, host hits, exactness.

Every cached run is compared token for token with the same request on an engine with no cache.
synthetic-tiny has 32-token sliding windows, so a 16-token block size makes hits end inside, at and
beyond the window: the usable rule and the retained window around the last message are exercised.
"""

from __future__ import annotations

import pytest
import torch

from salon.common.prefix_hash import namespace_digest
from salon.engine.prefix.hit import host_hit
from salon.engine.worker.model_loading import load_model
from tests import engine_testlib
from tests.engine_testlib import BLOCK_SIZE_TOKENS as BS
from tests.engine_testlib import blocks_accounted as accounted
from tests.engine_testlib import run_one as run
from tests.engine_testlib import tokens

NS = namespace_digest("synthetic-tiny", "test-layout", "tenant-a")


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model("synthetic-tiny", "int8")


def make_core(mt, prefix_caching=True, kv_bytes=4 << 20, budget=64):
    return engine_testlib.make_core(mt, budget=budget, kv_bytes=kv_bytes, prefix_caching=prefix_caching)


def req(rid, prompt, max_new=12, namespace=NS, retain_from=None):
    return engine_testlib.make_request(rid, prompt, max_new, namespace=namespace, retain_from=retain_from)


def reference(mt, prompt, max_new=12):
    return run(make_core(mt, prefix_caching=False), req("ref", prompt, max_new, namespace=None))


def test_next_turn_hits_the_device_cache_and_matches_no_cache(model_and_tokenizer):
    core = make_core(model_and_tokenizer)
    p1 = tokens(70, 1)
    first = req("t1", p1)
    reply = run(core, first)
    assert first.num_cached_device_tokens == 0 and accounted(core)
    computed = len(p1) + len(reply) - 1  # the last sampled token's KV is never computed
    p2 = p1 + reply + tokens(30, 2)[1:]
    second = req("t2", p2)
    out = run(core, second)
    # Every computed token: the whole blocks, then on into the block the first turn ended inside.
    assert computed % BS and second.num_cached_device_tokens == computed
    assert out == reference(model_and_tokenizer, p2)
    assert accounted(core)


def test_regenerate_and_edit_reuse_the_retained_window(model_and_tokenizer):
    core = make_core(model_and_tokenizer)
    history = tokens(90, 3)
    last_message = tokens(25, 4)[1:]
    p = history + last_message
    retain = max(0, len(history) - 32 - BS)
    out = run(core, req("t1", p, retain_from=retain))
    # Regenerate: the same prompt again; everything but its last token comes from the cache.
    regen = req("t2", p, retain_from=retain)
    assert run(core, regen) == out
    assert (len(p) - 1) % BS and regen.num_cached_device_tokens == len(p) - 1
    # Edit the last message from its 6th token on: the hit ends inside the edited message, more than a
    # window (32) after the last global-only point, so it needs the retained sliding blocks.
    edited = history + last_message[:5] + tokens(30, 5)[1:]
    edit = req("t3", edited, retain_from=retain)
    assert run(core, edit) == reference(model_and_tokenizer, edited)
    assert (len(history) + 5) % BS and edit.num_cached_device_tokens == len(history) + 5
    assert accounted(core)


def test_without_retention_an_edit_far_back_only_gets_a_usable_prefix(model_and_tokenizer):
    core = make_core(model_and_tokenizer)
    p = tokens(200, 6)
    run(core, req("t1", p))  # no retention: sliding blocks before the last window are released
    edited = p[:100] + tokens(40, 7)[1:]
    edit = req("t2", edited)
    out = run(core, edit)
    # Blocks [0, 6) match (96 tokens), but their window KV is gone: nothing usable from the device.
    assert edit.num_cached_device_tokens == 0
    assert out == reference(model_and_tokenizer, edited)


def test_tenants_never_share_entries(model_and_tokenizer):
    core = make_core(model_and_tokenizer)
    p = tokens(80, 8)
    run(core, req("a", p))
    other = req("b", p, namespace=namespace_digest("synthetic-tiny", "test-layout", "tenant-b"))
    run(core, other)
    assert other.num_cached_device_tokens == 0


def test_cache_is_reclaimed_under_memory_pressure_instead_of_refusing_work(model_and_tokenizer):
    probe = make_core(model_and_tokenizer)
    core = make_core(model_and_tokenizer, kv_bytes=probe.layout.page_bytes * 60)
    for i in range(6):
        run(core, req(f"r{i}", tokens(150, 10 + i)))
        assert accounted(core)
    assert core.scheduler.num_preemptions == 0
    assert core.prefix.device.num_entries >= 1
    core.prefix.device.clear()
    assert core.kv_manager.num_free_blocks == core.layout.num_blocks


def test_preempted_request_resumes_from_its_cached_blocks(model_and_tokenizer):
    probe = make_core(model_and_tokenizer)
    core = make_core(model_and_tokenizer, kv_bytes=probe.layout.page_bytes * 40, budget=32)
    requests = [req(f"p{i}", tokens(60 + 10 * i, 20 + i), max_new=60) for i in range(6)]
    outputs, _ = engine_testlib.run(core, requests)
    assert core.scheduler.num_preemptions > 0
    for r in requests:
        assert outputs[r.request_id] == reference(model_and_tokenizer, r.prompt_token_ids, 60)
    assert accounted(core)


def test_host_prefix_written_into_blocks_matches_no_cache(model_and_tokenizer):
    """A HostPut from one engine, served back as a host hit to another, reproduces the tokens."""
    producer = make_core(model_and_tokenizer)
    puts = []
    producer.set_host_sink(puts.append)
    p1 = tokens(100, 30)
    reply = run(producer, req("t1", p1))
    (put,) = puts
    n_blocks = len(put.token_ids) // BS
    assert put.global_kv.shape[0] == n_blocks
    # What the kvstore would hand back for a continuation at the end of the put: all global blocks,
    # the local blocks of the last window (ceil((W - 1) / BS) = 2 blocks for W = 32).
    local_first = n_blocks - 2
    assert put.local_first_block <= local_first
    local = put.local_kv[local_first - put.local_first_block :]
    prefix = host_hit(n_blocks * BS, put.global_kv, local, local_first)
    p2 = p1 + reply + tokens(20, 31)[1:]
    consumer = make_core(model_and_tokenizer)
    second = req("t2", p2)
    out = run(consumer, second, prefix)
    assert second.num_cached_host_tokens == n_blocks * BS and second.num_cached_device_tokens == 0
    assert out == reference(model_and_tokenizer, p2)
    assert accounted(consumer)


def test_corrupt_host_kv_would_change_the_output(model_and_tokenizer):
    """The host path really uses the fetched bytes (so the exactness test above can fail)."""
    producer = make_core(model_and_tokenizer)
    puts = []
    producer.set_host_sink(puts.append)
    p1 = tokens(100, 40)
    reply = run(producer, req("t1", p1))
    (put,) = puts
    n_blocks = len(put.token_ids) // BS
    noise = torch.randint(0, 256, put.global_kv.shape, generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    prefix = host_hit(n_blocks * BS, noise, put.local_kv[-2:], n_blocks - 2)
    p2 = p1 + reply + tokens(20, 41)[1:]
    second = req("t2", p2, max_new=24)
    assert run(make_core(model_and_tokenizer), second, prefix) != reference(model_and_tokenizer, p2, 24)
