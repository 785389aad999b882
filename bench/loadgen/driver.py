"""Replays a Trace against the gateway's public Chat API (salon.chat.v1.ChatService/Generate).

One asyncio task per dialogue: it waits for the dialogue's arrival, then plays its turns in order,
pausing for each think time (both scaled by `time_scale`; 0 replays as fast as the stack allows).
At most `concurrency` Generate streams are open at once. Every turn sends the whole dialogue;
replies generated in this run go back as token ids, so the next prompt extends this one exactly.

Priming (WorkloadConfig.prime_history, and DriverConfig.prime where there is a cache to fill):
before the clock starts, each dialogue's previous session's last turn is replayed — the history
without its last reply, one new token — so the measured turns meet histories the stack has served.

Timing is client-side: TTFT is from sending the request to the first delta that carries a token
id; the inter-token gaps come from delta arrival times (token_gaps_ms).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from bench.loadgen.dialogue import ChatMessage, DialogueState, strip_trailing_eos
from bench.loadgen.records import RunResult, TurnRecord
from bench.loadgen.workload import DialogueSpec, Role, Trace, TurnAction, WorkloadConfig
from salon.chat.v1 import chat_pb2, chat_pb2_grpc

_ROLES = {Role.USER: chat_pb2.ROLE_USER, Role.CHARACTER: chat_pb2.ROLE_CHARACTER}


@dataclass(frozen=True)
class DriverConfig:
    target: str
    api_key: str
    concurrency: int = 8
    time_scale: float = 1.0
    request_timeout_s: float = 600.0
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


def to_proto_message(message: ChatMessage) -> chat_pb2.Message:
    if message.token_ids is not None:
        return chat_pb2.Message(role=_ROLES[message.role], author=message.author, token_ids=message.token_ids)
    return chat_pb2.Message(role=_ROLES[message.role], author=message.author, text=message.text or "")


def build_request(spec: DialogueSpec, messages: list[ChatMessage], action: TurnAction, turn_index: int,
                  config: WorkloadConfig) -> chat_pb2.GenerateRequest:
    return chat_pb2.GenerateRequest(
        conversation_id=spec.conversation_id,
        request_id=f"{spec.conversation_id}-t{turn_index}",
        character=chat_pb2.Character(name=spec.character_name, definition=spec.character_definition),
        dialogue=chat_pb2.Dialogue(messages=[to_proto_message(m) for m in messages]),
        sampling=chat_pb2.SamplingParams(
            max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p,
            seed=action.sampling_seed,
        ),
    )


class Driver:
    def __init__(self, trace: Trace, config: DriverConfig, on_turn: Callable[[TurnRecord], None] | None = None):
        self.trace = trace
        self.config = config
        self.on_turn = on_turn
        self._metadata = (("authorization", f"Bearer {config.api_key}"),)
        self._records: list[TurnRecord] = []
        self._t0 = 0.0
        self._dropped = 0

    def _now_s(self) -> float:
        return time.perf_counter() - self._t0

    async def run(self, label: str) -> RunResult:
        async with grpc.aio.insecure_channel(self.config.target) as channel:
            stub = chat_pb2_grpc.ChatServiceStub(channel)
            info = (await stub.GetModelInfo(chat_pb2.GetModelInfoRequest(), metadata=self._metadata,
                                            timeout=60)).model
            eos_ids = frozenset(info.eos_token_ids)
            limit = asyncio.Semaphore(self.config.concurrency)
            states = [DialogueState(spec) for spec in self.trace.dialogues]
            for state in states:
                self._dropped += state.fit_context(info.max_context_tokens, self.trace.config.max_new_tokens)
            primed = self.trace.config.prime_history and self.config.prime
            extra = {}
            if primed:
                started = time.perf_counter()
                errors = await asyncio.gather(*(self._prime(stub, state, limit) for state in states))
                extra = {"prime_wall_s": time.perf_counter() - started,
                         "prime_errors": [e for e in errors if e is not None]}
            self._t0 = time.perf_counter()
            await asyncio.gather(*(self._play(stub, state, limit, eos_ids) for state in states))
            wall_s = self._now_s()
        records = tuple(sorted(self._records, key=lambda r: r.key))
        return RunResult(label, records, wall_s, info.model_id, self._dropped, primed, extra)

    async def _prime(self, stub, state: DialogueState, limit: asyncio.Semaphore) -> str | None:
        """The previous session's last turn: the history up to its last user message. Returns an error or None."""
        spec = state.spec
        if len(state.messages) < 2:
            return None
        request = chat_pb2.GenerateRequest(
            conversation_id=spec.conversation_id,
            request_id=f"{spec.conversation_id}-prime",
            character=chat_pb2.Character(name=spec.character_name, definition=spec.character_definition),
            dialogue=chat_pb2.Dialogue(messages=[to_proto_message(m) for m in state.messages[:-1]]),
            sampling=chat_pb2.SamplingParams(max_new_tokens=1, temperature=0.0),
        )
        async with limit:
            try:
                async for _ in stub.Generate(request, metadata=self._metadata, timeout=self.config.request_timeout_s):
                    pass
            except grpc.aio.AioRpcError as exc:
                return f"{spec.conversation_id}: {exc.code().name}: {exc.details()}"
        return None

    async def _play(self, stub, state: DialogueState, limit: asyncio.Semaphore, eos_ids: frozenset[int]) -> None:
        spec = state.spec
        await asyncio.sleep(spec.arrival_s * self.config.time_scale)
        for turn_index, action in enumerate(spec.turns):
            await asyncio.sleep(action.think_s * self.config.time_scale)
            messages = state.begin_turn(action)
            request = build_request(spec, messages, action, turn_index, self.trace.config)
            async with limit:
                record = await self._generate(stub, request, spec.dialogue_index, turn_index, action)
            if record.ok:
                state.finish_turn(strip_trailing_eos(list(record.reply_token_ids), eos_ids))
            else:
                state.abort_turn()
            self._records.append(record)
            if self.on_turn is not None:
                self.on_turn(record)

    async def _generate(self, stub, request: chat_pb2.GenerateRequest, dialogue_index: int, turn_index: int,
                        action: TurnAction) -> TurnRecord:
        sent_s = self._now_s()
        arrivals: list[tuple[float, int]] = []
        token_ids: list[int] = []
        final = None
        error = None
        try:
            call = stub.Generate(request, metadata=self._metadata, timeout=self.config.request_timeout_s)
            async for event in call:
                if event.HasField("delta"):
                    ids = list(event.delta.token_ids)
                    arrivals.append((self._now_s(), len(ids)))
                    token_ids.extend(ids)
                elif event.HasField("final"):
                    final = event.final
            if final is None:
                error = "PROTOCOL: stream ended without a final event"
        except grpc.aio.AioRpcError as exc:
            error = f"{exc.code().name}: {exc.details()}"
        end_s = self._now_s()
        first = next((t for t, n in arrivals if n > 0), None)
        usage = final.usage if final is not None else chat_pb2.Usage()
        return TurnRecord(
            dialogue_index=dialogue_index,
            turn_index=turn_index,
            kind=action.kind.value,
            sent_s=sent_s,
            end_s=end_s,
            ttft_ms=None if error is not None or first is None else (first - sent_s) * 1000.0,
            itl_ms=tuple(token_gaps_ms(arrivals)) if error is None else (),
            prompt_tokens=usage.prompt_tokens,
            cached_device_tokens=usage.cached_tokens.device,
            cached_host_tokens=usage.cached_tokens.host,
            generated_tokens=usage.generated_tokens,
            engine_id=final.engine_id if final is not None else "",
            finish_reason=chat_pb2.FinishReason.Name(final.finish_reason) if final is not None else "",
            server_ttft_ms=final.timings.ttft_ms if final is not None else None,
            reply_token_ids=tuple(token_ids),
            error=error,
        )


async def replay(trace: Trace, config: DriverConfig, label: str,
                 on_turn: Callable[[TurnRecord], None] | None = None) -> RunResult:
    return await Driver(trace, config, on_turn).run(label)
