"""Engine core in-process: chunked prefill equivalence, batch invariance, preemption without leaks
(synthetic-tiny; the same properties on the default model are in test_engine_invariance_gemma.py)."""

from __future__ import annotations

import pytest

from salon.engine.request import FinishReason
from salon.engine.worker.model_loading import load_model
from tests import engine_testlib
from tests.engine_testlib import make_core, make_request, tokens


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model("synthetic-tiny", "int8")


def request(rid, n, prompt_seed, max_new=24, **kw):
    return make_request(rid, tokens(n, prompt_seed), max_new, **kw)


def run(core, requests):
    out, finish = engine_testlib.run(core, requests)
    assert core.kv_manager.num_free_blocks == core.layout.num_blocks
    return out, finish


def test_chunked_prefill_and_batching_give_the_same_tokens(model_and_tokenizer):
    alone, _ = run(make_core(model_and_tokenizer, budget=4096), [request("a", 150, 1)])
    chunked, _ = run(make_core(model_and_tokenizer, budget=7), [request("a", 150, 1)])
    batched, _ = run(
        make_core(model_and_tokenizer, budget=64),
        [request("x", 90, 2), request("a", 150, 1), request("y", 33, 3, temperature=1.0, seed=5)],
    )
    assert chunked["a"] == alone["a"]
    assert batched["a"] == alone["a"]
    assert len(alone["a"]) == 24


def test_preemption_recomputes_and_frees_everything(model_and_tokenizer):
    model, tok = model_and_tokenizer
    reference, _ = run(make_core(model_and_tokenizer), [request(f"r{i}", 60 + 10 * i, i, max_new=60) for i in range(6)])
    # A pool too small for all six: the newest are preempted and recomputed, tokens unchanged.
    probe = make_core(model_and_tokenizer)
    small = probe.layout.page_bytes * 40
    core = make_core(model_and_tokenizer, budget=32, kv_bytes=small)
    out, finish = run(core, [request(f"r{i}", 60 + 10 * i, i, max_new=60) for i in range(6)])
    assert core.scheduler.num_preemptions > 0
    assert out == reference
    assert set(finish.values()) == {FinishReason.LENGTH}


def test_abort_and_stop_conditions_free_blocks(model_and_tokenizer):
    core = make_core(model_and_tokenizer, budget=16)
    a, b = request("a", 100, 1, max_new=50), request("b", 40, 2, max_new=50)
    core.add(a)
    core.add(b)
    core.step()
    assert core.kv_manager.num_held_blocks("a") > 0
    event = core.abort("a", FinishReason.ABORTED)
    assert event.finish_reason is FinishReason.ABORTED
    assert core.kv_manager.num_held_blocks("a") == 0
    core.abort("b", FinishReason.ERROR, "boom")
    assert core.kv_manager.num_free_blocks == core.layout.num_blocks and not core.has_work()
    # A stop token taken from the greedy output ends the reply right there.
    ref, _ = run(core, [request("c", 30, 3, max_new=10)])
    stop_at = ref["c"][3]
    r = request("d", 30, 3, max_new=10)
    r.stop_token_ids = frozenset({stop_at})
    out, finish = run(core, [r])
    assert out["d"] == ref["c"][: ref["c"].index(stop_at) + 1]
    assert finish["d"] is FinishReason.STOP_TOKEN


def test_sliding_layers_hold_bounded_blocks_during_long_decode(model_and_tokenizer):
    core = make_core(model_and_tokenizer, budget=64)
    r = request("long", 200, 4, max_new=300)
    core.add(r)
    sliding = [g.group_id for g in core.layout.groups if g.sliding_window_tokens is not None]
    while core.has_request("long"):
        core.step()
        if core.has_request("long"):
            tables = core.kv_manager.block_tables("long")
            for g in sliding:
                window = core.layout.groups[g].sliding_window_tokens
                assert sum(b is not None for b in tables[g]) <= -(-(window - 1 + 64) // 16) + 1
    assert core.kv_manager.num_free_blocks == core.layout.num_blocks


def test_a_plain_greedy_step_takes_the_output_projections_argmax(model_and_tokenizer, monkeypatch):
    """The rescored output projection gives each row's argmax on the way (model.logits_and_argmax): a step of plain
    greedy rows takes its tokens from it, read from no logits row, and they are the logits' argmax; a grammar's row
    (its logits masked after the projection) takes the masked logits' argmax (test_engine_grammar.py)."""
    from salon.engine.worker import model_runner

    model, _ = model_and_tokenizer
    assert model.lm_head.rescored
    core = make_core(model_and_tokenizer, budget=4096)
    seen, calls = [], []
    monkeypatch.setattr(model_runner, "greedy_ids", lambda logits: calls.append(logits) or [])
    logits_and_argmax = model.logits_and_argmax

    def observed(hidden):
        logits, argmax = logits_and_argmax(hidden)
        seen.append((logits.argmax(-1).tolist(), argmax.tolist()))
        return logits, argmax

    monkeypatch.setattr(model, "logits_and_argmax", observed)
    out, _ = run(core, [request("a", 40, 1, max_new=6), request("b", 17, 2, max_new=6)])
    assert not calls
    assert len(out["a"]) == 6 and len(out["b"]) == 6
    assert seen and all(want == got for want, got in seen)
    assert [ids[0] for ids in out.values()] == seen[0][1]
