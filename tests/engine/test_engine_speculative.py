"""Speculative decoding is exact: with it on, every request gets the same token ids, log-probs and
top log-probs as with it off -- greedy, seeded sampling, penalties; alone and in batch mixes; with
device and host cache hits; through stop tokens, stop strings, preemption and abort -- and the KV it
leaves in the caches is bit-for-bit the KV of the plain run.

Acceptance counts are exact too: `replay` re-runs the proposer over the plain run's output (the
drafts each step would get, and how many of them the plain tokens confirm), and the engine's totals
must equal it. Synthetic-tiny with an oracle proposer (the plain run's true continuation, some drafts
corrupted on purpose) exercises acceptance and rejection at every position; the n-gram proposer runs
on synthetic-tiny mixes and on Gemma (a repetitive prompt, mostly accepted; a random one, mostly
rejected).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch

from salon.common.prefix_hash import namespace_digest
from salon.engine.core.ngram_proposer import NgramProposer, propose_reference
from salon.engine.prefix.hit import host_hit
from salon.engine.request import FinishReason
from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import blocks_accounted, make_core, make_request, tokens

K = 4
NS = namespace_digest("synthetic-tiny", "spec-test", "tenant")


@pytest.fixture(scope="module")
def tiny():
    return load_model("synthetic-tiny", "int8")


@dataclass
class Stream:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list
    text: str
    finish: FinishReason | None


def check_blocks_follow_computed_tokens(core) -> None:
    """After any step, a request holds exactly the blocks of its computed tokens (as after a plain
    decode step): the rejected drafts' blocks went back to the pool."""
    kv = core.kv_manager
    for r in core.scheduler.running:
        if kv.has_blocks(r.request_id):
            for table in kv.block_tables(r.request_id):
                assert len(table) == core.layout.blocks_for_tokens(r.num_computed_tokens), r.request_id


def drive(
    core, requests, host_hits=None, until: Callable[[object], bool] | None = None, out: dict[str, Stream] | None = None
) -> dict[str, Stream]:
    """Add the requests, step until idle (or until `until(core)`), collecting every event's parts (into `out`,
    which holds the streams of requests added before, where given)."""
    for r in requests:
        core.add(r, (host_hits or {}).get(r.request_id))
    out = {} if out is None else out
    out.update({r.request_id: Stream([], [], [], "", None) for r in requests})
    while core.has_work() and not (until is not None and until(core)):
        for e in core.step():
            s = out[e.request_id]
            s.token_ids += e.token_ids
            s.logprobs += e.logprobs
            s.top_logprobs += e.top_logprobs
            s.text += e.text
            s.finish = e.finish_reason or s.finish
        check_blocks_follow_computed_tokens(core)
    return out


def replay(
    prompt: Sequence[int], output: Sequence[int], max_new: int, propose: Callable[[list[int], int], list[int]]
) -> tuple[int, int]:
    """(drafts proposed, drafts accepted) of a speculative run whose plain output is `output`: the first
    token comes from the prefill; then each step proposes drafts for the context so far (at most what
    max_new_tokens leaves after one more token) and keeps the prefix the plain tokens confirm, plus one."""
    drafts = accepted = 0
    i = 1
    while i < len(output):
        d = propose(list(prompt) + list(output[:i]), max_new - i - 1) if max_new - i - 1 > 0 else []
        a = 0
        while a < len(d) and i + a < len(output) and d[a] == output[i + a]:
            a += 1
        drafts, accepted = drafts + len(d), accepted + a
        i += a + 1
    return drafts, accepted


def ngram_rule(context: list[int], room: int) -> list[int]:
    return propose_reference(context, min(K, room), 2, 4)


class OracleProposer:
    """Proposes the plain run's true continuation, with the draft for every position p where
    corrupt(p) holds replaced by a wrong token: acceptance and rejection at chosen positions."""

    def __init__(self, k: int, reference: dict[str, list[int]], corrupt: Callable[[int], bool]) -> None:
        self.num_draft_tokens = k
        self.reference = reference
        self.corrupt = corrupt

    def rule(self, rid: str) -> Callable[[list[int], int], list[int]]:
        def propose(context: list[int], room: int) -> list[int]:
            full = self.reference[rid]
            i = len(context)
            return [
                (t + 1) % 1000 + 5 if self.corrupt(i + j) else t
                for j, t in enumerate(full[i : i + min(self.num_draft_tokens, room)])
            ]

        return propose

    def propose(self, key: str, context: Sequence[int], max_tokens: int | None = None) -> list[int]:
        room = self.num_draft_tokens if max_tokens is None else max_tokens
        return self.rule(key)(list(context), room)

    def forget(self, key: str) -> None:
        pass


SAMPLINGS = {
    "greedy": {},
    "seeded": dict(temperature=0.9, top_p=0.95, seed=7),
    "penalties": dict(
        temperature=0.8, top_k=50, seed=3, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3
    ),
    "greedy_penalties": dict(repetition_penalty=1.5, frequency_penalty=0.5),
    "logprobs": dict(temperature=1.0, seed=11, return_logprobs=True, num_top_logprobs=3),
}


def requests_of(specs, namespace=None):
    return [make_request(rid, prompt, new, namespace=namespace, **kw) for rid, prompt, new, kw in specs]


def assert_same(got: dict[str, Stream], want: dict[str, Stream]) -> None:
    for rid, w in want.items():
        g = got[rid]
        assert g.token_ids == w.token_ids, rid
        assert g.logprobs == w.logprobs, rid
        assert g.top_logprobs == w.top_logprobs, rid
        assert (g.text, g.finish) == (w.text, w.finish), rid


@pytest.mark.parametrize("corrupt_every", [0, 1, 3])
@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_oracle_drafts_give_the_plain_tokens_and_the_expected_acceptance(tiny, sampling, corrupt_every):
    """corrupt_every = 0: every draft is right (k + 1 tokens a step); 1: every draft is wrong (one token a
    step); n: the draft for every n-th position is wrong."""
    kw = SAMPLINGS[sampling]
    specs = [
        ("a", tokens(30, 1), 23, kw),
        ("b", tokens(50, 2), 17, dict(kw, seed=kw.get("seed", 0) + 1)),
        ("c", tokens(9, 3), 30, {}),
    ]
    plain = drive(make_core(tiny), requests_of(specs))
    reference = {rid: list(prompt) + plain[rid].token_ids for rid, prompt, _, _ in specs}
    oracle = OracleProposer(K, reference, lambda p: corrupt_every > 0 and p % corrupt_every == 0)
    core = make_core(tiny, speculative_tokens=K, speculative_max_rows=0)  # no row cap: replay's drafts
    core.scheduler.proposer = oracle
    got = drive(core, requests_of(specs))
    assert_same(got, plain)
    want = [replay(p, plain[rid].token_ids, new, oracle.rule(rid)) for rid, p, new, _ in specs]
    assert (core.num_draft_tokens, core.num_accepted_draft_tokens) == tuple(map(sum, zip(*want)))
    if corrupt_every == 1:
        assert core.num_draft_tokens > 0 and core.num_accepted_draft_tokens == 0
    if corrupt_every == 0:
        assert core.num_accepted_draft_tokens == core.num_draft_tokens > 0
    assert blocks_accounted(core)


@pytest.mark.parametrize("seed", range(6))
def test_ngram_drafts_in_random_mixes_give_the_plain_tokens(tiny, seed):
    rng = random.Random(seed)
    specs = []
    for i in range(rng.randint(2, 5)):
        motif = tokens(rng.randint(3, 12), seed * 10 + i)[1:]
        prompt = [2] + motif * rng.randint(1, 6) + tokens(rng.randint(2, 40), seed * 10 + i + 5)[1:]
        kw = dict(SAMPLINGS[rng.choice(list(SAMPLINGS))])
        if "seed" in kw:
            kw["seed"] += i
        specs.append((f"r{i}", prompt, rng.randint(1, 40), kw))
    budget, max_rows = rng.choice([4096, 24, 9]), rng.choice([0, 8, 3])
    plain = drive(make_core(tiny, budget=4096), requests_of(specs))
    core = make_core(tiny, budget=budget, speculative_tokens=K, speculative_max_rows=max_rows)
    assert_same(drive(core, requests_of(specs)), plain)
    assert blocks_accounted(core)
    if budget == 4096 and max_rows == 0:  # every prompt prefills in the first step, then no draft is cut
        want = [replay(p, plain[rid].token_ids, new, ngram_rule) for rid, p, new, _ in specs]
        assert (core.num_draft_tokens, core.num_accepted_draft_tokens) == tuple(map(sum, zip(*want)))


def record_steps(core) -> list:
    """Every step's SchedulerOutput, as the runner gets it."""
    seen, execute = [], core.runner.execute
    core.runner.execute = lambda output: (seen.append(output), execute(output))[1]
    return seen


def test_drafts_only_in_steps_of_decodes_within_the_row_cap(tiny):
    """Drafts never ride in a step with an interactive prefill (a returning turn's first token would wait for
    their rows), and a step's decodes with their drafts stay within speculative_max_rows rows; the tokens are
    the plain run's."""
    specs = [("a", tokens(30, 1), 20, {}), ("b", tokens(20, 2), 20, {}), ("c", tokens(25, 3), 20, {})]
    plain = drive(make_core(tiny), requests_of(specs))
    reference = {rid: list(prompt) + plain[rid].token_ids for rid, prompt, _, _ in specs}
    for max_rows, cap in [(5, 5), (0, 3 * (1 + K))]:
        core = make_core(tiny, speculative_tokens=K, speculative_max_rows=max_rows)
        core.scheduler.proposer = OracleProposer(K, reference, lambda p: False)
        steps = record_steps(core)
        got = drive(core, requests_of(specs[:1]), until=lambda c: c.num_draft_tokens > 0)
        drive(core, requests_of(specs[1:]), out=got)  # "b" and "c" prefill while "a" decodes
        assert_same(got, plain)
        for output in steps:
            drafted = sum(c.num_draft_tokens for c in output.chunks)
            prefills = [c for c in output.chunks if c.num_tokens - c.num_draft_tokens > 1]
            assert not (drafted and prefills), [(c.request.request_id, c.num_tokens) for c in output.chunks]
            assert sum(c.num_tokens for c in output.chunks) <= cap or prefills
        assert (
            max(
                sum(c.num_tokens for c in o.chunks)
                for o in steps
                if not any(c.num_tokens - c.num_draft_tokens > 1 for c in o.chunks)
            )
            == cap
        )  # the cap is reached, not undershot
        assert any(c.request.request_id != "a" and c.num_tokens > 1 for o in steps for c in o.chunks)
        assert blocks_accounted(core)


def test_drafts_ride_beside_a_long_prefill_share(tiny):
    """A long prefill's share (a cold history, longer than the budget) is throughput work: decodes beside it
    still get their drafts, within the row cap; the tokens are the plain run's. The share (8) leaves room in the
    budget (16) for the drafts."""
    specs = [("a", tokens(30, 1), 24, {}), ("d", tokens(90, 4), 6, {})]
    plain = drive(make_core(tiny, budget=16), requests_of(specs))
    reference = {rid: list(prompt) + plain[rid].token_ids for rid, prompt, _, _ in specs}
    core = make_core(tiny, budget=16, speculative_tokens=K, speculative_max_rows=3, long_prefill_tokens=8)
    core.scheduler.proposer = OracleProposer(K, reference, lambda p: False)
    steps = record_steps(core)
    got = drive(core, requests_of(specs[:1]), until=lambda c: c.num_draft_tokens > 0)
    drive(core, requests_of(specs[1:]), out=got)
    assert_same(got, plain)
    beside = [
        o
        for o in steps
        if any(c.request.request_id == "d" and c.num_tokens > 1 for c in o.chunks)
        and any(c.num_draft_tokens for c in o.chunks)
    ]
    assert beside  # "a" verified drafts in steps that also computed a share of "d"'s history
    for output in beside:
        decodes = [c for c in output.chunks if c.num_tokens - c.num_draft_tokens == 1]
        assert sum(c.num_tokens for c in decodes) <= 3
    assert blocks_accounted(core)


def test_stop_tokens_and_stop_strings_inside_accepted_drafts(tiny):
    prompt = tokens(40, 4)
    plain = drive(make_core(tiny), requests_of([("a", prompt, 30, {})]))["a"]
    reference = {"a": list(prompt) + plain.token_ids}
    # A stop token that the plain run samples at output position 9: drafts past it are never kept.
    stop = plain.token_ids[9]
    first = plain.token_ids.index(stop)
    for kwargs in [
        dict(stop_token_ids=frozenset({stop})),
        dict(stop_strings=(plain.text[len(plain.text) // 2 :][:3],)),
    ]:
        specs = [("a", prompt, 30, kwargs)]
        want = drive(make_core(tiny), requests_of(specs))["a"]
        core = make_core(tiny, speculative_tokens=K)
        core.scheduler.proposer = OracleProposer(K, reference, lambda p: False)
        got = drive(core, requests_of(specs))["a"]
        assert_same({"a": got}, {"a": want})
        assert want.finish in (FinishReason.STOP_TOKEN, FinishReason.STOP_STRING)
        if "stop_token_ids" in kwargs:
            assert len(want.token_ids) == first + 1
        assert blocks_accounted(core)


def test_reply_kv_put_and_device_hit_are_those_of_the_plain_run(tiny):
    """Only computed, accepted tokens' blocks reach the caches: the kvstore put after a speculative
    run is bit-equal to the plain run's, and the next turn's device hit gives the plain tokens."""
    prompt = tokens(37, 5)
    specs = [("t1", prompt, 40, {}), ("s1", tokens(21, 6), 29, SAMPLINGS["seeded"])]
    plain_core = make_core(tiny)
    plain_puts = []
    plain_core.set_host_sink(plain_puts.append)
    plain = drive(plain_core, requests_of(specs, NS))
    reference = {rid: list(p) + plain[rid].token_ids for rid, p, _, _ in specs}
    core = make_core(tiny, speculative_tokens=K)
    core.scheduler.proposer = OracleProposer(K, reference, lambda p: p % 3 == 0)
    puts = []
    core.set_host_sink(puts.append)
    assert_same(drive(core, requests_of(specs, NS)), plain)
    assert core.num_accepted_draft_tokens > 0 and core.num_accepted_draft_tokens < core.num_draft_tokens
    assert len(puts) == len(plain_puts) == 2
    for got, want in zip(
        sorted(puts, key=lambda p: len(p.token_ids)), sorted(plain_puts, key=lambda p: len(p.token_ids))
    ):
        assert got.token_ids == want.token_ids
        assert torch.equal(got.global_kv, want.global_kv)
        assert (got.local_kv is None) == (want.local_kv is None)
        if got.local_kv is not None:
            assert torch.equal(got.local_kv, want.local_kv) and got.local_first_block == want.local_first_block
    # Next turn: the reply and a new message, on the same engines (device hits), then with a host hit.
    turn2 = reference["t1"] + tokens(19, 7)[1:]
    spec2 = [("t2", turn2, 25, {})]
    want = drive(plain_core, requests_of(spec2, NS))
    core.scheduler.proposer = NgramProposer(K, 2, 4)
    second = requests_of(spec2, NS)
    assert_same(drive(core, second), want)
    assert second[0].num_cached_device_tokens == len(reference["t1"]) - 1  # all that turn 1 computed
    put = next(p for p in plain_puts if p.token_ids == turn2[: len(p.token_ids)])
    hit = host_hit(len(put.token_ids), put.global_kv, put.local_kv, put.local_first_block)
    fresh = make_core(tiny, speculative_tokens=K)
    third = requests_of(spec2, NS)
    assert_same(drive(fresh, third, {"t2": hit}), want)
    assert third[0].num_cached_host_tokens == len(put.token_ids) > 0
    assert blocks_accounted(core) and blocks_accounted(fresh)


def test_preemption_and_abort_leave_no_blocks_behind(tiny):
    specs = [(f"r{i}", [2] + tokens(8, i)[1:] * 6, 40, SAMPLINGS["seeded"] if i % 2 else {}) for i in range(6)]
    plain = drive(make_core(tiny), requests_of(specs))
    reference = {rid: list(p) + plain[rid].token_ids for rid, p, _, _ in specs}
    small = make_core(tiny).layout.page_bytes * 40
    # prompts (49 tokens) that fit the budget run together, so the small pool has to preempt
    core = make_core(tiny, budget=64, kv_bytes=small, speculative_tokens=K)
    core.scheduler.proposer = OracleProposer(K, reference, lambda p: p % 4 == 0)
    assert_same(drive(core, requests_of(specs)), plain)
    assert core.scheduler.num_preemptions > 0 and core.num_accepted_draft_tokens > 0
    assert blocks_accounted(core)
    # Abort in the middle of a run, after drafts were accepted and rejected.
    core = make_core(tiny, speculative_tokens=K)
    core.scheduler.proposer = OracleProposer(K, reference, lambda p: p % 3 == 0)
    drive(core, requests_of(specs[:3]), until=lambda c: c.num_accepted_draft_tokens >= 6)
    assert core.has_work()
    for rid, *_ in specs[:3]:
        core.abort(rid)
    assert not core.has_work() and blocks_accounted(core)


# ---- Gemma: n-gram drafts on the real model ------------------------------------------------------


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma-3-270m", "int8")


REPETITIVE = (
    "Ada: The schedule is: Monday the kettle, Tuesday the garden, Wednesday the letters, Thursday "
    "the market.\nBen: Say it again?\nAda: The schedule is: Monday the kettle, Tuesday the garden, "
    "Wednesday the letters, Thursday the market.\nBen: Once more, slowly.\nAda:"
)


COLOURS = (" red", " blue", " green", " black", " white", " pink")


def gemma_prompt(tok, name: str) -> list[int]:
    if name == "repetitive":
        return tok.encode(REPETITIVE, add_bos=True)
    # A random sequence of six colour words: every pair recurs, so drafts come at most steps, and sampling at
    # temperature 1 continues it at random, so they are mostly wrong.
    rng = random.Random(0)
    words = [tok.encode(w, add_bos=False)[0] for w in COLOURS]
    return [tok.bos_token_id] + [rng.choice(words) for _ in range(80)]


@pytest.mark.parametrize(
    "name, kw, mostly_accepted",
    [
        ("repetitive", {}, True),
        ("repetitive", dict(temperature=0.7, top_p=0.9, seed=5), True),
        ("random", dict(temperature=1.0, seed=5), False),
    ],
)
def test_gemma_ngram_drafts_repetitive_mostly_accepted_random_mostly_rejected(gemma, name, kw, mostly_accepted):
    prompt = gemma_prompt(gemma[1], name)
    specs = [(name, prompt, 24, kw)]
    plain = drive(make_core(gemma, kv_bytes=32 << 20), requests_of(specs))
    core = make_core(gemma, kv_bytes=32 << 20, speculative_tokens=K)
    assert_same(drive(core, requests_of(specs)), plain)
    assert blocks_accounted(core)
    drafted, accepted = core.num_draft_tokens, core.num_accepted_draft_tokens
    assert (drafted, accepted) == replay(prompt, plain[name].token_ids, 24, ngram_rule)
    assert drafted > 0
    if mostly_accepted:
        assert accepted >= 0.6 * drafted, (drafted, accepted)
    else:
        assert accepted <= 0.4 * drafted, (drafted, accepted)
