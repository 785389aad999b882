"""Prefix-stable prompt rendering: character + structured messages -> token ids (Gemma turn format).

Each piece is tokenized on its own and the ids are joined; text is never re-tokenized across a
message boundary, so appending messages only appends tokens:

    [BOS]
    <start_of_turn>user\\n  {character block}              <end_of_turn> \\n
    <start_of_turn>user\\n  {author}: {text}               <end_of_turn> \\n     USER
    <start_of_turn>model\\n {text}                         <end_of_turn> \\n     CHARACTER
    <start_of_turn>user\\n  [system] {text}                <end_of_turn> \\n     SYSTEM
    <start_of_turn>model\\n                                                       generation prompt

The reply is generated after the last `<start_of_turn>model\\n` and ends with <end_of_turn>, which
is kept in the reply's token ids. Turn N+1, which carries the reply as a CHARACTER message, renders
it as the same header + the reply body + <end_of_turn> + "\\n": so its tokens begin with exactly
turn N's prompt + reply tokens, provided the reply body tokenizes back to the generated ids. Text
that a model generates need not be the tokenizer's canonical segmentation, so the engine remembers
the ids of the replies it generated (ReplyMemo) and the renderer prefers them; messages may also
carry their token ids directly. Message text is tokenized without special-token parsing: a user
cannot forge turn markers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum


class Role(Enum):
    USER = "user"
    CHARACTER = "character"
    SYSTEM = "system"


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    text: str = ""
    author: str = ""
    # The body already tokenized (instead of text).
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Character:
    name: str
    definition: str


START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"


class RenderStopped(Exception):
    """Rendering ended early: the client went away (`cancelled`) or the prompt passed max_tokens."""

    def __init__(self, cancelled: bool, num_tokens: int) -> None:
        super().__init__("cancelled" if cancelled else f"more than {num_tokens} tokens")
        self.cancelled = cancelled
        self.num_tokens = num_tokens


class PromptRenderer:
    def __init__(self, tokenizer, bos_token_id: int,
                 known_reply_ids: Callable[[str], list[int] | None] | None = None) -> None:
        self._tok = tokenizer
        self._bos = bos_token_id
        self._known_reply_ids = known_reply_ids
        special = lambda s: tokenizer.encode(s, add_bos=False, parse_special=True)  # noqa: E731
        self.user_header = special(START_OF_TURN + "user\n")
        self.model_header = special(START_OF_TURN + "model\n")
        self.end_of_turn = special(END_OF_TURN)
        self.newline = special("\n")
        self.end_of_turn_id = self.end_of_turn[0]

    def _text(self, text: str) -> list[int]:
        return self._tok.encode(text, add_bos=False, parse_special=False) if text else []

    def character_ids(self, character: Character | None) -> list[int]:
        if character is None or not (character.name or character.definition):
            return []
        body = self._text(f"You are {character.name}.\n" if character.name else "")
        body += self._text(character.definition)
        return self.user_header + body + self.end_of_turn + self.newline

    def body_ids(self, message: ChatMessage) -> list[int]:
        if message.token_ids is not None:
            return list(message.token_ids)
        if message.role is Role.CHARACTER:
            known = self._known_reply_ids(message.text) if self._known_reply_ids else None
            return list(known) if known is not None else self._text(message.text)
        if message.role is Role.SYSTEM:
            return self._text("[system] ") + self._text(message.text)
        prefix = self._text(f"{message.author}: ") if message.author else []
        return prefix + self._text(message.text)

    def message_ids(self, message: ChatMessage) -> list[int]:
        header = self.model_header if message.role is Role.CHARACTER else self.user_header
        return header + self.body_ids(message) + self.end_of_turn + self.newline

    def render(self, character: Character | None, messages: Sequence[ChatMessage]) -> list[int]:
        """The full prompt, ending with the generation prompt `<start_of_turn>model\\n`."""
        return self.render_prompt(character, messages).token_ids

    @property
    def message_overhead_tokens(self) -> int:
        """Tokens every message costs around its body (the shorter of the two turn headers)."""
        return min(len(self.user_header), len(self.model_header)) + len(self.end_of_turn) + len(self.newline)

    @property
    def prompt_overhead_tokens(self) -> int:
        """Tokens of a prompt besides its messages: BOS and the generation prompt."""
        return 1 + len(self.model_header)

    def render_prompt(self, character: Character | None, messages: Sequence[ChatMessage],
                      stop: threading.Event | None = None, max_tokens: int | None = None) -> RenderedPrompt:
        """The full prompt and where its last message starts. RenderStopped when `stop` is set (checked
        between messages) or as soon as the prompt holds more than max_tokens tokens."""
        ids = [self._bos] + self.character_ids(character)
        last_message_start = len(ids)
        for m in messages:
            if stop is not None and stop.is_set():
                raise RenderStopped(True, len(ids))
            if max_tokens is not None and len(ids) > max_tokens:
                raise RenderStopped(False, len(ids))
            last_message_start = len(ids)
            ids += self.message_ids(m)
        return RenderedPrompt(ids + self.model_header, last_message_start)


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: list[int]
    # Position of the first token of the last message (where a regeneration or edit diverges).
    last_message_start: int


class ReplyMemo:
    """Bounded map reply text -> the token ids generated for it (LRU), per namespace and conversation:
    a dialogue's replies shape only that dialogue's rendering, and go when it is deleted."""

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[tuple[str, str, str], tuple[int, ...]] = OrderedDict()

    def put(self, namespace: str, conversation_id: str, text: str, token_ids: Sequence[int]) -> None:
        key = (namespace, conversation_id, text)
        self._entries[key] = tuple(token_ids)
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def get(self, namespace: str, conversation_id: str, text: str) -> list[int] | None:
        key = (namespace, conversation_id, text)
        ids = self._entries.get(key)
        if ids is None:
            return None
        self._entries.move_to_end(key)
        return list(ids)

    def drop_conversation(self, namespace: str, conversation_id: str) -> int:
        """Forget a dialogue's replies; returns how many."""
        keys = [k for k in self._entries if k[0] == namespace and k[1] == conversation_id]
        for key in keys:
            del self._entries[key]
        return len(keys)
