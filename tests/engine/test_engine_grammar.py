"""Constrained rows in the engine core: the reply stays in its constraint and ends with it, and a constrained
row's tokens do not depend on its batch, on chunking or on a cache hit, and it gets no speculative drafts
(synthetic-tiny: random weights over the Gemma vocabulary, so without the mask its tokens would be anything)."""

from __future__ import annotations

import re

import pytest

from salon.engine.grammar.compiler import GrammarCompiler, GrammarLimits
from salon.engine.grammar.constraint import Constraint, ConstraintKind
from salon.engine.grammar.matcher import RequestGrammar
from salon.engine.request import FinishReason
from salon.engine.worker.model_loading import load_model
from tests.engine.test_engine_speculative import OracleProposer, record_steps
from tests.engine_testlib import make_core, make_request, run, tokens

REGEX = r"(cat|dog|bird)-[0-9]{2,4}"


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model("synthetic-tiny", "int8")


@pytest.fixture(scope="module")
def compiler(model_and_tokenizer):
    model, tok = model_and_tokenizer
    compiler = GrammarCompiler(tok, model.config.eos_token_ids, GrammarLimits(compile_workers=0))
    yield compiler
    compiler.close()


def constrained(compiler, rid, prompt_seed, constraint, **sampling):
    r = make_request(rid, tokens(40, prompt_seed), 24, stop_token_ids=frozenset(compiler.stop_token_ids), **sampling)
    r.grammar = RequestGrammar(compiler.compile_now(constraint), compiler.vocab_size)
    return r


def test_a_constrained_row_is_the_same_alone_batched_chunked_and_cached(model_and_tokenizer, compiler):
    _, tok = model_and_tokenizer
    regex = Constraint(ConstraintKind.REGEX, REGEX)

    def row():
        return constrained(compiler, "c", 1, regex, temperature=1.0, seed=11, namespace=b"ns", retain_from=0)

    alone_out, alone_finish = run(make_core(model_and_tokenizer, budget=4096), [row()])
    chunked_out, _ = run(make_core(model_and_tokenizer, budget=7), [row()])
    batched_out, _ = run(
        make_core(model_and_tokenizer, budget=64),
        [
            make_request("x", tokens(90, 2), 24),
            row(),
            make_request("y", tokens(33, 3), 24, temperature=1.0, seed=5),
            constrained(compiler, "z", 4, Constraint(ConstraintKind.CHOICE, choices=("left", "right")), seed=3),
        ],
    )
    cached_core = make_core(model_and_tokenizer, budget=4096)
    run(cached_core, [row()])
    again = row()
    cached_out, _ = run(cached_core, [again])
    assert again.num_cached_device_tokens > 0
    *reply, stop = alone_out["c"]
    assert re.fullmatch(REGEX, tok.decode(reply)), tok.decode(reply)
    assert alone_finish["c"] is FinishReason.STOP_TOKEN
    assert stop in compiler.stop_token_ids
    assert chunked_out["c"] == batched_out["c"] == cached_out["c"] == alone_out["c"]
    assert tok.decode(batched_out["z"][:-1]) in ("left", "right")


def test_constrained_rows_get_no_drafts(model_and_tokenizer, compiler):
    """Speculative decoding proposes drafts for the free row (the positive control) and never for the constrained
    one; both give the tokens of a run without drafts."""
    regex = Constraint(ConstraintKind.REGEX, REGEX)

    def pair():
        return [
            constrained(compiler, "c", 1, regex, temperature=1.0, seed=11),
            make_request("f", tokens(30, 2), 24),
        ]

    plain, _ = run(make_core(model_and_tokenizer), pair())
    requests = pair()
    reference = {r.request_id: list(r.prompt_token_ids) + plain[r.request_id] for r in requests}
    core = make_core(model_and_tokenizer, speculative_tokens=3)
    core.scheduler.proposer = OracleProposer(3, reference, lambda p: False)
    steps = record_steps(core)
    drafted, _ = run(core, requests)
    assert drafted == plain
    drafts = {
        rid: sum(c.num_draft_tokens for o in steps for c in o.chunks if c.request.request_id == rid) for rid in "cf"
    }
    assert drafts["f"] > 0 and drafts["c"] == 0, drafts
