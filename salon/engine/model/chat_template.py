"""A model's chat template (`tokenizer.chat_template`, Jinja) rendered the way Hugging Face transformers'
`apply_chat_template` renders it.

The environment is transformers': an ImmutableSandboxedEnvironment (templates cannot mutate their inputs or
reach Python internals) with trim_blocks and lstrip_blocks, the loopcontrols extension, a no-op
`{% generation %}` block, the `tojson` filter as transformers defines it (no ASCII escaping), and the globals
`raise_exception(message)` and `strftime_now(format)`. A render gets `messages` (dicts with `role` and
`content`, and `tool_calls` / `tool_call_id` where set), `add_generation_prompt`, `tools` (None without
tools) and `documents` (None) and the special tokens as strings
(`bos_token`, `eos_token`, `unk_token`, `pad_token`).

Any error a template raises -- its own `raise_exception(...)` or a failure of the template code -- becomes a
ChatTemplateError (INVALID_ARGUMENT for the caller) carrying the template's message.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from salon.common.errors import InvalidArgument


class ChatTemplateError(InvalidArgument):
    """The chat template refused the conversation or failed on it; the message is the template's."""


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text for training masks): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not compile: {e.message} (line {e.lineno})") from None


# Variables every render sets: extra variables (a request's chat_template_kwargs) may not replace them.
RESERVED_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "documents"})


def render_template(
    source: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    special_tokens: dict[str, str],
    extra: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The template's text for `messages`, with `tools` (transformers' format) and `extra` variables besides
    (none may be reserved: the special tokens' names and RESERVED_VARIABLES); ChatTemplateError with the
    template's message if it raises."""
    template = compile_template(source)
    try:
        return template.render(
            **(extra or {}),
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=None,
            **special_tokens,
        )
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template: {e.message}") from None
    except Exception as e:  # the template's own code failed (a type error, an index out of range, ...)
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None


# The turn format of Gemma (its official template's markers) for files without a template of their own,
# such as the pretrained Gemma 3 GGUF. Consecutive user-side messages (system, user) share one user turn,
# separated by a blank line, as Gemma's template folds a system message into the first user turn; there
# are never two user turns in a row. Each model-side message is a turn of its own, as the generation
# prompt opens one after any message: a reply generated after a model message and appended to the
# dialogue renders exactly as it was generated. A turn is closed only when the next turn opens (or the
# generation prompt is added), so appending a message only appends text:
#     <bos><start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n<start_of_turn>model\n{reply}<end_of_turn>\n...
GEMMA_TURN_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(open=none) -%}"
    "{%- for message in messages -%}"
    "{%- set side = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{%- if ns.open == side and side == 'user' -%}{{ '\n\n' }}"
    "{%- else -%}"
    "{%- if ns.open is not none -%}{{ '<end_of_turn>\n' }}{%- endif -%}"
    "{{ '<start_of_turn>' + side + '\n' }}"
    "{%- set ns.open = side -%}"
    "{%- endif -%}"
    "{{ message['content'] }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if ns.open is not none -%}{{ '<end_of_turn>\n' }}{%- endif -%}"
    "{{ '<start_of_turn>model\n' }}"
    "{%- endif -%}"
)
