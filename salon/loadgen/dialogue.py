"""The client-side state of one dialogue: the messages a product backend would send each turn.

Invariant between turns: the messages alternate user / character and end with a character message
(pre-built history as text, replies generated in this run as the token ids the model produced, minus
trailing EOS ids). So every turn's prompt extends the previous turn's prompt exactly, except where the
turn itself rewrites the tail:

    before:       [..., U_k, C_k]
    MESSAGE:      [..., U_k, C_k, U_new]          -> reply C_new appended
    REGENERATE:   [..., U_k]                      -> reply C_k' replaces C_k
    EDIT:         [..., U_k']                     -> U_k edited, reply C_k' replaces C_k

`begin_turn` applies the action and returns the request messages; `finish_turn` appends the reply;
`abort_turn` restores the state from before the action (a failed request changes nothing).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from salon.loadgen.workload import DialogueSpec, Role, TurnAction, TurnKind

EMPTY_REPLY_TEXT = "..."


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    author: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None


def estimate_tokens(message: ChatMessage) -> int:
    """A generous token estimate (template overhead + 1.6 tokens per word) used only to fit the context."""
    if message.token_ids is not None:
        return len(message.token_ids) + 8
    return 8 + (16 * len((message.text or "").split()) + 9) // 10


def strip_trailing_eos(token_ids: list[int], eos_token_ids: Collection[int]) -> list[int]:
    end = len(token_ids)
    while end > 0 and token_ids[end - 1] in eos_token_ids:
        end -= 1
    return token_ids[:end]


def growth_tokens(spec: DialogueSpec, max_new_tokens: int) -> int:
    """Estimated tokens of the character block and of every turn's user message and reply."""
    user_words = max((len((t.user_text or "").split()) for t in spec.turns), default=0)
    growth = len(spec.turns) * (8 + (16 * user_words + 9) // 10 + 8 + max_new_tokens)
    return growth + 16 + (16 * len(spec.character_definition.split()) + 9) // 10


def context_tokens_needed(spec: DialogueSpec, max_new_tokens: int) -> int:
    """The smallest context in which `fit_context` keeps the dialogue's whole history (an estimate that
    errs high): a server given this much per dialogue sees exactly the trace's prompts."""
    history = sum(estimate_tokens(ChatMessage(m.role, m.author, text=m.text)) for m in spec.history)
    return history + max_new_tokens + growth_tokens(spec, max_new_tokens)


class DialogueState:
    def __init__(self, spec: DialogueSpec) -> None:
        self.spec = spec
        self.messages: list[ChatMessage] = [ChatMessage(m.role, m.author, text=m.text) for m in spec.history]
        self._saved: list[ChatMessage] | None = None

    def fit_context(self, max_context_tokens: int, max_new_tokens: int) -> int:
        """Drops the oldest user/character pairs until the whole run is estimated to fit the context.

        Room is kept for every turn of the trace (a user message and a full reply each). Returns the
        number of messages dropped.
        """
        budget = max_context_tokens - max_new_tokens - growth_tokens(self.spec, max_new_tokens)
        dropped = 0
        while len(self.messages) > 2 and sum(estimate_tokens(m) for m in self.messages) > budget:
            del self.messages[:2]
            dropped += 2
        return dropped

    def begin_turn(self, action: TurnAction) -> list[ChatMessage]:
        if self._saved is not None:
            raise RuntimeError("begin_turn called while a turn is in flight")
        self._saved = list(self.messages)
        user = ChatMessage(Role.USER, self.spec.user_name, text=action.user_text)
        if action.kind is TurnKind.MESSAGE:
            self.messages.append(user)
        else:
            if len(self.messages) < 2 or self.messages[-1].role is not Role.CHARACTER:
                raise RuntimeError(f"{action.kind.value} needs a last character reply to replace")
            del self.messages[-1]
            if action.kind is TurnKind.EDIT:
                self.messages[-1] = user
        return list(self.messages)

    def finish_turn(self, reply_token_ids: list[int]) -> None:
        """Appends the reply (EOS already stripped). An empty reply cannot be sent as token ids (the API
        needs exactly one of text / token_ids set), so it is kept as the text "..." instead."""
        if reply_token_ids:
            reply = ChatMessage(Role.CHARACTER, self.spec.character_name, token_ids=tuple(reply_token_ids))
        else:
            reply = ChatMessage(Role.CHARACTER, self.spec.character_name, text=EMPTY_REPLY_TEXT)
        self.messages.append(reply)
        self._saved = None

    def abort_turn(self) -> None:
        if self._saved is not None:
            self.messages = self._saved
            self._saved = None
