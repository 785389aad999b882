"""Checking an EngineService GenerateRequest field by field and converting it to domain objects.

Every error names the offending field. Protobuf stays at this edge: the rest of the engine sees
SamplingParams, ChatMessage and Character dataclasses.

Cost is bounded before work, in this order:
  1. counts (salon/common/prompt_bounds.py): a prompt whose number of messages or ids alone
     cannot fit is OUT_OF_RANGE before any field is read one by one;
  2. the fields, each id list checked with one vectorized comparison;
  3. a tighter lower bound of the rendered prompt: every message costs the control tokens its chat
     template writes around it at the least (model/chat_renderer.py's MarkupBounds) plus at least one
     body token (and at least bytes / max_token_bytes of them), so a dialogue that cannot fit is
     refused before it is tokenized;
  4. rendering (servicer.py), which stops at the first token past the context and when the client
     goes away.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from salon.api.chat.v1 import chat_pb2
from salon.common import tool_specs
from salon.common.errors import InvalidArgument, OutOfRange
from salon.common.prompt_bounds import prompt_count_problem
from salon.common.request_bounds import (
    MAX_CACHE_SALT_BYTES,
    MAX_CHAT_TEMPLATE_KWARGS_BYTES,
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_VALUE,
    MAX_PRIORITY,
)
from salon.common.tool_call_schema import reply_schema
from salon.engine.api.prompt import Character, ChatMessage, Role, ToolCallSpec, ToolSpec
from salon.engine.grammar.constraint import Constraint, ConstraintKind, checked
from salon.engine.model.sampling_defaults import MAX_REPETITION_PENALTY, MAX_TEMPERATURE
from salon.engine.request import SamplingParams

MAX_ID_BYTES = 256
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_TOP_LOGPROBS = 20
# vLLM's ranges: repetition_penalty > 0 (1 = none, at most MAX_REPETITION_PENALTY); frequency / presence in
# [-2, 2]; min_p in [0, 1].
MAX_FREQUENCY_PRESENCE_PENALTY = 2.0
_FORCED = (chat_pb2.TOOL_CHOICE_MODE_REQUIRED, chat_pb2.TOOL_CHOICE_MODE_FUNCTION)

_ROLES = {
    chat_pb2.ROLE_USER: Role.USER,
    chat_pb2.ROLE_CHARACTER: Role.CHARACTER,
    chat_pb2.ROLE_SYSTEM: Role.SYSTEM,
    chat_pb2.ROLE_TOOL: Role.TOOL,
}


@dataclass(frozen=True)
class Limits:
    vocab_size: int
    max_context_tokens: int
    default_max_new_tokens: int
    max_new_tokens_limit: int
    # Bytes of the longest vocabulary piece: text longer than max_context_tokens pieces of it can
    # never fit, so it is refused before it is tokenized (tokenizing megabytes costs seconds).
    max_token_bytes: int = 64
    # Tokens every rendered message costs around its body, at the least (the template's control tokens).
    message_overhead_tokens: int = 0
    # Tokens of every rendered prompt besides its messages (BOS, the generation prompt), at the least.
    prompt_overhead_tokens: int = 0
    # Tokens the character block costs besides its text (0 where it is folded into the first user turn).
    character_overhead_tokens: int = 0


@dataclass(frozen=True)
class ParsedContext:
    """A structured dialogue to render, plain text to tokenize, or a ready prompt."""

    character: Character | None
    messages: list[ChatMessage] | None
    prompt_token_ids: list[int] | None
    text: str | None = None
    # The tools to render with the dialogue (none when tool_choice is NONE).
    tools: tuple[ToolSpec, ...] = ()


def check_ids(field: str, ids, vocab_size: int, max_count: int | None = None) -> list[int]:
    """The ids as a list, after one vectorized check; InvalidArgument naming the first bad one,
    OutOfRange when there are more than max_count (checked before anything is converted)."""
    if max_count is not None and len(ids) > max_count:
        raise OutOfRange(f"{field}: {len(ids)} ids cannot fit in the context of {max_count} tokens")
    if not len(ids):
        return []
    arr = np.array(ids, dtype=np.int64)
    bad = np.flatnonzero(arr >= vocab_size)
    if bad.size:
        i = int(bad[0])
        raise InvalidArgument(f"{field}[{i}]: token id {int(arr[i])} is not below the vocabulary size {vocab_size}")
    return arr.tolist()


def check_prompt_counts(request, limits: Limits) -> None:
    """OutOfRange when the counts alone leave no room (step 1 above: before any per-field work)."""
    problem = prompt_count_problem(request, limits.max_context_tokens)
    if problem is not None:
        raise OutOfRange(problem)


def check_id_string(field: str, value: str, required: bool) -> None:
    if required and not value:
        raise InvalidArgument(f"{field} is required")
    if len(value.encode()) > MAX_ID_BYTES:
        raise InvalidArgument(f"{field} is longer than {MAX_ID_BYTES} bytes")


def parse_context(request, limits: Limits) -> ParsedContext:
    """The request's context as domain objects (call check_prompt_counts first)."""
    which = request.WhichOneof("context")
    if which is None:
        raise InvalidArgument("context: one of dialogue, tokens or text is required")
    tools = parse_tools(request)
    context = limits.max_context_tokens
    if which == "tokens":
        ids = check_ids("tokens.token_ids", request.tokens.token_ids, limits.vocab_size, context)
        if not ids:
            raise InvalidArgument("tokens.token_ids: at least one token id is required")
        return ParsedContext(None, None, ids)
    if which == "text":
        check_text_size("text", request.text, limits)
        return ParsedContext(None, None, None, text=request.text)
    parsed = parse_dialogue(request.dialogue, limits, request.character)
    character = (
        Character(request.character.name, request.character.definition) if request.HasField("character") else None
    )
    return ParsedContext(character, parsed, None, tools=tools)


def check_text_size(field: str, text: str, limits: Limits) -> None:
    """Refuse text that cannot fit in the context before tokenizing it (bounded cost)."""
    if not text:
        raise InvalidArgument(f"{field}: at least one character is required")
    num_bytes = len(text.encode())
    if num_bytes > limits.max_context_tokens * limits.max_token_bytes:
        raise OutOfRange(
            f"{field}: {num_bytes} bytes of text cannot fit in the {limits.max_context_tokens}-token context"
        )


def parse_dialogue(dialogue, limits: Limits, character) -> list[ChatMessage]:
    """The dialogue's messages as ChatMessages (each checked, the whole bounded in size)."""
    messages = dialogue.messages
    if not messages:
        raise InvalidArgument("dialogue.messages: at least one message is required")
    context = limits.max_context_tokens
    piece = max(1, limits.max_token_bytes)
    min_tokens = limits.prompt_overhead_tokens
    text_bytes = len(character.name.encode()) + len(character.definition.encode())
    if text_bytes:
        min_tokens += limits.character_overhead_tokens + -(-text_bytes // piece)
    parsed = []
    for i, m in enumerate(messages):
        field = f"dialogue.messages[{i}]"
        role = _ROLES.get(m.role)
        if role is None:
            raise InvalidArgument(f"{field}.role: {m.role} is not a known role (USER, CHARACTER, SYSTEM or TOOL)")
        text, author = m.text, m.author
        calls, calls_bytes = _tool_calls(field, m, role)
        if text and m.token_ids:
            raise InvalidArgument(f"{field}: exactly one of text and token_ids must be set")
        if not (text or m.token_ids or calls):
            raise InvalidArgument(f"{field}: one of text and token_ids must be set (or tool_calls)")
        if role is Role.TOOL:
            check_id_string(f"{field}.tool_call_id", m.tool_call_id, required=True)
        elif m.tool_call_id:
            raise InvalidArgument(f"{field}.tool_call_id: only a TOOL message has one")
        ids = tuple(check_ids(f"{field}.token_ids", m.token_ids, limits.vocab_size, context)) if m.token_ids else None
        body_tokens = len(ids) if ids else -(-(len(text.encode()) + len(author.encode())) // piece)
        min_tokens += limits.message_overhead_tokens + max(1, body_tokens + -(-calls_bytes // piece))
        parsed.append(
            ChatMessage(
                role=role, text=text, author=author, token_ids=ids, tool_calls=calls, tool_call_id=m.tool_call_id
            )
        )
    if min_tokens >= context:
        raise OutOfRange(
            f"prompt: the dialogue renders to at least {min_tokens} tokens, which leave no room to "
            f"generate in the context of {context} tokens"
        )
    return parsed


def _tool_calls(field: str, m, role: Role) -> tuple[tuple[ToolCallSpec, ...], int]:
    """A message's tool calls (CHARACTER messages only), each checked, and their bytes."""
    if not m.tool_calls:
        return (), 0
    if role is not Role.CHARACTER:
        raise InvalidArgument(f"{field}.tool_calls: only a CHARACTER message makes tool calls")
    if len(m.tool_calls) > tool_specs.MAX_TOOL_CALLS:
        raise InvalidArgument(f"{field}.tool_calls: more than {tool_specs.MAX_TOOL_CALLS} calls")
    calls, num_bytes = [], 0
    for j, c in enumerate(m.tool_calls):
        where = f"{field}.tool_calls[{j}]"
        check_id_string(f"{where}.id", c.id, required=True)
        problem = tool_specs.name_problem(c.name)
        if problem:
            raise InvalidArgument(f"{where}.name: {problem}")
        _, problem = tool_specs.json_object(c.arguments_json or "{}", tool_specs.MAX_TOOL_ARGUMENTS_BYTES)
        if problem:
            raise InvalidArgument(f"{where}.arguments_json: {problem}")
        num_bytes += len(c.arguments_json.encode()) + len(c.name)
        calls.append(ToolCallSpec(c.id, c.name, c.arguments_json or "{}"))
    return tuple(calls), num_bytes


def parse_tools(request) -> tuple[ToolSpec, ...]:
    """The tools to render (none when tool_choice is NONE), each checked, all within MAX_TOOLS_BYTES."""
    choice = request.tool_choice
    if choice.mode not in chat_pb2.ToolChoiceMode.values():
        raise InvalidArgument(f"tool_choice.mode: {choice.mode} is not a known mode")
    if choice.function_name and choice.mode != chat_pb2.TOOL_CHOICE_MODE_FUNCTION:
        raise InvalidArgument("tool_choice.function_name: only with TOOL_CHOICE_MODE_FUNCTION")
    if not request.tools:
        if choice.mode in _FORCED:
            raise InvalidArgument(f"tool_choice: {chat_pb2.ToolChoiceMode.Name(choice.mode)} needs tools")
        return ()
    if request.WhichOneof("context") != "dialogue":
        raise InvalidArgument("tools: only with a dialogue")
    if len(request.tools) > tool_specs.MAX_TOOLS:
        raise InvalidArgument(f"tools: more than {tool_specs.MAX_TOOLS} tools")
    total = sum(len(t.name) + len(t.description.encode()) + len(t.parameters_json.encode()) for t in request.tools)
    if total > tool_specs.MAX_TOOLS_BYTES:
        raise InvalidArgument(f"tools: more than {tool_specs.MAX_TOOLS_BYTES} bytes")
    tools, names = [], set()
    for i, t in enumerate(request.tools):
        problem = tool_specs.name_problem(t.name)
        if problem:
            raise InvalidArgument(f"tools[{i}].name: {problem}")
        if t.name in names:
            raise InvalidArgument(f"tools[{i}].name: {t.name!r} is defined twice")
        names.add(t.name)
        if len(t.description.encode()) > tool_specs.MAX_TOOL_DESCRIPTION_BYTES:
            raise InvalidArgument(f"tools[{i}].description: more than {tool_specs.MAX_TOOL_DESCRIPTION_BYTES} bytes")
        parameters = None
        if t.parameters_json:
            parameters, problem = tool_specs.json_object(t.parameters_json, tool_specs.MAX_TOOL_PARAMETERS_BYTES)
            if problem:
                raise InvalidArgument(f"tools[{i}].parameters_json: {problem}")
        tools.append(ToolSpec(t.name, t.description, parameters))
    if choice.mode == chat_pb2.TOOL_CHOICE_MODE_FUNCTION and choice.function_name not in names:
        raise InvalidArgument(f"tool_choice.function_name: {choice.function_name!r} is not one of the request's tools")
    if choice.mode == chat_pb2.TOOL_CHOICE_MODE_NONE:
        return ()
    return tuple(tools)


def forced_call_constraint(request, tools: tuple[ToolSpec, ...], sampling: SamplingParams) -> Constraint | None:
    """The constraint of a forced tool_choice (REQUIRED, FUNCTION) sent to the engine directly: the JSON schema of
    the reply's calls (salon/common/tool_call_schema.py), as the gateway sets it; None for any other choice.
    Call parse_tools first."""
    choice = request.tool_choice
    if choice.mode not in _FORCED:
        return None
    if sampling.constraint is not None:
        name = chat_pb2.ToolChoiceMode.Name(choice.mode)
        raise InvalidArgument(f"tool_choice: {name} cannot be combined with sampling.constraint")
    parallel = not request.HasField("parallel_tool_calls") or request.parallel_tool_calls
    forced = choice.function_name if choice.mode == chat_pb2.TOOL_CHOICE_MODE_FUNCTION else None
    functions = [{"name": t.name, "parameters": t.parameters} for t in tools]
    schema = reply_schema(functions, forced, required=forced is None, parallel_tool_calls=parallel)
    text = json.dumps(schema, separators=(",", ":"))
    return checked(Constraint(ConstraintKind.JSON_SCHEMA, text, strict=True), field="tool_choice")


def parse_sampling(sampling, limits: Limits) -> SamplingParams:
    t = sampling.temperature
    if not math.isfinite(t) or t < 0 or t > MAX_TEMPERATURE:
        raise InvalidArgument(f"sampling.temperature: {t} is not a finite number in [0, {MAX_TEMPERATURE:g}]")
    p = sampling.top_p
    if not math.isfinite(p) or p < 0 or p > 1:
        raise InvalidArgument(f"sampling.top_p: {p} is not in [0, 1]")
    if sampling.max_new_tokens > limits.max_new_tokens_limit:
        raise InvalidArgument(
            f"sampling.max_new_tokens: {sampling.max_new_tokens} exceeds the limit {limits.max_new_tokens_limit}"
        )
    if len(sampling.stop_strings) > MAX_STOP_STRINGS:
        raise InvalidArgument(f"sampling.stop_strings: more than {MAX_STOP_STRINGS} stop strings")
    for i, s in enumerate(sampling.stop_strings):
        if not s or len(s) > MAX_STOP_STRING_CHARS:
            raise InvalidArgument(f"sampling.stop_strings[{i}]: must be 1..{MAX_STOP_STRING_CHARS} characters")
    if len(sampling.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidArgument(f"sampling.stop_token_ids: more than {MAX_STOP_TOKEN_IDS} ids")
    stop_ids = check_ids("sampling.stop_token_ids", sampling.stop_token_ids, limits.vocab_size)
    repetition = float(sampling.repetition_penalty) or 1.0  # 0 (unset) = none, as for top_p
    frequency = float(sampling.frequency_penalty)
    presence = float(sampling.presence_penalty)
    min_p = float(sampling.min_p)
    check_penalties(repetition, frequency, presence, min_p)
    if sampling.top_logprobs > MAX_TOP_LOGPROBS:
        raise InvalidArgument(f"sampling.top_logprobs: {sampling.top_logprobs} is more than {MAX_TOP_LOGPROBS}")
    if sampling.min_tokens > limits.max_new_tokens_limit:
        raise InvalidArgument(
            f"sampling.min_tokens: {sampling.min_tokens} exceeds the limit {limits.max_new_tokens_limit}"
        )
    return SamplingParams(
        max_new_tokens=sampling.max_new_tokens,  # 0 = default, resolved against the prompt length
        temperature=float(t),
        top_k=int(sampling.top_k),
        top_p=1.0 if p == 0 else float(p),
        seed=sampling.seed if sampling.HasField("seed") else None,
        stop_strings=tuple(sampling.stop_strings),
        stop_token_ids=tuple(stop_ids),
        return_logprobs=sampling.return_logprobs,
        num_top_logprobs=int(sampling.top_logprobs),
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
        min_p=min_p,
        logit_bias=parse_logit_bias(sampling.logit_bias, limits.vocab_size),
        min_tokens=int(sampling.min_tokens),
        ignore_eos=sampling.ignore_eos,
        skip_special_tokens=sampling.skip_special_tokens if sampling.HasField("skip_special_tokens") else True,
        spaces_between_special_tokens=(
            sampling.spaces_between_special_tokens if sampling.HasField("spaces_between_special_tokens") else True
        ),
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        constraint=parse_constraint(sampling),
    )


def parse_logit_bias(logit_bias, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """The map as (id, bias) pairs, ids ascending: at most MAX_LOGIT_BIAS entries (counted before any is read),
    each id below the vocabulary size, each bias finite within [-100, 100] (OpenAI's bounds)."""
    if len(logit_bias) > MAX_LOGIT_BIAS:
        raise InvalidArgument(f"sampling.logit_bias: {len(logit_bias)} entries, more than {MAX_LOGIT_BIAS}")
    pairs = sorted(logit_bias.items())
    for token_id, bias in pairs:
        if token_id >= vocab_size:
            raise InvalidArgument(
                f"sampling.logit_bias: token id {token_id} is not below the vocabulary size {vocab_size}"
            )
        if not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS_VALUE:
            raise InvalidArgument(
                f"sampling.logit_bias[{token_id}]: {bias} is not in "
                f"[-{MAX_LOGIT_BIAS_VALUE:g}, {MAX_LOGIT_BIAS_VALUE:g}]"
            )
    return tuple((int(t), float(b)) for t, b in pairs)


def parse_constraint(sampling) -> Constraint | None:
    """sampling.constraint as a checked Constraint (sizes only; compiling it is the grammar compiler's)."""
    if not sampling.HasField("constraint"):
        return None
    c = sampling.constraint
    kind = c.WhichOneof("kind")
    if kind is None:
        raise InvalidArgument(
            "sampling.constraint: one of json_object, json_schema, regex, grammar, choice is required"
        )
    if kind == "json_object":
        if not c.json_object:
            raise InvalidArgument("sampling.constraint.json_object: must be true when set")
        constraint = Constraint(ConstraintKind.JSON_OBJECT)
    elif kind == "json_schema":
        constraint = Constraint(ConstraintKind.JSON_SCHEMA, c.json_schema.schema, strict=c.json_schema.strict)
    elif kind == "regex":
        constraint = Constraint(ConstraintKind.REGEX, c.regex)
    elif kind == "grammar":
        constraint = Constraint(ConstraintKind.GRAMMAR, c.grammar)
    else:
        constraint = Constraint(ConstraintKind.CHOICE, choices=tuple(c.choice.choices))
    return checked(constraint)


def check_penalties(repetition_penalty: float, frequency_penalty: float, presence_penalty: float, min_p: float) -> None:
    """Raises InvalidArgument naming the first penalty outside its range (vLLM's ranges)."""
    r = repetition_penalty
    if not math.isfinite(r) or r <= 0 or r > MAX_REPETITION_PENALTY:
        raise InvalidArgument(
            f"sampling.repetition_penalty: {r} is not in (0, {MAX_REPETITION_PENALTY:g}] (1 = no penalty)"
        )
    for name, v in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
        if not math.isfinite(v) or abs(v) > MAX_FREQUENCY_PRESENCE_PENALTY:
            raise InvalidArgument(
                f"sampling.{name}: {v} is not in [-{MAX_FREQUENCY_PRESENCE_PENALTY:g}, "
                f"{MAX_FREQUENCY_PRESENCE_PENALTY:g}]"
            )
    if not math.isfinite(min_p) or min_p < 0 or min_p > 1:
        raise InvalidArgument(f"sampling.min_p: {min_p} is not in [0, 1]")


def resolve_max_new_tokens(requested: int, num_prompt_tokens: int, num_resumed: int, limits: Limits) -> int:
    """The reply budget: the request's (or the default), checked against the room left in the context."""
    room = limits.max_context_tokens - num_prompt_tokens
    if room < 1:
        raise OutOfRange(
            f"prompt: {num_prompt_tokens} tokens leave no room to generate in the context of "
            f"{limits.max_context_tokens} tokens"
        )
    if requested == 0:
        budget = min(limits.default_max_new_tokens, room)
    elif requested > room:
        raise OutOfRange(
            f"sampling.max_new_tokens: {requested} does not fit: the prompt has {num_prompt_tokens} of "
            f"{limits.max_context_tokens} context tokens"
        )
    else:
        budget = requested
    if num_resumed >= budget:
        raise InvalidArgument(f"resume_token_ids: {num_resumed} tokens already reach max_new_tokens={budget}")
    return budget


def check_request_controls(request) -> None:
    """priority, cache_salt and chat_template_kwargs_json within their bounds (their cost is bounded here)."""
    if abs(request.priority) > MAX_PRIORITY:
        raise InvalidArgument(f"priority: {request.priority} is not in [-{MAX_PRIORITY}, {MAX_PRIORITY}]")
    if len(request.cache_salt.encode("utf-8")) > MAX_CACHE_SALT_BYTES:
        raise InvalidArgument(f"cache_salt: more than {MAX_CACHE_SALT_BYTES} bytes")
    if len(request.chat_template_kwargs_json.encode("utf-8")) > MAX_CHAT_TEMPLATE_KWARGS_BYTES:
        raise InvalidArgument(f"chat_template_kwargs_json: more than {MAX_CHAT_TEMPLATE_KWARGS_BYTES} bytes")


def parse_chat_template_kwargs(text: str, reserved: frozenset[str]) -> dict | None:
    """The JSON object of extra template variables, None when empty; names in `reserved` are refused."""
    if not text:
        return None
    try:
        kwargs = json.loads(text)
    except ValueError:
        raise InvalidArgument("chat_template_kwargs_json: not valid JSON") from None
    if not isinstance(kwargs, dict):
        raise InvalidArgument("chat_template_kwargs_json: must be a JSON object")
    for name in kwargs:
        if name in reserved or not name.isidentifier():
            raise InvalidArgument(f"chat_template_kwargs_json: {name!r} cannot be set (a variable the template gets)")
    return kwargs
