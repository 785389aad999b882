"""Replays of a trace: through salon alone (a stack launched for the run, or one already running; run_salon
returns the RunResult and the kvstore's stats), or through salon and llama-server on the same GGUF side by side.

The peer gets what salon gets: the same trace and concurrency (llama-server with that many slots,
each with context for the longest dialogue, so neither side drops history), the same prompt tokens
(transport_llama_server renders with salon's renderer), the same reply length, and greedy decoding
when the trace is greedy. Its threads default to this host's cores, as the salon engines share them.

Side by side (run_alternated_with_llama_server), salon's stack and llama-server are each started once and
rounds alternate on them (salon first, then the peer first, ...), each round a trace of its own that both replay,
so a ratio is taken of two replays run back to back, never of runs at different times.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from salon.loadgen.alternation import alternated_pairs
from salon.loadgen.dialogue import context_tokens_needed
from salon.loadgen.driver import DriverConfig, replay
from salon.loadgen.records import RunResult, TurnRecord
from salon.loadgen.transport_grpc import ChatGrpcTransport
from salon.loadgen.workload import Trace

PEER_MODEL = "gemma-3-270m"  # the model whose GGUF llama-server loads


@dataclass(frozen=True)
class SalonSide:
    """Where salon runs: a stack launched for the run (launch=True) or the gateway at target."""

    launch: bool
    target: str
    api_key: str
    model: str
    num_engines: int
    kvstore: bool
    kvstore_capacity_bytes: int
    engine_kv_cache_bytes: int | None
    engine_args: tuple[str, ...]
    startup_timeout_s: float
    request_timeout_s: float
    log_dir: Path


def run_salon(
    trace: Trace,
    side: SalonSide,
    cache: bool,
    driver: DriverConfig,
    on_turn: Callable[[TurnRecord], None] | None = None,
    log_prefix: str = "",
    mode_detail: str | None = None,
    api: str = "grpc",
    label: str | None = None,
    after_run: Callable[[object], dict] | None = None,
) -> tuple[RunResult, dict | None]:
    """Replays the trace through salon (with or without its caches); (RunResult, kvstore GetStats or None).

    api "grpc": salon.chat.v1 with conversation ids; "openai": the HTTP API as a stateless client (no
    conversation ids; needs a launched stack). after_run(stack) runs on the launched stack before it
    stops; what it returns lands in the run's `extra`."""
    label = label or ("cache" if cache else "no-cache")
    stack = None
    target, api_key = side.target, side.api_key
    if side.launch:
        stack, api_key = _launch(side, cache, label, log_prefix, api)
        target = stack.gateway_address
    try:
        # Priming fills a cache; without one it would only cost time, so the no-cache run skips it.
        if api == "openai":
            from salon.loadgen.transport_openai import OpenAIHttpTransport

            if stack is None:
                raise ValueError("the OpenAI transport needs a launched stack (--launch)")
            transport = OpenAIHttpTransport(stack.http_url, api_key, request_timeout_s=side.request_timeout_s)
        else:
            transport = ChatGrpcTransport(target, api_key, side.request_timeout_s)
        run = asyncio.run(replay(trace, transport, replace(driver, prime=driver.prime and cache), label, on_turn))
        stats = stack.kvstore_stats() if stack is not None else None
        if after_run is not None and stack is not None:
            run = replace(run, extra={**run.extra, **after_run(stack)})
    finally:
        if stack is not None:
            stack.stop()
    if mode_detail:
        run = replace(run, extra={**run.extra, "mode_detail": mode_detail})
    return run, stats


def _launch(side: SalonSide, cache: bool, label: str, log_prefix: str = "", api: str = "grpc"):
    """(the launched stack, its API key)."""
    from salon.loadgen.stack import StackConfig, launch_stack

    config = StackConfig(
        model=side.model,
        num_engines=side.num_engines,
        cache=cache,
        kvstore=cache and side.kvstore,
        engine_args=side.engine_args,
        kvstore_capacity_bytes=side.kvstore_capacity_bytes,
        engine_kv_cache_bytes=side.engine_kv_cache_bytes,
        engine_timeout_s=side.startup_timeout_s,
        http=api == "openai",
    )
    log_dir = side.log_dir / log_prefix if log_prefix else side.log_dir
    print(f"starting {label} stack: {side.num_engines} engine(s) of {side.model}, logs in {log_dir}", flush=True)
    return launch_stack(config, log_dir), config.api_key


def load_rendering(model: str):
    """salon's renderer over the model's tokenizer and chat format (synthetic models: Gemma's)."""
    from salon.engine.model.loader import open_model_file
    from salon.engine.model.tokenizer import Tokenizer
    from salon.loadgen.transport_llama_server import SalonRendering

    model_file = open_model_file(model)
    return SalonRendering(Tokenizer(model_file.vocab), model_file.chat_template, model_file.config.eos_token_ids)


def peer_context_tokens(trace: Trace | Sequence[Trace], round_to: int = 256) -> int:
    """Context per llama-server slot: enough that no dialogue of the trace (or traces) drops history."""
    traces = [trace] if isinstance(trace, Trace) else list(trace)
    need = max(context_tokens_needed(d, t.config.max_new_tokens) for t in traces for d in t.dialogues)
    return -(-need // round_to) * round_to


@dataclass(frozen=True)
class PeerRun:
    run: RunResult
    threads: int
    num_slots: int
    ctx_tokens_per_slot: int
    num_held_back_turns: int


@dataclass(frozen=True)
class AlternatedRuns:
    """Each round's replays, salon's and the peer's of the same trace (rounds[i] = (salon, peer))."""

    rounds: list[tuple[RunResult, RunResult]]
    peer: PeerRun  # the peer's first round, and how it ran (num_held_back_turns: over all rounds)


def run_alternated_with_llama_server(
    traces: Sequence[Trace],
    side: SalonSide,
    build,
    driver: DriverConfig,
    progress: Callable[[str, Trace, Callable], object],
    threads: int | None = None,
    cache: bool = True,
    rendering=None,
) -> AlternatedRuns:
    """Salon's stack (launched) and llama-server started once each, then one round per trace: salon and the peer
    replay it, salon first in even rounds and the peer first in odd ones. `progress(label, trace, fn)` runs
    fn(on_turn) (a progress bar). Raises salon.loadgen.peer.PeerError when llama-server cannot start."""
    from salon.engine.model.loader import config_for
    from salon.engine.model.sources import resolve_source
    from salon.loadgen.peer import LlamaServer
    from salon.loadgen.transport_llama_server import LlamaServerTransport

    if not side.launch:
        raise ValueError("an alternated comparison launches its own stack (--launch)")
    threads = threads or os.cpu_count() or 1
    ctx = peer_context_tokens(traces)
    model_config = config_for(PEER_MODEL)
    server = LlamaServer(
        build,
        resolve_source(PEER_MODEL).path,
        threads=threads,
        num_slots=driver.concurrency,
        ctx_tokens_per_slot=ctx,
        startup_timeout_s=side.startup_timeout_s,
    )
    peer_transport = LlamaServerTransport(
        server,
        rendering or load_rendering(PEER_MODEL),
        model_config.model_id,
        frozenset(model_config.eos_token_ids),
        owns_server=False,
    )
    label = "cache" if cache else "no-cache"
    salon_runs: list[RunResult] = []
    peer_runs: list[RunResult] = []
    with asyncio.Runner() as runner:  # one event loop: llama-server's process and client live across rounds
        print(
            f"starting llama-server: {driver.concurrency} slots x {ctx} tokens of context, {threads} threads, "
            f"{build.describe()}",
            flush=True,
        )
        runner.run(server.__aenter__())
        try:
            stack, api_key = _launch(side, cache, label)
            try:
                salon_driver = replace(driver, prime=driver.prime and cache)

                def salon_round() -> RunResult:
                    trace = traces[len(salon_runs)]
                    transport = ChatGrpcTransport(stack.gateway_address, api_key, side.request_timeout_s)
                    salon_runs.append(
                        progress(
                            f"{label} {len(salon_runs) + 1}/{len(traces)}",
                            trace,
                            lambda on_turn: runner.run(replay(trace, transport, salon_driver, label, on_turn)),
                        )
                    )
                    return salon_runs[-1]

                def peer_round() -> RunResult:
                    trace = traces[len(peer_runs)]
                    peer_runs.append(
                        progress(
                            f"llama-server {len(peer_runs) + 1}/{len(traces)}",
                            trace,
                            lambda on_turn: runner.run(replay(trace, peer_transport, driver, "llama-server", on_turn)),
                        )
                    )
                    return peer_runs[-1]

                pairs = alternated_pairs(salon_round, peer_round, len(traces))
            finally:
                stack.stop()
        finally:
            runner.run(server.__aexit__(None, None, None))
    first = PeerRun(pairs[0][1], threads, driver.concurrency, ctx, peer_transport.num_held_back_turns)
    return AlternatedRuns(pairs, first)
