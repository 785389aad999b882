"""The grammar module's parts: the compiled-grammar cache's byte bound (seeded randomized against a plain LRU
model), the compiler's cache, its worker killed past the time limit and replaced, refusals remembered within
their byte bound, a schema's shape limits, the bitmask against a plain per-token reference on odd
vocabulary sizes, workers paused (their CPU-time limit standing still) and dying with their spawner, the spawner
at its low priority before it loads torch, and a constrained row sampled over its allowed tokens only (host C path
= its reference)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import zlib

import pytest
import torch

from salon.common.errors import InvalidArgument, ResourceExhausted
from salon.common.proc_stat import state
from salon.engine.grammar.bitmask import allocate_bitmask, allowed_tokens, apply_bitmask, apply_bitmask_torch
from salon.engine.grammar.cache import CompiledCache
from salon.engine.grammar.compiler import GrammarCompiler, GrammarLimits, vocabulary
from salon.engine.grammar.constraint import MAX_SCHEMA_BYTES, Constraint, ConstraintKind, checked
from salon.engine.grammar.matcher import RequestGrammar
from salon.engine.grammar.worker import WorkerSpawner
from salon.engine.model.loader import open_model_file
from salon.engine.model.tokenizer import Tokenizer
from salon.engine.request import SamplingParams
from salon.engine.worker.device_sampler import DeviceSampler
from salon.engine.worker.sampler import kept_tokens, sample
from tests.engine.test_engine_device_sampler import VOCAB, chunks_of, requests, step_logits


@pytest.mark.parametrize("seed", range(5))
def test_cache_keeps_its_byte_bound_and_evicts_least_recently_used_first(seed):
    rng = random.Random(seed)
    capacity = rng.randint(50, 500)
    cache: CompiledCache[str] = CompiledCache(capacity)
    model: list[tuple[int, int]] = []  # (key, bytes), least recently used first
    for _ in range(3000):
        key = rng.randrange(40)
        if rng.random() < 0.5:
            got = cache.get(key)
            entry = next((e for e in model if e[0] == key), None)
            assert got == (None if entry is None else f"v{key}")
            if entry is not None:
                model.remove(entry)
                model.append(entry)
        else:
            size = rng.randint(0, capacity + 20)
            cache.put(key, f"v{key}", size)
            model = [e for e in model if e[0] != key]
            if size <= capacity:
                while sum(b for _, b in model) + size > capacity:
                    model.pop(0)
                model.append((key, size))
        assert cache.num_bytes == sum(b for _, b in model) <= capacity
        assert len(cache) == len(model) and all(k in cache for k, _ in model)


@pytest.fixture(scope="module")
def compiler():
    mf = open_model_file("smollm2-135m-instruct")
    compiler = GrammarCompiler(Tokenizer(mf.vocab), mf.config.eos_token_ids, GrammarLimits(compile_workers=1))
    compiler.wait_workers(120)
    yield compiler
    compiler.close()


def test_compiler_caches_by_constraint_and_refuses_naming_the_problem(compiler):
    regex = Constraint(ConstraintKind.REGEX, "[a-z]{3}")

    async def twice():
        return await compiler.compile(regex), await compiler.compile(regex)

    first, second = asyncio.run(twice())
    assert first is second
    assert compiler.cache.num_bytes == first.memory_size_bytes > 0
    with pytest.raises(InvalidArgument, match=r"^json_schema: does not compile: .*objectx"):
        compiler.compile_now(Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "objectx"}'))
    with pytest.raises(InvalidArgument, match="sampling.constraint.json_schema: 65537 bytes is more than 65536"):
        checked(Constraint(ConstraintKind.JSON_SCHEMA, " " * (MAX_SCHEMA_BYTES + 1)))
    with pytest.raises(InvalidArgument, match="sampling.constraint.choice: 1..1024 choices, got 0"):
        checked(Constraint(ConstraintKind.CHOICE))


def open_optional_schema(n: int, first: int = 0) -> Constraint:
    """An object of n optional integer properties, not strict: each costs about 40 ms to compile here."""
    properties = {f"p{i}": {"type": "integer"} for i in range(first, first + n)}
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps({"type": "object", "properties": properties}))


def wait_until_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still runs")


def test_a_compilation_past_its_time_limit_kills_its_worker_and_the_next_one_compiles():
    mf = open_model_file("smollm2-135m-instruct")
    limits = GrammarLimits(compile_timeout_s=0.5, compile_workers=1)
    compiler = GrammarCompiler(Tokenizer(mf.vocab), mf.config.eos_token_ids, limits)
    try:
        compiler.wait_workers(120)
        asyncio.run(compiler.compile(Constraint(ConstraintKind.REGEX, "[a-z]{3}")))
        (first,) = compiler.workers
        assert first.alive
        slow = open_optional_schema(2000)  # over a minute: gone much sooner only when killed
        with pytest.raises(InvalidArgument, match=r"^json_schema: did not compile within 0\.5 s \(too complex\)$"):
            asyncio.run(compiler.compile(slow))
        assert not first.alive
        wait_until_gone(first.pid)  # killed, not left compiling
        compilations = compiler.compilations
        with pytest.raises(InvalidArgument, match=r"^json_schema: did not compile within 0\.5 s"):
            asyncio.run(compiler.compile(slow))  # remembered: refused without compiling again
        assert compiler.compilations == compilations
        compiled = asyncio.run(compiler.compile(Constraint(ConstraintKind.REGEX, "[0-9]{2}")))
        (second,) = compiler.workers
        assert second is not first and second.alive and second.compiles == 1
        assert compiled.memory_size_bytes > 0
    finally:
        compiler.close()
    wait_until_gone(second.pid)


def wait_for(condition, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_paused_workers_time_does_not_count_against_its_limit():
    """Workers forked while the compiler is paused start stopped (SIGSTOP); the compilation's limit counts the
    worker's CPU time: paused for twice the limit, it still compiles once resumed."""
    mf = open_model_file("smollm2-135m-instruct")
    limits = GrammarLimits(compile_timeout_s=0.5, compile_workers=1, compile_wait_s=30)
    compiler = GrammarCompiler(Tokenizer(mf.vocab), mf.config.eos_token_ids, limits)
    try:
        compiler.wait_workers(120)
        compiler.pause_workers()
        loop = asyncio.new_event_loop()
        start = time.monotonic()
        job = loop.run_in_executor(None, asyncio.run, compiler.compile(open_optional_schema(3)))
        wait_for(lambda: compiler.workers and state(compiler.workers[0].pid) == "T", "a stopped worker")
        (worker,) = compiler.workers
        while time.monotonic() - start < 2 * limits.compile_timeout_s:
            assert state(worker.pid) == "T"  # stays stopped until resumed
            time.sleep(0.05)
        compiler.resume_workers()
        assert state(worker.pid) != "T"
        compiled = loop.run_until_complete(job)
        loop.close()
        assert compiled.memory_size_bytes > 0 and worker.alive and worker.compiles == 1
        assert time.monotonic() - start > 2 * limits.compile_timeout_s
    finally:
        compiler.close()


def test_a_compilation_that_cannot_run_within_its_wait_is_a_resource_exhausted_not_remembered():
    mf = open_model_file("smollm2-135m-instruct")
    limits = GrammarLimits(compile_timeout_s=0.5, compile_workers=1, compile_wait_s=1.0)
    compiler = GrammarCompiler(Tokenizer(mf.vocab), mf.config.eos_token_ids, limits)
    try:
        compiler.wait_workers(120)
        regex = Constraint(ConstraintKind.REGEX, "[a-z]{5}")
        compiler.pause_workers()
        with pytest.raises(
            ResourceExhausted,
            match=r"^sampling.constraint: did not finish compiling within 1 s while the engine was busy; retry",
        ):
            asyncio.run(compiler.compile(regex))
        (starved,) = compiler.workers
        assert not starved.alive
        wait_until_gone(starved.pid)  # killed although stopped
        compiler.resume_workers()
        assert asyncio.run(compiler.compile(regex)) is not None  # not remembered as a refusal
    finally:
        compiler.close()


def test_a_stopped_worker_dies_with_its_spawner():
    mf = open_model_file("smollm2-135m-instruct")
    compiler = GrammarCompiler(Tokenizer(mf.vocab), mf.config.eos_token_ids, GrammarLimits(compile_workers=1))
    try:
        compiler.wait_workers(120)
        asyncio.run(compiler.compile(Constraint(ConstraintKind.REGEX, "[a-z]{6}")))
        (worker,) = compiler.workers
        compiler.pause_workers()
        wait_for(lambda: state(worker.pid) == "T", "the worker stopped")
        os.kill(compiler._spawner.process.pid, 9)
        wait_until_gone(worker.pid)
    finally:
        compiler.close()


def test_the_spawner_lowers_its_priority_before_it_loads_torch():
    """The spawner's imports (torch among them) take a second or two of CPU; started beside an engine that has
    just begun serving, at a normal priority they delayed its first turns (a cold first turn's TTFT 0.94-1.08 s
    instead of 0.72-0.76 s, `salon up` on 2 cores). It takes its nice value and the idle class before it loads
    torch: polled until torch is mapped, the spawner is nice and idle by then."""
    mf = open_model_file("smollm2-135m-instruct")
    stops = tuple(mf.config.eos_token_ids)
    spawner = WorkerSpawner(vocabulary(Tokenizer(mf.vocab), stops), stops, 19)
    try:
        pid = spawner.process.pid
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the spawner never loaded torch"
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            if "libtorch" in open(f"/proc/{pid}/maps").read():
                break
            time.sleep(0.002)
        nice, policy = int(fields[16]), int(fields[38])  # sampled before the maps that show torch
        assert (nice, policy) == (19, os.SCHED_IDLE)
        spawner.wait_ready(120)  # the positive control: it still starts
    finally:
        spawner.kill()


def test_a_refused_constraint_is_refused_again_at_once(compiler):
    """A constraint that does not compile (or took too long) gets the same refusal without compiling again."""
    bad = Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "objectx"}')
    before = compiler.compilations
    for _ in range(3):
        with pytest.raises(InvalidArgument, match=r"^json_schema: does not compile: .*objectx"):
            asyncio.run(compiler.compile(bad))
    assert compiler.compilations == before + 1
    assert bad in compiler.refused and bad not in compiler.cache
    good = Constraint(ConstraintKind.REGEX, "[a-z]{4}")
    for _ in range(2):
        asyncio.run(compiler.compile(good))
    assert compiler.compilations == before + 2  # the positive control: a compiled one is cached, once


def test_a_grammar_that_crashes_the_compiler_is_refused_and_the_next_one_compiles(compiler):
    """xgrammar crashes (SIGSEGV) on a rule that only repeats itself with a count: the worker dies, the engine does
    not; the constraint is refused naming the crash, remembered, and a good grammar compiles on a fresh worker."""
    crashing = Constraint(ConstraintKind.GRAMMAR, "root ::= root{2}")
    before = compiler.compilations
    for _ in range(2):
        with pytest.raises(
            InvalidArgument, match=r"^grammar: does not compile \(the grammar compiler crashed on it\)$"
        ):
            asyncio.run(compiler.compile(crashing))
    assert compiler.compilations == before + 1
    good = Constraint(ConstraintKind.GRAMMAR, 'root ::= "yes" | "no"')
    assert asyncio.run(compiler.compile(good)) is not None
    assert compiler.compilations == before + 2


def test_refusals_are_kept_within_their_byte_bound_least_recently_used_out_first():
    mf = open_model_file("smollm2-135m-instruct")
    limits = GrammarLimits(compile_workers=1, refused_cache_bytes=200)
    compiler = GrammarCompiler(Tokenizer(mf.vocab), mf.config.eos_token_ids, limits)
    try:
        compiler.wait_workers(120)
        regexes = [Constraint(ConstraintKind.REGEX, f"(a{i}") for i in range(5)]  # each: an unclosed group
        for regex in regexes:
            with pytest.raises(InvalidArgument, match="^regex: does not compile: "):
                asyncio.run(compiler.compile(regex))
            assert compiler.refused.num_bytes <= 200
        kept = [r for r in regexes if r in compiler.refused]
        assert 0 < len(kept) < len(regexes) and kept == regexes[len(regexes) - len(kept) :]
        assert compiler.compilations == len(regexes)
        with pytest.raises(InvalidArgument):
            asyncio.run(compiler.compile(regexes[0]))  # forgotten: compiled (and refused) again
        assert compiler.compilations == len(regexes) + 1
    finally:
        compiler.close()


def test_schema_shape_limits_are_refused_before_compiling_naming_the_limit():
    def schema(value, strict=False):
        return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(value), strict=strict)

    deep: dict = {"type": "integer"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    with pytest.raises(InvalidArgument, match=r"^sampling.constraint.json_schema: nested more than 64 levels deep"):
        checked(schema(deep, strict=True))
    with pytest.raises(InvalidArgument, match=r"json_schema: nested more than 64 levels deep$"):
        checked(Constraint(ConstraintKind.JSON_SCHEMA, "[" * 5000 + "]" * 5000))
    with pytest.raises(
        InvalidArgument, match=r"json_schema: enum at /properties/c/enum has 1025 values, more than 1024"
    ):
        checked(schema({"type": "object", "properties": {"c": {"enum": list(range(1025))}}}))
    with pytest.raises(InvalidArgument, match=r"json_schema: object at / has 257 properties, more than 256"):
        checked(schema({"type": "object", "properties": {f"p{i}": {} for i in range(257)}}, strict=True))
    with pytest.raises(InvalidArgument, match=r"json_schema: more than 16 optional properties in objects that admit"):
        checked(open_optional_schema(17))
    # Just within each limit, and the same optional properties where the objects are closed.
    shallow: dict = {"type": "integer"}
    for _ in range(31):
        shallow = {"type": "object", "properties": {"a": shallow}, "required": ["a"]}
    checked(schema(shallow, strict=True))
    checked(schema({"type": "object", "properties": {"c": {"enum": list(range(1024))}}}))
    checked(schema({"type": "object", "properties": {f"p{i}": {} for i in range(256)}}, strict=True))
    checked(open_optional_schema(16))
    wide = json.loads(open_optional_schema(17).text)
    checked(Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(wide), strict=True))
    checked(Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(wide | {"additionalProperties": False})))
    # A property named like a keyword is a name, not a keyword.
    checked(schema({"type": "object", "properties": {"enum": {"type": "string"}}, "required": ["enum"]}))


@pytest.mark.parametrize("vocab", [31, 32, 1003])
def test_bitmask_matches_a_per_token_reference(vocab):
    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32 + (1 if vocab == 32 else 0)  # a mask wider than the vocabulary too
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, words), generator=g, dtype=torch.int32)
    allowed = allowed_tokens(bitmask, vocab)
    for r in range(3):
        for t in range(vocab):
            assert bool(allowed[r, t]) == bool((int(bitmask[r, t // 32]) >> (t % 32)) & 1)
    logits = torch.randn(4, vocab, generator=g)
    for apply in (apply_bitmask, apply_bitmask_torch):  # xgrammar's kernel on a CPU; torch ops elsewhere
        masked = logits.clone()
        apply(masked, [0, 2, 3], bitmask)
        assert torch.equal(masked[1], logits[1])
        for i, r in enumerate([0, 2, 3]):
            assert torch.equal(masked[r], logits[r].masked_fill(~allowed[i], float("-inf")))


@pytest.mark.parametrize("vocab", [1000, 49152])
def test_a_constrained_row_is_sampled_over_its_allowed_tokens_by_the_rule(vocab):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, vocab, generator=g) * 4
    allowed = torch.rand(3, vocab, generator=g) < 0.3
    masked = logits.masked_fill(~allowed, float("-inf"))
    params = [
        SamplingParams(8, temperature=1.0),
        SamplingParams(8, temperature=0.7, top_k=50, top_p=0.9),
        SamplingParams(8, temperature=0.0),
    ]
    for seed in range(20):
        generators = [torch.Generator().manual_seed(seed) for _ in range(2)] + [None]
        tokens = [t.token_id for t in sample(masked, params, generators, masked_rows={0, 1, 2})]
        for r in range(3):
            assert allowed[r, tokens[r]], (seed, r)
        assert tokens[2] == int(torch.argmax(masked[2]))
        for r in range(2):  # the reference rule over the allowed tokens, compacted in vocabulary order
            ids = torch.nonzero(allowed[r]).flatten()
            u = float(torch.rand(1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
            kept, w = kept_tokens(logits[r, ids], params[r])
            order = torch.arange(ids.numel()) if kept is None else torch.sort(kept).values
            weights = w if kept is None else w[torch.argsort(kept)]
            cumulative = torch.cumsum(weights, 0)
            i = min(int(torch.searchsorted(cumulative, u * cumulative[-1], right=True)), weights.numel() - 1)
            assert tokens[r] == int(ids[order[i]]), (seed, r)


def masked_step(reqs, step: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's logits for the requests, every row masked by a bitmask that depends only on (request, step)."""
    logits = torch.stack([step_logits(r.request_id, step) for r in reqs])
    masks = []
    for r in reqs:
        g = torch.Generator().manual_seed(zlib.crc32(f"mask:{r.request_id}:{step}".encode()))
        masks.append(torch.randint(-(2**31), 2**31 - 1, ((VOCAB + 31) // 32,), generator=g, dtype=torch.int32))
        masks[-1][: (step % 3) * 8] = 0  # some rows allow far fewer tokens
    bitmask = torch.stack(masks)
    logits = logits.to(device)
    apply_bitmask(logits, list(range(len(reqs))), bitmask)
    return logits, allowed_tokens(bitmask, VOCAB)


def test_masked_rows_through_the_device_sampler_are_the_host_samplers():
    """On CPU tensors the device sampler draws the host sampler's tokens: masked rows too, only allowed ones."""
    device_reqs, host_reqs = requests(), requests()
    sampler = DeviceSampler("cpu")
    for step in range(6):
        logits, allowed = masked_step(device_reqs, step, "cpu")
        got, _, _ = sampler.sample(logits, chunks_of(device_reqs))
        rows = range(len(host_reqs))
        want = sample(logits, [r.sampling for r in host_reqs], [r.generator for r in host_reqs], host_reqs, set(rows))
        assert [t.token_id for t in got] == [t.token_id for t in want], step
        assert all(allowed[r, t.token_id] for r, t in zip(rows, got))
        for d, h, t in zip(device_reqs, host_reqs, got):
            d.output_token_ids.append(t.token_id)
            h.output_token_ids.append(t.token_id)


def fresh_mask(compiled, vocab: int, prefix: list[int]) -> torch.Tensor:
    """The mask after `prefix`, from a new matcher advanced token by token (no speculation, no rollback)."""
    grammar = RequestGrammar(compiled, vocab)
    for token_id in prefix:
        assert grammar.accept(token_id)
    mask = allocate_bitmask(1, vocab)
    grammar.fill_bitmask(mask, 0)
    return mask[0]


def test_drafts_looked_at_leave_the_matcher_as_it_was(compiler):
    """draft_prefix cuts drafts at the first the grammar rejects (and past the stop token);
    fill_draft_bitmasks gives row j the mask after drafts [0, j); after either, the next mask and the next
    accepted token are those of a matcher that never saw the drafts."""
    tok, vocab = Tokenizer(open_model_file("smollm2-135m-instruct").vocab), compiler.vocab_size
    compiled = compiler.compile_now(Constraint(ConstraintKind.REGEX, "(cat|dog)-[0-9]{2,3}"))
    reply = tok.encode("dog-417", add_bos=False) + [compiler.stop_token_ids[0]]
    wrong = tok.encode("!", add_bos=False)[0]
    grammar = RequestGrammar(compiled, vocab)
    for i in range(len(reply)):
        plain = fresh_mask(compiled, vocab, reply[:i])
        tail = reply[i:]
        cases = [  # (drafts, allowed prefix)
            (tail, len(tail)),
            (tail + [reply[0]], len(tail)),  # a draft past the stop token
            (tail[:1] + [wrong] + tail[1:], min(1, len(tail))),
            ([wrong] + tail, 0),
        ]
        for drafts, allowed in cases:
            assert grammar.draft_prefix(drafts) == allowed, (i, drafts)
            rows = allocate_bitmask(len(drafts) + 1, vocab)
            grammar.fill_draft_bitmasks(rows, 0, drafts[:allowed])
            for j in range(allowed + 1):
                if j < len(tail):  # past the stop token there is no next mask
                    assert torch.equal(rows[j], fresh_mask(compiled, vocab, reply[: i + j])), (i, j)
            after = allocate_bitmask(1, vocab)
            grammar.fill_bitmask(after, 0)
            assert torch.equal(after[0], plain), (i, drafts)
        assert grammar.accept(reply[i])
    assert grammar.is_terminated and grammar.num_accepted_tokens == len(reply)
