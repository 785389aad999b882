"""A dialogue (character + structured messages) -> prompt token ids, in the model's own chat format.

The engine's messages map onto the roles chat templates know, and model/chat_renderer.py renders them
through the model's template (the GGUF's `tokenizer.chat_template`, or Gemma's turn format for a file
without one) one message at a time, so appending a message only appends tokens:

    character        -> a system message "You are {name}.\n{definition}" where the template has a system
                        role (Gemma's turn format folds it into the first user turn); otherwise it opens the
                        first user message, followed by a blank line
    USER             -> user       "{author}: {text}" (or just the text without an author)
    CHARACTER        -> assistant  the text (or the ids the model generated for it)
    SYSTEM           -> system     the text (Gemma's turn format: "[system] {text}", folded into the user
                        turn); a template without a system role gets it as a user message "[system] {text}"
    TOOL             -> tool       the result, with its tool_call_id
    tools            -> the template's `tools`; a CHARACTER message's tool calls -> its `tool_calls`

A template without tool support gets tools, calls and results as text (model/tool_prompt.py): the tools'
block is appended to the character block (or is the system message when there is no character), calls
follow the CHARACTER message's text, and a TOOL result is a user message `<tool_response>...`.

The reply is generated after the generation prompt and ends with the template's end-of-turn marker (or
EOS), which stays in the reply's ids. Turn N+1 carries the reply as a CHARACTER message; the template
writes it as its markup + the body + the end-of-turn marker, so its tokens begin with exactly turn N's
prompt + reply, provided the body tokenizes back to the generated ids. Text a model generates need not
be the tokenizer's canonical segmentation, so the engine remembers the ids of the replies it generated
(ReplyMemo) and the renderer uses them; messages may also carry their token ids directly. Message text is
tokenized without special-token parsing: a user cannot forge turn markers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from salon.engine.model.chat_renderer import ChatRenderer, RenderStopped, TemplateMessage
from salon.engine.model.tool_prompt import ToolCallSpec, ToolSpec, calls_text, tool_result_text, tools_block

__all__ = [
    "Character",
    "ChatMessage",
    "PromptRenderer",
    "RenderStopped",
    "RenderedPrompt",
    "ReplyMemo",
    "Role",
    "ToolCallSpec",
    "ToolSpec",
]


class Role(Enum):
    USER = "user"
    CHARACTER = "character"
    SYSTEM = "system"
    TOOL = "tool"


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    text: str = ""
    author: str = ""
    # The body already tokenized (instead of text).
    token_ids: tuple[int, ...] | None = None
    # CHARACTER: the tool calls made after the text; TOOL: the id of the call whose result this is.
    tool_calls: tuple[ToolCallSpec, ...] = ()
    tool_call_id: str = ""


@dataclass(frozen=True)
class Character:
    name: str
    definition: str


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: list[int]
    # Position of the first token of the last message (where a regeneration or edit diverges).
    last_message_start: int


class PromptRenderer:
    """The engine's dialogue through one model's ChatRenderer; cheap to make per request (the ChatRenderer,
    shared, caches renders per conversation prefix)."""

    def __init__(self, chat: ChatRenderer, known_reply_ids: Callable[[str], list[int] | None] | None = None) -> None:
        self.chat = chat
        self._tok = chat.tokenizer
        self._known_reply_ids = known_reply_ids

    # -- what the cost checks may assume (validation.py)

    @property
    def message_overhead_tokens(self) -> int:
        """Tokens every message costs besides its body, at the least."""
        return self.chat.markup_bounds.message_tokens

    @property
    def prompt_overhead_tokens(self) -> int:
        """Tokens of every prompt besides its messages (BOS, a preamble, the generation prompt), at the least."""
        return self.chat.markup_bounds.prompt_tokens

    @property
    def character_overhead_tokens(self) -> int:
        """Tokens the character block costs besides its text: a message of its own, or none when it is folded
        into the first user message."""
        return self.message_overhead_tokens if self.chat.supports_system_role else 0

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens that end a reply: the template's end-of-turn marker and the file's EOS ids."""
        return self.chat.stop_token_ids

    # -- rendering

    def _text_content(self, text: str, author: str = "") -> tuple[str, tuple[int, ...] | None]:
        return (f"{author}: {text}" if author else text), None

    def _ids_content(self, ids: Sequence[int], author: str = "") -> tuple[str, tuple[int, ...]]:
        prefix = f"{author}: " if author else ""
        prefix_ids = self._tok.encode(prefix, add_bos=False, parse_special=False) if prefix else []
        return prefix + self._tok.decode(list(ids)), tuple(prefix_ids) + tuple(ids)

    def _message(self, m: ChatMessage) -> TemplateMessage:
        if m.role is Role.TOOL:
            if self.chat.supports_tools:
                return TemplateMessage("tool", m.text, tool_call_id=m.tool_call_id)
            return TemplateMessage("user", tool_result_text(m.text))
        if m.role is Role.CHARACTER and m.tool_calls:
            text = m.text if m.token_ids is None else self._tok.decode(list(m.token_ids))
            if self.chat.supports_tools:
                return TemplateMessage("assistant", text, tool_calls=m.tool_calls)
            # The calls as text: the ids generated for exactly that text, when this engine generated it.
            whole = calls_text(text, m.tool_calls)
            known = self._known_reply_ids(whole) if self._known_reply_ids is not None else None
            return TemplateMessage("assistant", whole, tuple(known) if known is not None else None)
        if m.role is Role.CHARACTER:
            ids = m.token_ids
            if ids is None and self._known_reply_ids is not None:
                known = self._known_reply_ids(m.text)
                ids = tuple(known) if known is not None else None
                if ids is not None:
                    return TemplateMessage("assistant", m.text, ids)
            content, content_ids = self._ids_content(ids) if ids is not None else self._text_content(m.text)
            return TemplateMessage("assistant", content, content_ids)
        if m.role is Role.SYSTEM:
            native = self.chat.has_own_template and self.chat.supports_system_role
            prefix = "" if native else "[system] "
            content, content_ids = (
                self._ids_content(m.token_ids) if m.token_ids is not None else self._text_content(m.text)
            )
            if prefix:
                content = prefix + content
                if content_ids is not None:
                    content_ids = tuple(self._tok.encode(prefix, add_bos=False, parse_special=False)) + content_ids
            return TemplateMessage("system" if self.chat.supports_system_role else "user", content, content_ids)
        content, content_ids = (
            self._ids_content(m.token_ids, m.author)
            if m.token_ids is not None
            else self._text_content(m.text, m.author)
        )
        return TemplateMessage("user", content, content_ids)

    @staticmethod
    def character_text(character: Character | None) -> str:
        if character is None or not (character.name or character.definition):
            return ""
        return (f"You are {character.name}.\n" if character.name else "") + character.definition

    def template_messages(
        self, character: Character | None, messages: Sequence[ChatMessage], tools: tuple[ToolSpec, ...] = ()
    ) -> list[TemplateMessage]:
        """The dialogue as the template's messages (see the module docstring)."""
        out = [self._message(m) for m in messages]
        block = self.character_text(character)
        if tools and not self.chat.supports_tools:
            block = "\n\n".join(b for b in (block, tools_block(tools)) if b)
        if not block:
            return out
        if self.chat.supports_system_role:
            return [TemplateMessage("system", block)] + out
        if out and out[0].role == "user":
            first = out[0]
            ids = (
                None
                if first.content_ids is None
                else (tuple(self._tok.encode(block + "\n\n", add_bos=False, parse_special=False)) + first.content_ids)
            )
            return [TemplateMessage("user", block + "\n\n" + first.content, ids)] + out[1:]
        return [TemplateMessage("user", block)] + out

    def render(self, character: Character | None, messages: Sequence[ChatMessage]) -> list[int]:
        """The full prompt, ending with the template's generation prompt."""
        return self.render_prompt(character, messages).token_ids

    def render_prompt(
        self,
        character: Character | None,
        messages: Sequence[ChatMessage],
        stop: threading.Event | None = None,
        max_tokens: int | None = None,
        template_kwargs: dict | None = None,
        tools: tuple[ToolSpec, ...] = (),
    ) -> RenderedPrompt:
        """The full prompt and where its last message starts. RenderStopped when `stop` is set (checked
        between messages) or as soon as the prompt holds more than max_tokens tokens; ChatTemplateError
        (INVALID_ARGUMENT) with the template's message when it refuses the dialogue."""
        native_tools = tools if self.chat.supports_tools else ()
        rendered = self.chat.render(
            self.template_messages(character, messages, tools), True, stop, max_tokens, template_kwargs, native_tools
        )
        if max_tokens is not None and len(rendered.token_ids) > max_tokens:
            raise RenderStopped(False, len(rendered.token_ids))
        last = rendered.message_starts[-1] if rendered.message_starts else 0
        return RenderedPrompt(rendered.token_ids, last)


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
