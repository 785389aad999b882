"""How the driver reaches a server: one small interface, one implementation per API.

The driver (driver.py) owns the trace, the dialogue states, concurrency and the clock; a transport
only carries one turn there and back:

    async with transport:                       connect (and whatever the server needs)
        info = await transport.model_info()     once, before the run: id, context, EOS ids
        prepared = transport.prepare(turn)       the client's own work (encoding, rendering), off the clock
        async for event in transport.generate(prepared):
            TokenDelta ...                      token ids as they arrive (the driver times them)
            TurnUsage                           last: prompt / cached / generated counts

A failed turn raises TransportError("<STATUS>: <details>"); the driver records it and the dialogue
goes on unchanged. Implementations: transport_grpc.ChatGrpcTransport (salon.chat.v1 through the
gateway) and transport_llama_server.LlamaServerTransport (llama-server's /completion, the prompt
rendered by salon's own renderer and sent as token ids). Another API (an HTTP front) is one more
class with these four methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from salon.loadgen.dialogue import ChatMessage


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    max_context_tokens: int
    eos_token_ids: frozenset[int]


@dataclass(frozen=True)
class TurnRequest:
    """One turn as any API would need it: the whole dialogue and the sampling of the reply."""

    conversation_id: str
    request_id: str
    character_name: str
    character_definition: str
    messages: tuple[ChatMessage, ...]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None


@dataclass(frozen=True)
class TokenDelta:
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class TurnUsage:
    """The server's own account of the turn (the last event of a successful turn)."""

    prompt_tokens: int
    # Prompt tokens the server did not compute. salon: its device / host caches; llama-server: its
    # prompt cache (timings.cache_n, slot KV or the host-memory prompt cache alike) counts as device.
    cached_device_tokens: int
    cached_host_tokens: int
    generated_tokens: int
    engine_id: str = ""
    finish_reason: str = ""
    server_ttft_ms: float | None = None
    server_queue_ms: float | None = None


class TransportError(Exception):
    """A turn failed; the message reads "<STATUS>: <details>"."""


class Transport(Protocol):
    name: str  # what the run is labelled with in reports: "salon" or "llama-server"

    async def __aenter__(self) -> Transport: ...

    async def __aexit__(self, *exc) -> None: ...

    async def model_info(self) -> ModelInfo: ...

    def prepare(self, request: TurnRequest) -> object: ...

    def generate(self, prepared: object) -> AsyncIterator[TokenDelta | TurnUsage]: ...
