"""A conversation rendered to tokens through the model's chat template, one message at a time.

The cross-turn KV cache needs every turn's prompt to extend the previous turn's prompt + reply token for
token. So the renderer never tokenizes a whole conversation at once: message k's *segment* is the text its
addition appends to the template's render of messages [0, k) (without generation prompt), tokenized on its
own, and the prompt is prefix + segment_0 + ... + segment_{n-1} + generation prompt. A template for which
adding a message does not merely append (`prefix_stable` false) is rendered whole instead -- still
correct, only without the cross-turn guarantee.

Inside a segment, special tokens are parsed in the template's markup only, never in a message's content, so a
user cannot forge turn markers; plain text runs across markup and content are encoded as one text, so a
segment's tokens are exactly those of tokenizing its text whole (Tokenizer.encode_pieces). To find the content in the
rendered text, the template is
also rendered with a placeholder for each content: the placeholder render's literal pieces must match the
real render exactly, and what lies between them is the content as the template wrote it (trimmed or not).
A message may carry its content already tokenized (`content_ids`, e.g. the ids the model generated for a
reply); they are used when the template writes the content unchanged.

A segment is found from renders of a short window of messages (the first, the one before and the message;
`_window`), so rendering a conversation costs time linear in its length; the joined segments are then checked
against one render of the whole conversation, and a template whose output depends on more than the window
(numbered messages, say) is rendered whole. Renders are cached per conversation prefix (a chained digest of
the messages), so a turn that appends two messages to a known conversation renders two windows.

Tools (tool_prompt.py) reach a template that renders them as transformers passes them: `tools`, assistant
`tool_calls` and `tool` messages; they are part of every render of the conversation (and of its cache key), so
appending a message still only appends. Their JSON is written by the template as markup, so it may hold no
special token's text. A template without tool support never sees them: prompt.py writes them as plain text.

Files without a template use GEMMA_TURN_TEMPLATE (chat_template.py). Stop tokens: the file's end-of-generation
ids plus the template's end-of-turn marker (the first token the template writes after an assistant message).

A render stops early (RenderStopped) when its `stop` event is set (checked between messages) or as soon as the
tokens so far pass `max_tokens`: a prompt that cannot fit costs at most one message past the context.
`markup_bounds` gives lower bounds of the tokens the template adds around messages, for refusing a dialogue
that cannot fit before rendering it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from salon.engine.model.chat_template import GEMMA_TURN_TEMPLATE, RESERVED_VARIABLES, ChatTemplateError, render_template
from salon.engine.model.tokenizer import Tokenizer
from salon.engine.model.tool_prompt import ToolCallSpec, ToolSpec, template_supports_tools
from salon.engine.model.vocab import TOKEN_CONTROL

ROLES = ("system", "user", "assistant", "tool")
_PLACEHOLDER = "\x00salon-content-{}\x00"
_PLACEHOLDER_RE = re.compile("\x00salon-content-(\\d+)\x00")


@dataclass(frozen=True)
class TemplateMessage:
    role: str  # "system", "user", "assistant" or "tool" (the roles chat templates know)
    content: str
    # The content already tokenized; used when the template writes the content unchanged.
    content_ids: tuple[int, ...] | None = None
    # An assistant message's tool calls; a tool message's call id (templates with tool support only).
    tool_calls: tuple[ToolCallSpec, ...] = ()
    tool_call_id: str = ""

    def as_template_message(self, content: str) -> dict:
        out: dict = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [c.as_template_call() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True)
class RenderedChat:
    token_ids: list[int]
    # Tokens before the first message (BOS, a template's preamble).
    prefix_ids: list[int]
    # Per message, the tokens it appends (empty lists when not prefix_stable).
    segments: list[list[int]]
    generation_prompt_ids: list[int]
    # Position of each message's first token in token_ids (empty when not prefix_stable).
    message_starts: list[int]
    prefix_stable: bool


class RenderStopped(Exception):
    """Rendering ended early: the client went away (`cancelled`) or the prompt passed max_tokens."""

    def __init__(self, cancelled: bool, num_tokens: int) -> None:
        super().__init__("cancelled" if cancelled else f"more than {num_tokens} tokens")
        self.cancelled = cancelled
        self.num_tokens = num_tokens


@dataclass(frozen=True)
class MarkupBounds:
    """Lower bounds of the template's tokens around message contents, counted as control tokens only: they are
    parsed in the markup and never merge with a content's text, so no content can make them fewer."""

    # Tokens of every prompt besides its messages (before the first one, and the generation prompt).
    prompt_tokens: int
    # Tokens every message adds besides its content, whatever its role and the role before it.
    message_tokens: int


@dataclass(frozen=True)
class _State:
    """The render of the first `num_messages` messages, without generation prompt, cut at message boundaries."""

    num_messages: int
    prefix_text: str
    segment_texts: tuple[str, ...]
    prefix_ids: tuple[int, ...]
    segments: tuple[tuple[int, ...], ...]

    @property
    def num_tokens(self) -> int:
        return len(self.prefix_ids) + sum(len(s) for s in self.segments)

    @property
    def text(self) -> str:
        return self.prefix_text + "".join(self.segment_texts)


def _window(k: int) -> list[int]:
    """The messages whose render gives message k's segment: the first one (templates treat it apart: a
    default system prompt, `loop.first`), the one before k and k itself, with k at an index of the same
    parity as its own (templates that check alternation test `loop.index0 % 2`)."""
    if k <= 2:
        return list(range(k + 1))
    return [0, k - 2, k - 1, k] if k % 2 == 1 else [0, k - 1, k]


class ChatRenderer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        eos_token_ids: Sequence[int] = (),
        cache_capacity: int = 1024,
    ) -> None:
        self.tokenizer = tokenizer
        self.has_own_template = chat_template is not None
        self.template = chat_template if chat_template is not None else GEMMA_TURN_TEMPLATE
        # Whether the template renders tools, tool calls and tool messages itself.
        self.supports_tools = template_supports_tools(self.template)
        vocab = tokenizer.vocab
        self._special_tokens = {
            "bos_token": vocab.tokens[vocab.bos_token_id],
            "eos_token": vocab.tokens[vocab.eos_token_id],
            "unk_token": vocab.tokens[vocab.unk_token_id],
            "pad_token": vocab.tokens[vocab.pad_token_id],
        }
        # Control tokens' texts: what a content could forge (user-defined pieces are split in any text anyway).
        self._special_texts = [p for p, t in zip(vocab.tokens, vocab.types) if t == TOKEN_CONTROL and p]
        self._control_ids = frozenset(i for i, t in enumerate(vocab.types) if t == TOKEN_CONTROL)
        self._eos_token_ids = tuple(eos_token_ids)
        self._cache: OrderedDict[bytes, _State] = OrderedDict()
        self._cache_capacity = cache_capacity
        self._lock = threading.Lock()
        self._end_of_turn: tuple[int, ...] | None = None
        self._system_role: bool | None = None
        self._markup_bounds: MarkupBounds | None = None

    # -- what the template does

    def render_text(self, messages: Sequence[TemplateMessage], add_generation_prompt: bool = True) -> str:
        """The template's text for the conversation (what transformers' apply_chat_template(tokenize=False) gives)."""
        return self._render(messages, add_generation_prompt)

    @property
    def markup_bounds(self) -> MarkupBounds:
        """Special tokens the template writes around messages, at the least (probed once per role and the role
        before it; sequences the template refuses are skipped)."""
        if self._markup_bounds is None:
            special = lambda ids: sum(1 for t in ids if t in self._control_ids)  # noqa: E731
            per_message, per_prompt = [], []
            for role in ROLES:
                for before in (None, *ROLES):
                    msgs = ([TemplateMessage(before, "x")] if before else []) + [TemplateMessage(role, "y")]
                    try:
                        out = self.render(msgs, add_generation_prompt=True)
                    except ChatTemplateError:
                        continue
                    if not out.prefix_stable:
                        continue
                    per_message.append(special(out.segments[-1]))
                    if before is None:
                        per_prompt.append(special(out.prefix_ids) + special(out.generation_prompt_ids))
            self._markup_bounds = MarkupBounds(min(per_prompt, default=0), min(per_message, default=0))
        return self._markup_bounds

    @property
    def supports_system_role(self) -> bool:
        """Whether a system message at the start reaches the model (the template accepts and writes it)."""
        if self._system_role is None:
            probe = [TemplateMessage("system", "\x01probe-system\x01"), TemplateMessage("user", "hi")]
            try:
                self._system_role = "\x01probe-system\x01" in self._render(probe, True)
            except ChatTemplateError:
                self._system_role = False
        return self._system_role

    @property
    def end_of_turn_ids(self) -> tuple[int, ...]:
        """The template's end-of-turn marker: the first token it writes after an assistant message, when that
        is a special token (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`, EOS, ...); () when there is none."""
        if self._end_of_turn is None:
            self._end_of_turn = ()
            for probe in (
                [
                    TemplateMessage("user", "a"),
                    TemplateMessage("assistant", "\x01reply\x01"),
                    TemplateMessage("user", "b"),
                ],
                [TemplateMessage("user", "a"), TemplateMessage("assistant", "\x01reply\x01")],
            ):
                try:
                    text = self._render(probe, False)
                except ChatTemplateError:
                    continue
                after = text.split("\x01reply\x01", 1)[-1] if "\x01reply\x01" in text else ""
                ids = self.tokenizer.encode(after, add_bos=False, parse_special=True)
                if ids and (self.tokenizer.is_special(ids[0]) or ids[0] in self._eos_token_ids):
                    self._end_of_turn = (ids[0],)
                    break
        return self._end_of_turn

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens that end a reply: the file's end-of-generation ids and the template's end-of-turn marker."""
        return tuple(sorted(set(self._eos_token_ids) | set(self.end_of_turn_ids)))

    # -- rendering to tokens

    def render(
        self,
        messages: Sequence[TemplateMessage],
        add_generation_prompt: bool = True,
        stop: threading.Event | None = None,
        max_tokens: int | None = None,
        template_kwargs: dict | None = None,
        tools: tuple[ToolSpec, ...] = (),
    ) -> RenderedChat:
        """The conversation's tokens. RenderStopped when `stop` is set (checked between messages) or once the
        tokens pass max_tokens. With template_kwargs (extra template variables) the conversation is rendered
        whole, uncached: its segments are not those of the same messages without them. `tools`, tool calls and
        tool messages need a template that supports tools (`supports_tools`)."""
        for i, m in enumerate(messages):
            if m.role not in ROLES:
                raise ChatTemplateError(f"messages[{i}].role: {m.role!r} is not one of {', '.join(ROLES)}")
        tool_dicts = self._tool_dicts(messages, tools)
        if template_kwargs:
            whole = self._render_whole(messages, add_generation_prompt, template_kwargs, tool_dicts)
            if max_tokens is not None and len(whole.token_ids) > max_tokens:
                raise RenderStopped(False, len(whole.token_ids))
            return whole
        state = self._state_for(list(messages), stop, max_tokens, tool_dicts)
        if state is None:
            whole = self._render_whole(messages, add_generation_prompt, None, tool_dicts)
            if max_tokens is not None and len(whole.token_ids) > max_tokens:
                raise RenderStopped(False, len(whole.token_ids))
            return whole
        ids = list(state.prefix_ids)
        starts = []
        for seg in state.segments:
            starts.append(len(ids))
            ids.extend(seg)
        # The segments come from renders of short windows (_window): they hold only if, joined, they are
        # exactly the template's render of the whole conversation.
        full = self._render(messages, add_generation_prompt, None, tool_dicts)
        text = state.text
        if not full.startswith(text) or (not add_generation_prompt and full != text):
            return self._render_whole(messages, add_generation_prompt, None, tool_dicts)
        gen = self._encode_markup(full[len(text) :]) if add_generation_prompt else []
        return RenderedChat(ids + gen, list(state.prefix_ids), [list(s) for s in state.segments], gen, starts, True)

    def _tool_dicts(self, messages: Sequence[TemplateMessage], tools: tuple[ToolSpec, ...]) -> list[dict] | None:
        """The tools as the template gets them (None without tools); ChatTemplateError when the template does not
        render tools, or when their JSON (markup to the tokenizer) holds a special token's text."""
        calls = [c for m in messages for c in m.tool_calls]
        uses_tools = tools or calls or any(m.role == "tool" for m in messages)
        if uses_tools and not self.supports_tools:
            raise ChatTemplateError("the chat template does not render tools, tool calls or tool messages")
        if not tools and not calls:
            return None
        tool_dicts = [t.as_template_tool() for t in tools]
        markup = json.dumps([tool_dicts, [(c.id, c.name, c.arguments_json) for c in calls]], ensure_ascii=False)
        for s in self._special_texts:
            if s in markup:
                raise ChatTemplateError(
                    f"tools: hold the special token text {s!r}, which the chat template writes as markup"
                )
        return tool_dicts or None

    def _state_for(
        self,
        messages: list[TemplateMessage],
        stop: threading.Event | None = None,
        max_tokens: int | None = None,
        tools: list[dict] | None = None,
    ) -> _State | None:
        """The segments of all messages, extended from the longest cached prefix; None if not prefix-stable."""
        # The tools are part of every render: they key the whole conversation.
        digests = [b"" if tools is None else hashlib.blake2b(json.dumps(tools).encode(), digest_size=16).digest()]
        for m in messages:
            h = hashlib.blake2b(digests[-1], digest_size=16)
            key = (m.role, m.content, m.content_ids, m.tool_calls, m.tool_call_id)
            h.update(repr(key).encode("utf-8", "surrogatepass"))
            digests.append(h.digest())
        with self._lock:
            k = len(messages)
            while k > 0 and digests[k] not in self._cache:
                k -= 1
            state = self._cache.get(digests[k]) if k > 0 else None
            if state is not None:
                self._cache.move_to_end(digests[k])
        if state is None:
            state = self._initial_state(tools)
        num_tokens = state.num_tokens
        segment_tokens = num_tokens - len(state.prefix_ids)
        while state.num_messages < len(messages):
            if stop is not None and stop.is_set():
                raise RenderStopped(True, num_tokens)
            if max_tokens is not None and num_tokens > max_tokens:
                raise RenderStopped(False, num_tokens)
            state = self._extend(state, messages, tools)
            if state is None:
                return None
            segment_tokens += len(state.segments[-1])
            num_tokens = len(state.prefix_ids) + segment_tokens  # the first message may add BOS to the prefix
            if state.num_messages >= len(messages) - 1:  # keep the last two (regenerate / edit the last one)
                self._remember(digests[state.num_messages], state)
        return state

    def _remember(self, digest: bytes, state: _State) -> None:
        with self._lock:
            self._cache[digest] = state
            self._cache.move_to_end(digest)
            while len(self._cache) > self._cache_capacity:
                self._cache.popitem(last=False)

    def _initial_state(self, tools: list[dict] | None = None) -> _State:
        try:
            text = self._render([], False, None, tools)
        except ChatTemplateError:  # templates may index messages[0]
            text = ""
        return _State(0, text, (), tuple(self._encode_markup(text)), ())

    def _extend(self, state: _State, messages: list[TemplateMessage], tools: list[dict] | None = None) -> _State | None:
        """Message k's segment: what adding it appends to the render of its window (a constant number of
        messages, so a conversation costs linear time); None when adding it does not merely append."""
        k = state.num_messages
        window = [messages[i] for i in _window(k)]
        render = lambda msgs: self._render(msgs, False, None, tools)  # noqa: E731
        real_before, real = render(window[:-1]) if k else state.prefix_text, render(window)
        marks = self._placeholders(window)
        placeholder_before = render(marks[:-1]) if k else state.prefix_text
        placeholder = render(marks)
        if not (real.startswith(real_before) and placeholder.startswith(placeholder_before)):
            return None
        delta = real[len(real_before) :]
        seg = self._encode_delta(placeholder[len(placeholder_before) :], delta, window)
        prefix = state.prefix_ids
        if k == 0:
            bos = self.tokenizer.bos_token_id
            first = (list(prefix) + seg)[:1]
            if self.tokenizer.add_bos and first != [bos]:
                prefix = (bos,) + prefix  # the model wants BOS and the template did not write it
        return _State(k + 1, state.prefix_text, state.segment_texts + (delta,), prefix, state.segments + (tuple(seg),))

    def _render_whole(
        self,
        messages: Sequence[TemplateMessage],
        add_generation_prompt: bool,
        extra: dict | None = None,
        tools: list[dict] | None = None,
    ) -> RenderedChat:
        real = self._render(messages, add_generation_prompt, extra, tools)
        placeholder = self._render(self._placeholders(messages), add_generation_prompt, extra, tools)
        ids = self._encode_delta(placeholder, real, list(messages))
        if self.tokenizer.add_bos and ids[:1] != [self.tokenizer.bos_token_id]:
            ids = [self.tokenizer.bos_token_id] + ids
        return RenderedChat(ids, [], [], [], [], False)

    # -- text -> tokens

    def _render(
        self,
        messages: Sequence[TemplateMessage],
        add_generation_prompt: bool,
        extra: dict | None = None,
        tools: list[dict] | None = None,
    ) -> str:
        return render_template(
            self.template,
            [m.as_template_message(m.content) for m in messages],
            add_generation_prompt,
            self._special_tokens,
            extra,
            tools,
        )

    @property
    def reserved_variables(self) -> frozenset[str]:
        """Template variables every render sets (a request's extra variables may not name them)."""
        return RESERVED_VARIABLES | frozenset(self._special_tokens)

    @staticmethod
    def _placeholders(messages: Sequence[TemplateMessage]) -> list[TemplateMessage]:
        # An empty content stays empty (templates test it: `{% if message.content %}`).
        return [
            dataclasses.replace(m, content=_PLACEHOLDER.format(i) if m.content else "", content_ids=None)
            for i, m in enumerate(messages)
        ]

    def _encode_markup(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_bos=False, parse_special=True) if text else []

    def _encode_delta(self, placeholder_delta: str, real_delta: str, messages: list[TemplateMessage]) -> list[int]:
        """Tokens of real_delta: the markup (the placeholder render's literal text) with special parsing, each
        message content as the template wrote it without."""
        pieces = _PLACEHOLDER_RE.split(placeholder_delta)  # literal, index, literal, index, ..., literal
        literals, indices = pieces[0::2], [int(i) for i in pieces[1::2]]
        pattern = "".join(re.escape(lit) + ("(.*?)" if j < len(indices) else "") for j, lit in enumerate(literals))
        match = re.fullmatch(pattern, real_delta, flags=re.DOTALL)
        contents = list(match.groups()) if match else None
        if contents is not None and any(
            c not in _rendered_forms(messages[i].content) for c, i in zip(contents, indices)
        ):
            contents = None
        if contents is None:
            # The template transforms contents in a way the placeholders cannot follow: tokenize the whole text,
            # which is safe only if no message content holds a special token's text.
            for i, m in enumerate(messages):
                if any(s in m.content for s in self._special_texts):
                    raise ChatTemplateError(
                        f"messages[{i}].content: holds a special token's text, and the chat template rewrites the "
                        "content in a way that does not let it be tokenized apart from the template's markup"
                    )
            return self._encode_markup(real_delta)
        pieces: list = []
        for j, lit in enumerate(literals):
            pieces.append((lit, True))
            if j < len(indices):
                m = messages[indices[j]]
                use_ids = m.content_ids is not None and contents[j] == m.content
                pieces.append(m.content_ids if use_ids else (contents[j], False))
        return self.tokenizer.encode_pieces(pieces)


def _rendered_forms(content: str) -> tuple[str, ...]:
    """How templates write a content: as is, or trimmed (Jinja's `trim`, Python's strip)."""
    return (content, content.strip(), content.lstrip(), content.rstrip())
