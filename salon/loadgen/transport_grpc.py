"""The salon transport: salon.chat.v1.ChatService/Generate through the gateway, with the tenant's API key.

Messages go as the product backend sends them: history as text, replies generated in this run as
their token ids. A wrong key or target fails GetModelInfo with the gRPC error (before the run).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.loadgen.dialogue import ChatMessage
from salon.loadgen.transport import ModelInfo, TokenDelta, TransportError, TurnRequest, TurnUsage
from salon.loadgen.workload import Role

_ROLES = {Role.USER: chat_pb2.ROLE_USER, Role.CHARACTER: chat_pb2.ROLE_CHARACTER}


def to_proto_message(message: ChatMessage) -> chat_pb2.Message:
    if message.token_ids is not None:
        return chat_pb2.Message(role=_ROLES[message.role], author=message.author, token_ids=message.token_ids)
    return chat_pb2.Message(role=_ROLES[message.role], author=message.author, text=message.text or "")


def to_proto_request(turn: TurnRequest) -> chat_pb2.GenerateRequest:
    sampling = chat_pb2.SamplingParams(
        max_new_tokens=turn.max_new_tokens, temperature=turn.temperature, top_p=turn.top_p
    )
    if turn.seed is not None:
        sampling.seed = turn.seed
    return chat_pb2.GenerateRequest(
        conversation_id=turn.conversation_id,
        request_id=turn.request_id,
        character=chat_pb2.Character(name=turn.character_name, definition=turn.character_definition),
        dialogue=chat_pb2.Dialogue(messages=[to_proto_message(m) for m in turn.messages]),
        sampling=sampling,
    )


class ChatGrpcTransport:
    name = "salon"

    def __init__(self, target: str, api_key: str, request_timeout_s: float = 600.0) -> None:
        self.target, self.request_timeout_s = target, request_timeout_s
        self._metadata = (("authorization", f"Bearer {api_key}"),)
        self._channel: grpc.aio.Channel | None = None
        self._stub: chat_pb2_grpc.ChatServiceStub | None = None

    async def __aenter__(self) -> ChatGrpcTransport:
        self._channel = grpc.aio.insecure_channel(self.target)
        self._stub = chat_pb2_grpc.ChatServiceStub(self._channel)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def model_info(self) -> ModelInfo:
        """Raises grpc.aio.AioRpcError (a wrong key or target is the caller's to report)."""
        info = (
            await self._stub.GetModelInfo(chat_pb2.GetModelInfoRequest(), metadata=self._metadata, timeout=60)
        ).model
        return ModelInfo(info.model_id, info.max_context_tokens, frozenset(info.eos_token_ids))

    def prepare(self, turn: TurnRequest) -> chat_pb2.GenerateRequest:
        return to_proto_request(turn)

    async def generate(self, request: chat_pb2.GenerateRequest) -> AsyncIterator[TokenDelta | TurnUsage]:
        final = None
        try:
            call = self._stub.Generate(request, metadata=self._metadata, timeout=self.request_timeout_s)
            async for event in call:
                if event.HasField("delta"):
                    yield TokenDelta(tuple(event.delta.token_ids))
                elif event.HasField("final"):
                    final = event.final
        except grpc.aio.AioRpcError as exc:
            raise TransportError(f"{exc.code().name}: {exc.details()}") from exc
        if final is None:
            raise TransportError("PROTOCOL: stream ended without a final event")
        usage = final.usage
        yield TurnUsage(
            prompt_tokens=usage.prompt_tokens,
            cached_device_tokens=usage.cached_tokens.device,
            cached_host_tokens=usage.cached_tokens.host,
            generated_tokens=usage.generated_tokens,
            engine_id=final.engine_id,
            finish_reason=chat_pb2.FinishReason.Name(final.finish_reason),
            server_ttft_ms=final.timings.ttft_ms,
            server_queue_ms=final.timings.queue_ms,
        )
