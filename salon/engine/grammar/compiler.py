"""Constraints compiled to grammars for one tokenizer, off every event loop, within a time limit, cached.

    compile(constraint)   cache hit   -> the compiled grammar at once
                          refused     -> the same INVALID_ARGUMENT at once (a bounded cache of refusals; one
                                         for time for refused_slow_s)
                          miss        -> a worker process compiles it (worker.py) and sends it back serialized;
                                         INVALID_ARGUMENT naming the problem when it does not compile, or does
                                         not finish within compile_timeout_s of its CPU time (the worker is
                                         killed and replaced); RESOURCE_EXHAUSTED when every worker stays busy
                                         that long, or the compilation waits compile_wait_s without finishing
    pause_workers()       the workers stopped (SIGSTOP), those forked later too: the engine's step thread calls it
    resume_workers()      while the model computes, and resumes them when it stops (engine_loop.py)
    compile_now(c)        the same compilation on the calling thread (the workers' own, and tests')
    matcher(compiled)     a request's matcher (matcher.py)

The vocabulary is handed to xgrammar as each token's bytes (the tokenizer info is built on a pool thread when
the compiler is made, so the first request does not wait for it; each worker builds its own). Control tokens
other than the stop tokens are given as empty pieces: a constraint never admits them, and a finished grammar
admits only the stop tokens. JSON is compiled without free whitespace (items ", ", keys ": "): a small model
given free whitespace can fill its whole budget with it.

Why worker processes: xgrammar cannot cancel a compilation, so one on a thread that outlives its limit would
hold the thread and a core until it ends; a process is killed instead (and replaced by a fork of a spawner that
has xgrammar loaded), and runs at a lower priority (nice) so the serving loop and the model's step keep their
cores. The scheduler's idle class alone did not keep a busy worker off those cores: beside one, the step's two
threads were woken onto the same core (2 cores; an SmolLM2 step 8 -> 27 ms), so the engine stops its workers while
the model computes. A compilation's limit counts the worker's own CPU time, not the time it stood paused.
A compiled grammar crosses back as xgrammar's JSON:
deserializing costs a few per cent of compiling (2-12 ms with SmolLM2's vocabulary, 2-65 ms with Gemma's, the
GIL released), so compiling in the worker and shipping the result beats a pre-flight followed by a second
compile here. Each pool thread drives one worker, so the pool's size bounds the cores compilation can take.
With compile_workers=0 compilation runs on the pool's threads in this process (not cancellable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from salon.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from salon.engine.grammar.cache import CompiledCache
from salon.engine.grammar.constraint import Constraint, ConstraintKind
from salon.engine.grammar.lark import as_ebnf
from salon.engine.grammar.matcher import RequestGrammar
from salon.engine.grammar.worker import (
    CompileStarved,
    CompileTimedOut,
    CompileWorker,
    SpawnerNotReady,
    WorkerSpawner,
)
from salon.engine.model.tokenizer import Tokenizer

# xgrammar's messages start with a time and its source file: "[19:29:00] /project/cpp/x.cc:94: "
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


@dataclass(frozen=True)
class GrammarLimits:
    # Bytes of compiled grammars kept (least recently used evicted first).
    cache_bytes: int = 256 << 20
    # CPU time a constraint may compile for before INVALID_ARGUMENT (and how long it may wait for a free worker
    # before RESOURCE_EXHAUSTED).
    compile_timeout_s: float = 10.0
    # Worker processes that compile (each compilation holds one); 0: threads of this process.
    compile_workers: int = 2
    # Added to the workers' nice value: below the step thread's (+10 by default), whose threads a worker
    # sharing their cores would otherwise hold up.
    compile_nice: int = 19
    # Bytes of refused constraints remembered with their reason (least recently used forgotten first).
    refused_cache_bytes: int = 16 << 20
    # How long a refusal for time is remembered (one that does not compile is remembered until evicted): a
    # host busy with other work can slow a compilation that would otherwise fit.
    refused_slow_s: float = 300.0
    # How long a compilation may take in all (its worker paused while the model computes, or the host busy)
    # before RESOURCE_EXHAUSTED; at least compile_timeout_s (wait_s).
    compile_wait_s: float = 60.0

    @property
    def wait_s(self) -> float:
        return max(self.compile_timeout_s, self.compile_wait_s)


def vocabulary(tokenizer: Tokenizer, stop_token_ids: tuple[int, ...]) -> list[bytes]:
    """Each token's bytes for the grammar library; control tokens other than the stop tokens as b"" (no text)."""
    return [
        b"" if tokenizer.is_special(i) and i not in stop_token_ids else tokenizer.token_bytes(i)
        for i in range(tokenizer.vocab_size)
    ]


def error_message(exc: Exception) -> str:
    return _XGRAMMAR_PREFIX.sub("", str(exc).strip()).strip()


def _choice_grammar(choices: tuple[str, ...]) -> str:
    # JSON string literals are valid EBNF literals (the same escapes).
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCompiler:
    def __init__(
        self, tokenizer: Tokenizer | Sequence[bytes], stop_token_ids: tuple[int, ...], limits: GrammarLimits
    ) -> None:
        """tokenizer: the engine's, or the vocabulary() it gives (a worker's)."""
        self.limits = limits
        self.vocab_size = tokenizer.vocab_size if isinstance(tokenizer, Tokenizer) else len(tokenizer)
        self.stop_token_ids = stop_token_ids
        self._pool = ThreadPoolExecutor(max(1, limits.compile_workers), thread_name_prefix="grammar-compile")
        self._compiler = self._pool.submit(self._make_compiler, tokenizer, stop_token_ids)
        self.cache: CompiledCache = CompiledCache(limits.cache_bytes)
        self.refused: CompiledCache[tuple[str, float]] = CompiledCache(limits.refused_cache_bytes)
        self.compilations = 0  # compilations started (cache and refusal hits start none)
        self.workers: list[CompileWorker] = []  # every worker started and not yet killed
        self._worker_of = threading.local()  # each pool thread's worker
        self._workers_lock = threading.Lock()
        self._spawner: WorkerSpawner | None = None
        self._closed = False
        self._paused = False  # pause_workers() holds: workers forked meanwhile start paused

    def _make_compiler(self, tokenizer: Tokenizer | Sequence[bytes], stop_token_ids: tuple[int, ...]):
        import xgrammar

        self._vocabulary = (
            vocabulary(tokenizer, stop_token_ids) if isinstance(tokenizer, Tokenizer) else list(tokenizer)
        )
        self._info = xgrammar.TokenizerInfo(
            self._vocabulary, xgrammar.VocabType.RAW, stop_token_ids=list(stop_token_ids)
        )
        if self.limits.compile_workers:
            self._spawner = WorkerSpawner(self._vocabulary, stop_token_ids, self.limits.compile_nice)
        # One bound for the whole engine: this module's cache; xgrammar's own is off.
        return xgrammar.GrammarCompiler(self._info, max_threads=1, cache_enabled=False)

    def ready(self) -> None:
        """Wait for the tokenizer info (built on the pool when the compiler is made)."""
        self._compiler.result()

    def wait_workers(self, timeout_s: float) -> None:
        """Block until the worker processes can be forked (SpawnerNotReady after timeout_s): a compilation
        waits for them within its own time limit, which a test's short limit may not cover."""
        self.ready()
        if self._spawner is not None:
            self._spawner.wait_ready(timeout_s)

    def compile_now(self, constraint: Constraint):
        """Compile on the calling thread (the pool's, or a test's); InvalidArgument naming the problem."""
        compiler = self._compiler.result()
        kind = constraint.kind
        try:
            if kind is ConstraintKind.JSON_OBJECT:
                return compiler.compile_json_schema('{"type": "object"}', strict_mode=False, any_whitespace=False)
            if kind is ConstraintKind.JSON_SCHEMA:
                return compiler.compile_json_schema(
                    constraint.text, strict_mode=constraint.strict, any_whitespace=False
                )
            if kind is ConstraintKind.REGEX:
                return compiler.compile_regex(constraint.text)
            if kind is ConstraintKind.GRAMMAR:  # GBNF, or Lark converted to it (InvalidArgument naming the line)
                return compiler.compile_grammar(as_ebnf(constraint.text))
            return compiler.compile_grammar(_choice_grammar(constraint.choices))
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InvalidArgument(f"{kind.value}: does not compile: {error_message(exc)}") from None

    def _worker(self, start_by: float) -> CompileWorker:
        """The pool thread's worker (a fresh fork when it has none); SpawnerNotReady past start_by (monotonic)."""
        worker = getattr(self._worker_of, "worker", None)
        if worker is not None and worker.alive:
            return worker
        self.ready()
        with self._workers_lock:
            if self._closed:
                raise Unavailable("the grammar compiler is closed")
            if not self._spawner.alive:  # it died (killed from outside): a fresh one
                self._spawner.kill()
                self._spawner = WorkerSpawner(self._vocabulary, self.stop_token_ids, self.limits.compile_nice)
            spawner = self._spawner
        worker = spawner.spawn(start_by - time.monotonic())
        with self._workers_lock:
            self.workers = [w for w in self.workers if w.alive] + [worker]
            closed = self._closed
            if self._paused:
                worker.pause()
        if closed:
            worker.kill()
            raise Unavailable("the grammar compiler is closed")
        self._worker_of.worker = worker
        return worker

    def _compile_in_worker(self, constraint: Constraint, start_by: float):
        """On a pool thread: the pool thread's worker compiles; the result is deserialized here."""
        import xgrammar

        worker = self._worker(start_by)
        try:
            serialized = worker.compile(constraint, self.limits.compile_timeout_s, self.limits.wait_s)
        except CompileTimedOut:
            with contextlib.suppress(SpawnerNotReady):
                self._worker(time.monotonic())  # its replacement (a fork) is ready before the next constraint
            raise
        return xgrammar.CompiledGrammar.deserialize_json(serialized, self._info)

    async def compile(self, constraint: Constraint):
        """The compiled grammar of a checked constraint (constraint.checked), from the cache or a worker."""
        hit = self.cache.get(constraint)
        if hit is not None:
            return hit
        refused = self.refused.get(constraint)
        if refused is not None and time.monotonic() < refused[1]:
            raise InvalidArgument(refused[0])
        self.compilations += 1
        limit = self.limits.compile_timeout_s
        if self.limits.compile_workers:
            job = self._pool.submit(self._compile_in_worker, constraint, time.monotonic() + limit)
        else:
            job = self._pool.submit(self.compile_now, constraint)
        future = asyncio.wrap_future(job)
        done, _ = await asyncio.wait({future}, timeout=limit)
        if not done and job.cancel():
            raise ResourceExhausted(
                f"sampling.constraint: every grammar compiler stayed busy for {limit:g} s with other constraints; "
                "retry later"
            )
        try:
            if not done and not self.limits.compile_workers:
                # A thread cannot be stopped: it ends when xgrammar does, its result unused.
                future.add_done_callback(lambda f: f.exception())
                raise CompileTimedOut
            # A worker's compilation ends within its limit (the worker is killed then).
            compiled = await future
        except SpawnerNotReady:
            raise ResourceExhausted(
                f"sampling.constraint: the grammar compilers did not start within {limit:g} s; retry later"
            ) from None
        except CompileStarved:
            raise ResourceExhausted(
                f"sampling.constraint: did not finish compiling within {self.limits.wait_s:g} s while the engine "
                "was busy; retry later"
            ) from None
        except CompileTimedOut:
            refusal = InvalidArgument(f"{constraint.kind.value}: did not compile within {limit:g} s (too complex)")
            until = time.monotonic() + self.limits.refused_slow_s
        except InvalidArgument as exc:
            refusal, until = exc, float("inf")
        else:
            self.cache.put(constraint, compiled, int(compiled.memory_size_bytes))
            return compiled
        self.refused.put(constraint, (refusal.message, until), constraint.num_bytes + len(refusal.message.encode()))
        raise refusal

    def pause_workers(self) -> None:
        """Stop every worker (SIGSTOP), and those forked until resume_workers(): their compilations wait, their
        CPU-time limits with them. Called by the engine's step thread; cheap (a signal per worker)."""
        self._hold(True)

    def resume_workers(self) -> None:
        self._hold(False)

    def _hold(self, paused: bool) -> None:
        with self._workers_lock:
            self._paused = paused
            for worker in self.workers:
                worker.pause() if paused else worker.resume()

    async def matcher(self, constraint: Constraint) -> RequestGrammar:
        return RequestGrammar(await self.compile(constraint), self.vocab_size)

    def close(self, wait: bool = False) -> None:
        """Stop compiling: the pool (its threads joined when wait), the workers and their spawner killed."""
        self._pool.shutdown(wait=wait, cancel_futures=True)
        with self._workers_lock:
            self._closed = True
            workers, self.workers = self.workers, []
            spawner, self._spawner = self._spawner, None
        for worker in workers:
            worker.kill()
        if spawner is not None:
            spawner.kill()
