"""Replays a Trace through a Transport (transport.py): the gateway's Chat API, or a peer server.

One asyncio task per dialogue: it waits for the dialogue's arrival, then plays its turns in order,
pausing for each think time (both scaled by `time_scale`; 0 replays as fast as the server allows).
At most `concurrency` turns are in flight at once. Every turn sends the whole dialogue; replies
generated in this run go back as token ids, so the next prompt extends this one exactly.

Priming is off unless asked for (WorkloadConfig.prime_history and DriverConfig.prime): then, before
the clock starts, each dialogue's previous session's last turn is replayed -- the history without
its last reply, one new token -- so the measured turns meet histories the server has served.

Timing is client-side and the same for every transport: TTFT is from handing the prepared turn
(transport.prepare: the request encoded, or the prompt rendered, before the turn waits for a slot)
to the transport to the first delta that carries a token id; the inter-token gaps come from delta
arrival times (token_gaps_ms).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from salon.loadgen.dialogue import ChatMessage, DialogueState, strip_trailing_eos
from salon.loadgen.records import RunResult, TurnRecord
from salon.loadgen.transport import TokenDelta, Transport, TransportError, TurnRequest, TurnUsage
from salon.loadgen.workload import DialogueSpec, Trace, TurnAction, WorkloadConfig


@dataclass(frozen=True)
class DriverConfig:
    concurrency: int = 8
    time_scale: float = 1.0
    # Replay the previous session's last turn before the clock starts (when the trace asks for it).
    prime: bool = True


def token_gaps_ms(arrivals: Sequence[tuple[float, int]]) -> list[float]:
    """Inter-token latencies from (arrival time in seconds, number of token ids) per delta.

    The first token has no gap. A delta carrying k > 1 tokens (the server batched them) spreads the
    gap since the previous delta evenly over its k tokens, so the gaps still sum to the time between
    the first and the last token.
    """
    gaps: list[float] = []
    previous_s: float | None = None
    for arrival_s, num_tokens in arrivals:
        if num_tokens == 0:
            continue
        if previous_s is None:
            gaps.extend([0.0] * (num_tokens - 1))
        else:
            gaps.extend([(arrival_s - previous_s) * 1000.0 / num_tokens] * num_tokens)
        previous_s = arrival_s
    return gaps


def turn_request(
    spec: DialogueSpec, messages: list[ChatMessage], action: TurnAction, turn_index: int, config: WorkloadConfig
) -> TurnRequest:
    return TurnRequest(
        conversation_id=spec.conversation_id,
        request_id=f"{spec.conversation_id}-t{turn_index}",
        character_name=spec.character_name,
        character_definition=spec.character_definition,
        messages=tuple(messages),
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=action.sampling_seed,
    )


def prime_request(spec: DialogueSpec, history: list[ChatMessage]) -> TurnRequest:
    """The previous session's last turn: the history up to its last user message, one greedy token."""
    return TurnRequest(
        spec.conversation_id,
        f"{spec.conversation_id}-prime",
        spec.character_name,
        spec.character_definition,
        tuple(history[:-1]),
        max_new_tokens=1,
        temperature=0.0,
        top_p=0.0,
        seed=None,
    )


class Driver:
    def __init__(
        self,
        trace: Trace,
        transport: Transport,
        config: DriverConfig,
        on_turn: Callable[[TurnRecord], None] | None = None,
    ):
        self.trace = trace
        self.transport = transport
        self.config = config
        self.on_turn = on_turn
        self._records: list[TurnRecord] = []
        self._t0 = 0.0
        self._dropped = 0

    def _now_s(self) -> float:
        return time.perf_counter() - self._t0

    async def run(self, label: str) -> RunResult:
        async with self.transport:
            info = await self.transport.model_info()
            limit = asyncio.Semaphore(self.config.concurrency)
            states = [DialogueState(spec) for spec in self.trace.dialogues]
            for state in states:
                self._dropped += state.fit_context(info.max_context_tokens, self.trace.config.max_new_tokens)
            primed = self.trace.config.prime_history and self.config.prime
            extra = {}
            if primed:
                started = time.perf_counter()
                errors = await asyncio.gather(*(self._prime(state, limit) for state in states))
                extra = {
                    "prime_wall_s": time.perf_counter() - started,
                    "prime_errors": [e for e in errors if e is not None],
                }
            self._t0 = time.perf_counter()
            await asyncio.gather(*(self._play(state, limit, info.eos_token_ids) for state in states))
            wall_s = self._now_s()
        records = tuple(sorted(self._records, key=lambda r: r.key))
        return RunResult(label, records, wall_s, info.model_id, self._dropped, primed, extra)

    async def _prime(self, state: DialogueState, limit: asyncio.Semaphore) -> str | None:
        """Returns an error or None."""
        if len(state.messages) < 2:
            return None
        async with limit:
            try:
                async for _ in self.transport.generate(
                    self.transport.prepare(prime_request(state.spec, state.messages))
                ):
                    pass
            except TransportError as exc:
                return f"{state.spec.conversation_id}: {exc}"
        return None

    async def _play(self, state: DialogueState, limit: asyncio.Semaphore, eos_ids: frozenset[int]) -> None:
        spec = state.spec
        await asyncio.sleep(spec.arrival_s * self.config.time_scale)
        for turn_index, action in enumerate(spec.turns):
            await asyncio.sleep(action.think_s * self.config.time_scale)
            messages = state.begin_turn(action)
            prepared = self.transport.prepare(turn_request(spec, messages, action, turn_index, self.trace.config))
            async with limit:
                record = await self._generate(prepared, spec.dialogue_index, turn_index, action)
            if record.ok:
                state.finish_turn(strip_trailing_eos(list(record.reply_token_ids), eos_ids))
            else:
                state.abort_turn()
            self._records.append(record)
            if self.on_turn is not None:
                self.on_turn(record)

    async def _generate(self, prepared: object, dialogue_index: int, turn_index: int, action: TurnAction) -> TurnRecord:
        sent_s = self._now_s()
        arrivals: list[tuple[float, int]] = []
        token_ids: list[int] = []
        usage: TurnUsage | None = None
        error = None
        try:
            async for event in self.transport.generate(prepared):
                if isinstance(event, TokenDelta):
                    arrivals.append((self._now_s(), len(event.token_ids)))
                    token_ids.extend(event.token_ids)
                else:
                    usage = event
            if usage is None:
                error = "PROTOCOL: the transport ended a turn without its usage"
        except TransportError as exc:
            error = str(exc)
        end_s = self._now_s()
        first = next((t for t, n in arrivals if n > 0), None)
        usage = usage if error is None else None
        return TurnRecord(
            dialogue_index=dialogue_index,
            turn_index=turn_index,
            kind=action.kind.value,
            sent_s=sent_s,
            end_s=end_s,
            ttft_ms=None if error is not None or first is None else (first - sent_s) * 1000.0,
            itl_ms=tuple(token_gaps_ms(arrivals)) if error is None else (),
            prompt_tokens=usage.prompt_tokens if usage else 0,
            cached_device_tokens=usage.cached_device_tokens if usage else 0,
            cached_host_tokens=usage.cached_host_tokens if usage else 0,
            generated_tokens=usage.generated_tokens if usage else 0,
            engine_id=usage.engine_id if usage else "",
            finish_reason=usage.finish_reason if usage else "",
            server_ttft_ms=usage.server_ttft_ms if usage else None,
            server_queue_ms=usage.server_queue_ms if usage else None,
            reply_token_ids=tuple(token_ids),
            error=error,
        )


async def replay(
    trace: Trace,
    transport: Transport,
    config: DriverConfig,
    label: str,
    on_turn: Callable[[TurnRecord], None] | None = None,
) -> RunResult:
    return await Driver(trace, transport, config, on_turn).run(label)
