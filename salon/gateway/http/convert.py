"""OpenAI requests -> salon.engine.v1 GenerateRequest; salon events -> OpenAI fields.

Messages map onto salon's dialogue (the engine renders it prefix-stably, so turn N+1 reuses turn N's KV):

    leading system / developer messages  -> the character block (their texts joined by a blank line)
    user                                 -> ROLE_USER, `name` as the author
    assistant                            -> ROLE_CHARACTER (the reply text exactly as salon returned it),
                                            its tool_calls as the message's tool calls
    tool                                 -> ROLE_TOOL with its tool_call_id
    later system / developer messages    -> ROLE_SYSTEM
    function, images                     -> 400 naming the field

tools / tool_choice / parallel_tool_calls: tool_request.py.

Sampling fields the request omits (temperature, top_p, top_k, min_p, repetition_penalty) take the model's
defaults, as vLLM's do (ModelInfo.default_sampling: the model file's, its card's, else temperature 1 and no
limits); `max_tokens` / `max_completion_tokens` absent means the engine's default budget.
"""

from __future__ import annotations

import json
import math

from pydantic import BaseModel

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2
from salon.common.request_bounds import MAX_CACHE_SALT_BYTES, MAX_CHAT_TEMPLATE_KWARGS_BYTES, MAX_LOGIT_BIAS_VALUE
from salon.gateway.http import tool_request
from salon.gateway.http.errors import ApiError, invalid, unsupported
from salon.gateway.http.schemas import (
    MAX_PROMPTS,
    MAX_STOP,
    UNSUPPORTED,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)
from salon.gateway.http.structured import constraint_of
from salon.gateway.routing import render_opening

_SYSTEM_ROLES = ("system", "developer")
_MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id"}
# The sampling fields an omitting request leaves to the model (chat_pb2.SamplingParams.model_default_fields).
_MODEL_DEFAULT_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")

FINISH_REASONS = {
    chat_pb2.FINISH_REASON_STOP_TOKEN: "stop",
    chat_pb2.FINISH_REASON_STOP_STRING: "stop",
    chat_pb2.FINISH_REASON_LENGTH: "length",
    chat_pb2.FINISH_REASON_CONTEXT_FULL: "length",
    chat_pb2.FINISH_REASON_ABORTED: "abort",
}


def refuse_unsupported(body: BaseModel) -> None:
    """400 for the first field salon does not implement that the request sets."""
    for field in body.model_fields_set:
        value = getattr(body, field)
        if field in UNSUPPORTED and value is not None:
            raise unsupported(field, UNSUPPORTED[field])
    if getattr(body, "best_of", None) not in (None, 1):
        raise unsupported("best_of", "best_of is not supported; use n")
    if isinstance(body, ChatCompletionRequest):
        if body.modalities is not None and body.modalities != ["text"]:
            raise unsupported("modalities", "only ['text'] is supported")
        if body.store:
            raise unsupported("store", "stored completions are not supported")
        if body.service_tier not in (None, "auto", "default"):
            raise unsupported("service_tier", f"{body.service_tier!r} is not offered")
        if body.top_logprobs and not body.logprobs:
            raise invalid("top_logprobs", "requires logprobs to be true")
    if body.echo and body.logprobs:
        raise unsupported("echo", "echo with logprobs (prompt log-probabilities) is not supported")
    max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
    if body.min_tokens and max_tokens is not None and body.min_tokens > max_tokens:
        raise invalid("min_tokens", f"{body.min_tokens} is more than max_tokens {max_tokens}")


def logit_bias(body: SamplingFields) -> dict[int, float]:
    """OpenAI's logit_bias: token id strings -> bias within [-100, 100]."""
    out: dict[int, float] = {}
    for key, bias in (body.logit_bias or {}).items():
        if not (key.isascii() and key.isdigit()) or len(key.lstrip("0")) > 10:  # (int() refuses 4,300 digits)
            raise invalid(f"logit_bias.{key}", "keys must be token ids (decimal integers)")
        if not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS_VALUE:
            raise invalid(f"logit_bias.{key}", f"must be within [-{MAX_LOGIT_BIAS_VALUE:g}, {MAX_LOGIT_BIAS_VALUE:g}]")
        out[int(key)] = bias
    return out


def _text_of(message: ChatMessage, where: str) -> str:
    content = message.content
    if content is None:
        raise invalid(f"{where}.content", "is required")
    if isinstance(content, str):
        text = content
    else:
        pieces = []
        for j, part in enumerate(content):
            if part.type != "text" or part.text is None:
                raise unsupported(f"{where}.content[{j}].type", f"{part.type!r} content is not supported; only text")
            pieces.append(part.text)
        text = "".join(pieces)
    if not text:
        raise invalid(f"{where}.content", "must not be empty")
    return text


def chat_dialogue(messages: list[ChatMessage]) -> tuple[chat_pb2.Character | None, chat_pb2.Dialogue, bytes]:
    """The character block, the dialogue and the opening (routing.py) of a chat's messages."""
    system_texts: list[str] = []
    i = 0
    while i < len(messages) and messages[i].role in _SYSTEM_ROLES:
        _check_fields(messages[i], f"messages[{i}]")
        system_texts.append(_text_of(messages[i], f"messages[{i}]"))
        i += 1
    definition = "\n\n".join(system_texts)
    character = chat_pb2.Character(definition=definition) if system_texts else None
    opening = [("system", definition)] if system_texts else []
    dialogue = chat_pb2.Dialogue()
    first_user_seen = False
    for j in range(i, len(messages)):
        m, where = messages[j], f"messages[{j}]"
        _check_fields(m, where)
        calls = tool_request.assistant_tool_calls(m, where) if m.role == "assistant" else []
        text = "" if calls and not m.content else _text_of(m, where)
        if m.role == "tool":
            call_id = tool_request.tool_call_id(m, where)
            dialogue.messages.add(role=chat_pb2.ROLE_TOOL, text=text, tool_call_id=call_id)
        elif m.role == "user":
            dialogue.messages.add(role=chat_pb2.ROLE_USER, author=m.name or "", text=text)
            if not first_user_seen:
                first_user_seen = True
                opening.append(("user", f"{m.name or ''}\n{text}"))
        elif m.role == "assistant":
            dialogue.messages.add(role=chat_pb2.ROLE_CHARACTER, author=m.name or "", text=text, tool_calls=calls)
        elif m.role in _SYSTEM_ROLES:
            dialogue.messages.add(role=chat_pb2.ROLE_SYSTEM, text=text)
        else:
            raise unsupported(
                f"{where}.role", f"role {m.role!r} is not supported (system, developer, user, assistant, tool)"
            )
    if not dialogue.messages:
        raise invalid("messages", "at least one user or assistant message is required after the system messages")
    return character, dialogue, render_opening(opening)


def _check_fields(message: ChatMessage, where: str) -> None:
    allowed = {"assistant": "tool_calls", "tool": "tool_call_id"}.get(message.role)
    for field in sorted((message.model_extra or {}).keys()):
        if (message.model_extra or {}).get(field) is not None and field not in _MESSAGE_FIELDS:
            raise unsupported(f"{where}.{field}", f"{field!r} is not supported in messages")
        if field in ("tool_calls", "tool_call_id") and field != allowed and (message.model_extra or {}).get(field):
            raise invalid(f"{where}.{field}", f"not allowed in a {message.role!r} message")


def sampling_params(
    body: SamplingFields, max_tokens: int | None, return_logprobs: bool, top_logprobs: int
) -> chat_pb2.SamplingParams:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > MAX_STOP:
        raise invalid("stop", f"at most {MAX_STOP} stop strings")
    for k, s in enumerate(stop):
        if not s:
            raise invalid(f"stop[{k}]", "must not be empty")
    sampling = chat_pb2.SamplingParams(
        max_new_tokens=max_tokens or 0,
        temperature=body.temperature or 0.0,
        top_k=0 if body.top_k in (None, -1) else body.top_k,
        top_p=body.top_p or 0.0,
        stop_strings=stop,
        stop_token_ids=body.stop_token_ids or [],
        return_logprobs=return_logprobs,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=body.repetition_penalty or 0.0,
        min_p=body.min_p or 0.0,
        top_logprobs=top_logprobs,
        ignore_eos=bool(body.ignore_eos),
        min_tokens=body.min_tokens or 0,
        logit_bias=logit_bias(body),
        include_stop_str_in_output=bool(body.include_stop_str_in_output),
        # -1: vLLM's "the model's context", i.e. keep all.
        truncate_prompt_tokens=max(0, body.truncate_prompt_tokens or 0),
        model_default_fields=[name for name in _MODEL_DEFAULT_FIELDS if getattr(body, name) is None],
    )
    if body.seed is not None:
        sampling.seed = body.seed
    if body.skip_special_tokens is not None:
        sampling.skip_special_tokens = body.skip_special_tokens
    if body.spaces_between_special_tokens is not None:
        sampling.spaces_between_special_tokens = body.spaces_between_special_tokens
    constraint = constraint_of(body)
    if constraint is not None:
        sampling.constraint.CopyFrom(constraint)
    return sampling


def _request_controls(body: SamplingFields, request: engine_pb2.GenerateRequest) -> None:
    request.priority = body.priority or 0
    cache_salt = body.cache_salt or ""
    if len(cache_salt.encode("utf-8")) > MAX_CACHE_SALT_BYTES:
        raise invalid("cache_salt", f"more than {MAX_CACHE_SALT_BYTES} bytes")
    request.cache_salt = cache_salt


def chat_request(body: ChatCompletionRequest) -> tuple[engine_pb2.GenerateRequest, bytes]:
    """The engine request (without ids and salt) and the opening of a chat completion."""
    refuse_unsupported(body)
    character, dialogue, opening = chat_dialogue(body.messages)
    request = engine_pb2.GenerateRequest(dialogue=dialogue)
    if character is not None:
        request.character.CopyFrom(character)
    max_tokens = body.max_completion_tokens or body.max_tokens
    request.sampling.CopyFrom(sampling_params(body, max_tokens, body.logprobs, body.top_logprobs or 0))
    _request_controls(body, request)
    tool_request.chat_tools(body, request)
    if body.chat_template_kwargs:
        encoded = json.dumps(body.chat_template_kwargs, separators=(",", ":"))
        if len(encoded.encode("utf-8")) > MAX_CHAT_TEMPLATE_KWARGS_BYTES:
            raise invalid("chat_template_kwargs", f"more than {MAX_CHAT_TEMPLATE_KWARGS_BYTES} bytes as JSON")
        request.chat_template_kwargs_json = encoded
    return request, opening


def chat_echo(body: ChatCompletionRequest) -> str:
    """vLLM's echo for chat: the last message's text when it is the assistant's (the reply continues it)."""
    last = body.messages[-1]
    if not body.echo or last.role != "assistant":
        return ""
    return _text_of(last, f"messages[{len(body.messages) - 1}]")


def completion_prompts(body: CompletionRequest) -> tuple[list[str | list[int]], bool]:
    """The prompts of a text completion (one text or token-id list, or a list of either, at most MAX_PROMPTS),
    and whether the request gave a list of them."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) > MAX_PROMPTS:
            raise invalid("prompt", f"at most {MAX_PROMPTS} prompts per request")
        return list(prompt), True
    return [prompt], False


def completion_requests(body: CompletionRequest) -> list[tuple[engine_pb2.GenerateRequest, bytes]]:
    """Per prompt, the engine request and the opening of a text completion (a text or token-id prompt)."""
    refuse_unsupported(body)
    prompts, listed = completion_prompts(body)
    k = body.logprobs
    sampling = sampling_params(body, body.max_tokens or 16, k is not None, k or 0)
    out = []
    for i, prompt in enumerate(prompts):
        where = f"prompt[{i}]" if listed else "prompt"
        if isinstance(prompt, str):
            if not prompt:
                raise invalid(where, "must not be empty")
            request = engine_pb2.GenerateRequest(text=prompt)
            opening = prompt.encode("utf-8")
        else:
            if not prompt:
                raise invalid(where, "must not be empty")
            if any(t < 0 for t in prompt):
                raise invalid(where, "token ids must not be negative")
            request = engine_pb2.GenerateRequest(tokens=chat_pb2.TokenizedPrompt(token_ids=prompt))
            opening = b"".join(int(t).to_bytes(4, "little") for t in prompt[:1024])
        request.sampling.CopyFrom(sampling)
        _request_controls(body, request)
        out.append((request, opening))
    return out


def _token(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def chat_logprobs(delta: chat_pb2.TokenDelta) -> list[dict]:
    """`logprobs.content` entries of a delta's tokens."""
    out = []
    for i, lp in enumerate(delta.logprobs):
        data = delta.token_bytes[i] if i < len(delta.token_bytes) else b""
        top = delta.top_logprobs[i].candidates if i < len(delta.top_logprobs) else ()
        out.append(
            {
                "token": _token(data),
                "logprob": lp,
                "bytes": list(data),
                "top_logprobs": [
                    {"token": _token(c.token_bytes), "logprob": c.logprob, "bytes": list(c.token_bytes)} for c in top
                ],
            }
        )
    return out


def completion_logprobs(delta: chat_pb2.TokenDelta, text_offset: int) -> dict:
    """The legacy completions `logprobs` object of a delta's tokens (offsets from text_offset)."""
    tokens, offsets = [], []
    for i in range(len(delta.logprobs)):
        token = _token(delta.token_bytes[i] if i < len(delta.token_bytes) else b"")
        tokens.append(token)
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": list(delta.logprobs),
        "top_logprobs": [{_token(c.token_bytes): c.logprob for c in p.candidates} for p in delta.top_logprobs]
        if len(delta.top_logprobs)
        else None,
        "text_offset": offsets,
    }


def usage(finals: list[chat_pb2.GenerateFinal], n: int = 1) -> dict:
    """OpenAI usage of a completion's choices (in index order, n per prompt): each prompt once, the generated
    tokens of all; salon's split of the cached tokens by source in prompt_tokens_details.cached_tokens_by_source."""
    firsts = [f.usage for f in finals[::n]]
    prompt_tokens = sum(u.prompt_tokens for u in firsts)
    device = sum(u.cached_tokens.device for u in firsts)
    host = sum(u.cached_tokens.host for u in firsts)
    completion_tokens = sum(f.usage.generated_tokens for f in finals)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": device + host,
            "cached_tokens_by_source": {"device": device, "host": host},
        },
    }


def api_error_for_missing_final() -> ApiError:
    return ApiError(502, "the engine stream ended without a final event", "internal_error", "bad_gateway")
