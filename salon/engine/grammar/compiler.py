"""Constraints compiled to grammars for one tokenizer, off every event loop, within a time limit, cached.

    compile(constraint)   cache hit -> the compiled grammar at once
                          miss      -> xgrammar compiles it on the compiler's thread pool; the caller awaits
                                       it for at most compile_timeout_s; INVALID_ARGUMENT naming the problem
                                       when it does not compile or does not finish in time
    matcher(compiled)     a request's matcher (matcher.py)

The vocabulary is handed to xgrammar once, as each token's bytes (its tokenizer object is built on the pool
when the compiler is made, so the first request does not wait for it). Control tokens other than the stop
tokens are given as empty pieces: a constraint never admits them, and a finished grammar admits only the
stop tokens. JSON is compiled without free whitespace (items ", ", keys ": "): a small model given free
whitespace can fill its whole budget with it.

xgrammar releases the GIL while it compiles, so a long compilation costs the event loop nothing; it cannot
be cancelled, so one that outlives its time limit still holds a pool thread until it ends (the pool's size
bounds what hostile constraints can hold).
"""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from salon.common.errors import InvalidArgument
from salon.engine.grammar.cache import CompiledCache
from salon.engine.grammar.constraint import Constraint, ConstraintKind
from salon.engine.grammar.lark import as_ebnf
from salon.engine.grammar.matcher import RequestGrammar
from salon.engine.model.tokenizer import Tokenizer

# xgrammar's messages start with a time and its source file: "[19:29:00] /project/cpp/x.cc:94: "
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


@dataclass(frozen=True)
class GrammarLimits:
    # Bytes of compiled grammars kept (least recently used evicted first).
    cache_bytes: int = 256 << 20
    # How long a request waits for its constraint to compile before INVALID_ARGUMENT.
    compile_timeout_s: float = 10.0
    # Threads that compile (each compilation uses one).
    compile_threads: int = 2


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
    def __init__(self, tokenizer: Tokenizer, stop_token_ids: tuple[int, ...], limits: GrammarLimits) -> None:
        self.limits = limits
        self.vocab_size = tokenizer.vocab_size
        self.stop_token_ids = stop_token_ids
        self._pool = ThreadPoolExecutor(limits.compile_threads, thread_name_prefix="grammar-compile")
        self._compiler = self._pool.submit(self._make_compiler, tokenizer, stop_token_ids)
        self.cache: CompiledCache = CompiledCache(limits.cache_bytes)

    @staticmethod
    def _make_compiler(tokenizer: Tokenizer, stop_token_ids: tuple[int, ...]):
        import xgrammar

        info = xgrammar.TokenizerInfo(
            vocabulary(tokenizer, stop_token_ids), xgrammar.VocabType.RAW, stop_token_ids=list(stop_token_ids)
        )
        # One bound for the whole engine: this module's cache; xgrammar's own is off.
        return xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

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

    async def compile(self, constraint: Constraint):
        """The compiled grammar of a checked constraint (constraint.checked), from the cache or the pool."""
        hit = self.cache.get(constraint)
        if hit is not None:
            return hit
        future = asyncio.wrap_future(self._pool.submit(self.compile_now, constraint))
        try:
            compiled = await asyncio.wait_for(future, self.limits.compile_timeout_s)
        except TimeoutError:
            raise InvalidArgument(
                f"{constraint.kind.value}: did not compile within {self.limits.compile_timeout_s:g} s "
                "(too complex, or the engine's grammar compiler is busy)"
            ) from None
        self.cache.put(constraint, compiled, int(compiled.memory_size_bytes))
        return compiled

    async def matcher(self, constraint: Constraint) -> RequestGrammar:
        return RequestGrammar(await self.compile(constraint), self.vocab_size)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
