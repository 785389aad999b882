"""Constrained rows in the engine core: the reply stays in its constraint and ends with it, and a constrained
row's tokens do not depend on its batch, on chunking, on a cache hit or on speculative drafts
(synthetic-tiny: random weights over the Gemma vocabulary, so without the mask its tokens would be anything)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from salon.engine.grammar.compiler import GrammarCompiler, GrammarLimits
from salon.engine.grammar.constraint import Constraint, ConstraintKind
from salon.engine.grammar.matcher import RequestGrammar
from salon.engine.request import FinishReason
from salon.engine.worker.device_sampler import DeviceSampler
from salon.engine.worker.model_loading import load_model
from tests.engine.test_engine_speculative import K, record_steps, replay
from tests.engine_testlib import blocks_accounted, make_core, make_request, run, tokens

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


# A regex whose replies repeat themselves (the n-gram proposer finds its drafts in them), and a schema of enums
# and bounded integers (no free strings: "!" is never allowed in either).
REPEATING = r"((cat|dog|bird)-[0-9]{2} ){3,6}"
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "moods": {"type": "array", "items": {"enum": ["calm", "angry", "tired"]}, "minItems": 3, "maxItems": 6},
            "level": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["moods", "level"],
        "additionalProperties": False,
    }
)
CONSTRAINTS = {
    "regex": Constraint(ConstraintKind.REGEX, REPEATING),
    "json_schema": Constraint(ConstraintKind.JSON_SCHEMA, SCHEMA, strict=True),
}
PROMPT_TEXTS = {
    "regex": ["cat-12 dog-34 cat-12 dog-34 cat-12 dog-34 ", "bird-77 bird-77 bird-77 cat-05 "],
    "json_schema": [
        '{"moods": ["calm", "calm", "angry", "calm"], "level": 7} ' * 3,
        '["tired", "tired", "tired"] ["calm", "angry", "calm"] {"level": 12}',
    ],
}
SAMPLING_KW = {"greedy": {}, "seeded": dict(temperature=0.8, top_p=0.95, seed=21)}


def constrained_specs(compiler, tok, kind: str, sampling: str, max_new: int = 64):
    """Constrained requests on prompts that repeat text of their constraint, and a free request."""

    def make():
        out = []
        for i, text in enumerate(PROMPT_TEXTS[kind]):
            r = make_request(
                f"c{i}",
                [2] + tok.encode(text, add_bos=False),
                max_new,
                stop_token_ids=frozenset(compiler.stop_token_ids),
                namespace=b"ns",
                retain_from=0,
                **dict(SAMPLING_KW[sampling], **({"seed": 21 + i} if sampling == "seeded" else {})),
            )
            r.grammar = RequestGrammar(compiler.compile_now(CONSTRAINTS[kind]), compiler.vocab_size)
            out.append(r)
        return out + [make_request("f", tokens(30, 2), 24, namespace=b"ns", retain_from=0)]

    return make


def grammar_replay(prompt, output, max_new, k, corrupt) -> tuple[int, int, int]:
    """(drafts verified, accepted, cut by the grammar) of a constrained run whose plain output is `output`
    (the whole reply, its stop token last), the oracle proposing its true continuation -- then tokens past the
    end -- with a token the grammar rejects at the positions where corrupt(p) holds: the drafts are cut at the
    first rejected one or past the stop token, and every draft left is the plain token (so accepted)."""
    drafted = accepted = cut = 0
    i = 1
    while i < len(output):
        room = min(k, max_new - i - 1)
        if room > 0:
            n = room
            for j in range(room):
                if corrupt(len(prompt) + i + j) or i + j >= len(output):
                    n = j
                    break
            drafted, accepted, cut = drafted + n, accepted + n, cut + room - n
        else:
            n = 0
        i += n + 1
    return drafted, accepted, cut


class GrammarOracle:
    """Proposes each row's true continuation (`reference`: prompt, plain reply, then tokens past its end),
    with `wrong` at every position p where corrupt(p) holds."""

    def __init__(self, k: int, reference: dict[str, list[int]], wrong: int, corrupt) -> None:
        self.num_draft_tokens, self.reference, self.wrong, self.corrupt = k, reference, wrong, corrupt

    def rule(self, rid: str):
        def propose(context: list[int], room: int) -> list[int]:
            i = len(context)
            full = self.reference[rid][i : i + min(self.num_draft_tokens, room)]
            return [self.wrong if self.corrupt(i + j) else t for j, t in enumerate(full)]

        return propose

    def propose(self, key: str, context, max_tokens: int | None = None) -> list[int]:
        return self.rule(key)(list(context), self.num_draft_tokens if max_tokens is None else max_tokens)

    def forget(self, key: str) -> None:
        pass


def every_third(p: int) -> bool:
    return p % 3 == 0


@pytest.mark.parametrize("sampling", list(SAMPLING_KW))
@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_oracle_drafts_of_constrained_rows_are_cut_by_the_grammar_and_give_the_plain_tokens(
    model_and_tokenizer, compiler, kind, sampling
):
    """The oracle proposes each row's true continuation and tokens past its end, with every third draft
    replaced by "!" (which neither constraint allows): a constrained row's drafts are cut at the first "!" and
    past its stop token, the cut tokens are counted, every draft left is accepted, and every row's tokens are
    the plain run's (the greedy fast path; the host sampler; the device sampler)."""
    _, tok = model_and_tokenizer
    make = constrained_specs(compiler, tok, kind, sampling)
    plain, plain_finish = run(make_core(model_and_tokenizer), make())
    past_end = tokens(8, 9)[1:]
    reference = {r.request_id: list(r.prompt_token_ids) + plain[r.request_id] + past_end for r in make()}
    oracle = GrammarOracle(K, reference, tok.encode("!", add_bos=False)[0], every_third)
    core = make_core(model_and_tokenizer, speculative_tokens=K, speculative_max_rows=0)  # no row cap
    core.scheduler.proposer = oracle
    steps = record_steps(core)
    requests = make()
    got, finish = run(core, requests)
    assert got == plain and finish == plain_finish
    *rows, free = requests
    want = {}
    for r in rows:
        out = plain[r.request_id]
        assert finish[r.request_id] is FinishReason.STOP_TOKEN and out[-1] in compiler.stop_token_ids
        want[r.request_id] = grammar_replay(r.prompt_token_ids, out, r.sampling.max_new_tokens, K, every_third)
        drafted = sum(c.num_draft_tokens for o in steps for c in o.chunks if c.request is r)
        assert drafted == want[r.request_id][0] > 0, (r.request_id, drafted, want)
    free_want = replay(free.prompt_token_ids, plain["f"], 24, oracle.rule("f"))
    assert core.num_draft_tokens == sum(d for d, _, _ in want.values()) + free_want[0]
    assert core.num_accepted_draft_tokens == sum(a for _, a, _ in want.values()) + free_want[1]
    assert core.scheduler.num_grammar_truncated_drafts == sum(c for _, _, c in want.values()) > 0
    assert blocks_accounted(core)
    if sampling == "seeded":  # the device sampler (on CPU tensors here) draws the host sampler's tokens
        device = make_core(model_and_tokenizer, speculative_tokens=K, speculative_max_rows=0)
        device.scheduler.proposer = oracle
        device.runner.device_sampler = DeviceSampler("cpu")
        assert run(device, make())[0] == plain
        assert device.scheduler.num_grammar_truncated_drafts == core.scheduler.num_grammar_truncated_drafts


def observe_masks(core) -> dict[str, list]:
    """Per request, the allowed tokens (finite logits) of the row of each token it kept, in order."""
    seen: dict[str, list] = {}

    def observer(owners, rows):
        for request, row in zip(owners, rows):
            seen.setdefault(request.request_id, []).append(torch.isfinite(row))

    core.runner.logits_observer = observer
    return seen


def drafts_of(steps, rid: str) -> int:
    return sum(c.num_draft_tokens for o in steps for c in o.chunks if c.request.request_id == rid)


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_ngram_drafts_of_constrained_rows_give_the_plain_tokens_and_masks(model_and_tokenizer, compiler, kind):
    """Prompts that repeat their constraint's text make the n-gram proposer draft for the constrained rows
    (greedy); with drafts, batched, alone, chunked and from a cache hit, every row gets the tokens of the plain
    run and each kept token's row the plain run's mask (the grammar rolled back after each look at drafts)."""
    _, tok = model_and_tokenizer
    make = constrained_specs(compiler, tok, kind, "greedy")
    plain_core = make_core(model_and_tokenizer)
    plain_masks = observe_masks(plain_core)
    plain, _ = run(plain_core, make())
    rows = [r.request_id for r in make()[:-1]]

    def speculative(budget: int = 256):
        core = make_core(model_and_tokenizer, budget=budget, speculative_tokens=K)
        return core, observe_masks(core), record_steps(core)

    batched, masks, steps = speculative()
    assert run(batched, make())[0] == plain
    assert all(drafts_of(steps, rid) > 0 for rid in rows), {rid: drafts_of(steps, rid) for rid in rows}
    assert batched.num_accepted_draft_tokens > 0
    for rid in rows:
        assert len(masks[rid]) == len(plain_masks[rid]) == len(plain[rid])
        assert all(torch.equal(a, b) for a, b in zip(masks[rid], plain_masks[rid])), rid
    again = make()
    assert run(batched, again)[0] == plain  # device cache hits
    assert all(r.num_cached_device_tokens > 0 for r in again)
    core, masks, _ = speculative()
    alone = make()[:1]
    assert run(core, alone)[0] == {rows[0]: plain[rows[0]]}
    chunked, _, steps = speculative(budget=7)
    assert run(chunked, make())[0] == plain
    assert any(drafts_of(steps, rid) for rid in rows)
