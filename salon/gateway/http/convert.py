"""OpenAI requests -> salon.engine.v1 GenerateRequest; salon events -> OpenAI fields.

Messages map onto salon's dialogue (the engine renders it prefix-stably, so turn N+1 reuses turn N's KV):

    leading system / developer messages  -> the character block (their texts joined by a blank line)
    user                                 -> ROLE_USER, `name` as the author
    assistant                            -> ROLE_CHARACTER (the reply text exactly as salon returned it)
    later system / developer messages    -> ROLE_SYSTEM
    tool, function, tool_calls, images   -> 400 naming the field

Sampling follows OpenAI's defaults (temperature 1 when absent); `max_tokens` / `max_completion_tokens`
absent means the engine's default budget.
"""

from __future__ import annotations

from pydantic import BaseModel

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2
from salon.gateway.http.errors import ApiError, invalid, unsupported
from salon.gateway.http.schemas import (
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
_MESSAGE_FIELDS = {"role", "content", "name"}

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
        text = _text_of(m, where)
        if m.role == "user":
            dialogue.messages.add(role=chat_pb2.ROLE_USER, author=m.name or "", text=text)
            if not first_user_seen:
                first_user_seen = True
                opening.append(("user", f"{m.name or ''}\n{text}"))
        elif m.role == "assistant":
            dialogue.messages.add(role=chat_pb2.ROLE_CHARACTER, author=m.name or "", text=text)
        elif m.role in _SYSTEM_ROLES:
            dialogue.messages.add(role=chat_pb2.ROLE_SYSTEM, text=text)
        else:
            raise unsupported(f"{where}.role", f"role {m.role!r} is not supported (system, developer, user, assistant)")
    if not dialogue.messages:
        raise invalid("messages", "at least one user or assistant message is required after the system messages")
    return character, dialogue, render_opening(opening)


def _check_fields(message: ChatMessage, where: str) -> None:
    for field in sorted((message.model_extra or {}).keys()):
        if (message.model_extra or {}).get(field) is not None and field not in _MESSAGE_FIELDS:
            raise unsupported(f"{where}.{field}", f"{field!r} is not supported in messages")


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
        temperature=1.0 if body.temperature is None else body.temperature,
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
    )
    if body.seed is not None:
        sampling.seed = body.seed
    constraint = constraint_of(body)
    if constraint is not None:
        sampling.constraint.CopyFrom(constraint)
    return sampling


def chat_request(body: ChatCompletionRequest) -> tuple[engine_pb2.GenerateRequest, bytes]:
    """The engine request (without ids and salt) and the opening of a chat completion."""
    refuse_unsupported(body)
    character, dialogue, opening = chat_dialogue(body.messages)
    request = engine_pb2.GenerateRequest(dialogue=dialogue)
    if character is not None:
        request.character.CopyFrom(character)
    max_tokens = body.max_completion_tokens or body.max_tokens
    request.sampling.CopyFrom(sampling_params(body, max_tokens, body.logprobs, body.top_logprobs or 0))
    return request, opening


def completion_request(body: CompletionRequest) -> tuple[engine_pb2.GenerateRequest, bytes]:
    """The engine request and the opening of a text completion (a text or token-id prompt)."""
    refuse_unsupported(body)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise unsupported("prompt", "one prompt per request (a list of prompts is not supported)")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("prompt", "must not be empty")
        request = engine_pb2.GenerateRequest(text=prompt)
        opening = prompt.encode("utf-8")
    else:
        if not prompt:
            raise invalid("prompt", "must not be empty")
        if any(t < 0 for t in prompt):
            raise invalid("prompt", "token ids must not be negative")
        request = engine_pb2.GenerateRequest(tokens=chat_pb2.TokenizedPrompt(token_ids=prompt))
        opening = b"".join(int(t).to_bytes(4, "little") for t in prompt[:1024])
    k = body.logprobs
    request.sampling.CopyFrom(sampling_params(body, body.max_tokens or 16, k is not None, k or 0))
    return request, opening


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


def usage(finals: list[chat_pb2.GenerateFinal]) -> dict:
    """OpenAI usage of a completion's choices: the prompt once, the generated tokens of all; salon's
    split of the cached tokens by source in prompt_tokens_details.cached_tokens_by_source."""
    first = finals[0].usage
    completion_tokens = sum(f.usage.generated_tokens for f in finals)
    cached = first.cached_tokens.device + first.cached_tokens.host
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": first.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": cached,
            "cached_tokens_by_source": {"device": first.cached_tokens.device, "host": first.cached_tokens.host},
        },
    }


def api_error_for_missing_final() -> ApiError:
    return ApiError(502, "the engine stream ended without a final event", "internal_error", "bad_gateway")
