"""The peer transport: the same turns through llama-server (salon/loadgen/peer.py's LlamaServer), prompt cache on.

Each turn's prompt is rendered exactly as a salon engine renders it -- salon's own PromptRenderer over the
model's chat format and tokenizer (salon/engine/api/prompt.py), history rendered message by message,
replies kept as the ids the server generated -- and sent to /completion as token ids. So both servers see the same
prompt tokens for the same dialogue state, and a returning turn's prompt extends the previous one
exactly, which is what llama-server's prompt cache (`cache_prompt`, slot KV and its host-memory
cache) reuses. Decoding is greedy (llama-server's /completion here has no seeded sampling to match).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from salon.engine.api import prompt as salon_prompt
from salon.loadgen.dialogue import ChatMessage
from salon.loadgen.peer import Completion, LlamaServer, PeerError
from salon.loadgen.transport import ModelInfo, TokenDelta, TransportError, TurnRequest, TurnUsage
from salon.loadgen.workload import Role

_ROLES = {Role.USER: salon_prompt.Role.USER, Role.CHARACTER: salon_prompt.Role.CHARACTER}


class SalonRendering:
    """Dialogue messages -> prompt token ids, with the engine's renderer over the model's chat format.

    The engine's ChatRenderer caches its renders per conversation prefix, so a dialogue that re-sends its whole
    history every turn has only its new messages rendered (tens of milliseconds per 2k-token prompt otherwise,
    on the client). `reference_ids` renders with a fresh renderer (nothing cached); a test holds the two equal.
    """

    def __init__(self, tokenizer, chat_template: str | None, eos_token_ids) -> None:
        from salon.engine.model.chat_renderer import ChatRenderer

        self._make = lambda: salon_prompt.PromptRenderer(
            ChatRenderer(tokenizer, chat_template, eos_token_ids, cache_capacity=1 << 16)
        )
        self.renderer = self._make()

    def prompt_ids(self, turn: TurnRequest) -> list[int]:
        return self.renderer.render(_character(turn), [to_prompt_message(m) for m in turn.messages])

    def reference_ids(self, turn: TurnRequest) -> list[int]:
        return self._make().render(_character(turn), [to_prompt_message(m) for m in turn.messages])


def _character(turn: TurnRequest) -> salon_prompt.Character:
    return salon_prompt.Character(turn.character_name, turn.character_definition)


def to_prompt_message(message: ChatMessage) -> salon_prompt.ChatMessage:
    return salon_prompt.ChatMessage(
        role=_ROLES[message.role], text=message.text or "", author=message.author, token_ids=message.token_ids
    )


class LlamaServerTransport:
    name = "llama-server"

    def __init__(
        self,
        server: LlamaServer,
        rendering: SalonRendering,
        model_id: str,
        eos_token_ids: frozenset[int],
        *,
        owns_server: bool = True,
    ) -> None:
        """owns_server: entering the transport starts the server and leaving stops it; False: the caller runs it
        (replays one after another on one server)."""
        self.server, self.rendering, self.owns_server = server, rendering, owns_server
        self._info = ModelInfo(f"{model_id} (llama.cpp)", server.ctx_tokens_per_slot, eos_token_ids)
        # Turns whose stream carried fewer ids than llama-server generated (a token held back inside a
        # multi-byte character at the end of a reply): their next prompt lacks that token.
        self.num_held_back_turns = 0

    async def __aenter__(self) -> LlamaServerTransport:
        if self.owns_server:
            await self.server.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        if self.owns_server:
            await self.server.__aexit__(*exc)

    async def model_info(self) -> ModelInfo:
        return self._info

    def prepare(self, turn: TurnRequest) -> tuple[list[int], int]:
        return self.rendering.prompt_ids(turn), turn.max_new_tokens

    async def generate(self, prepared: tuple[list[int], int]) -> AsyncIterator[TokenDelta | TurnUsage]:
        ids, max_new_tokens = prepared
        completion: Completion | None = None
        try:
            async for item in self.server.stream(ids, max_new_tokens):
                if isinstance(item, Completion):
                    completion = item
                else:
                    yield TokenDelta(tuple(item))
        except PeerError as exc:
            raise TransportError(f"PEER: {exc}") from exc
        if completion.num_prompt_tokens != len(ids):
            raise TransportError(
                f"PEER: llama-server evaluated {completion.num_prompt_tokens} prompt tokens, {len(ids)} were sent"
            )
        if len(completion.token_ids) != completion.num_generated_tokens:
            self.num_held_back_turns += 1
        yield TurnUsage(
            prompt_tokens=len(ids),
            cached_device_tokens=completion.num_cached_prompt_tokens or 0,
            cached_host_tokens=0,
            generated_tokens=completion.num_generated_tokens,
            engine_id="llama-server",
            finish_reason=completion.stop_type or "",
        )
