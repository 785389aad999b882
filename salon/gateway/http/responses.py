"""OpenAI's Responses API over salon's chat path, with stored responses continued by id.

    POST   /v1/responses         create (stream or not); `previous_response_id` continues a stored one
    GET    /v1/responses/{id}    a stored response (404 once expired, erased, or for another tenant)
    DELETE /v1/responses/{id}    forget one stored response

A response is a chat completion of these messages (convert.chat_request renders them, so the reply is
the chat endpoint's reply to the same messages):

    instructions            -> a leading system message (not carried over: OpenAI's rule; send the
                               same instructions again to keep the dialogue's prefix, and its KV)
    previous response       -> its dialogue: the earlier inputs and replies, as stored
    input                   -> a string is one user message; a list holds messages {role, content},
                               content a string or input_text / output_text parts

A stored response (`store`, default true) is kept in the gateway's session table (memory, or Redis
when configured) for `--session-ttl-s`, under `<tenant>/<response id>`: another tenant's lookup finds
nothing (404). Its record holds the dialogue so far (messages), the dialogue's conversation id and
its size in tokens. A continuation is the dialogue's next turn: the same conversation id (so the same
engine, sticky, and so its cached prefix: usage.input_tokens_details.cached_tokens), and it is refused
before any work once the dialogue fills the model's context. DeleteConversation of that conversation
id (returned in `x-salon-conversation-id`) erases the dialogue's stored responses.
"""

from __future__ import annotations

import contextvars
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from salon.common.logging import bind_request_context, get_logger
from salon.gateway import metrics
from salon.gateway.genai_span import set_request_attributes
from salon.gateway.http import convert
from salon.gateway.http.choices import run_choices
from salon.gateway.http.completion import Completion
from salon.gateway.http.errors import ApiError, invalid, unsupported
from salon.gateway.http.responses_answer import ResponseAnswer
from salon.gateway.http.responses_schema import MAX_ID_CHARS, ResponsesRequest, refuse_unsupported
from salon.gateway.http.routes import (
    CONVERSATION_ID_HEADER,
    ENGINE_ID_HEADER,
    REQUEST_ID_HEADER,
    Front,
    parse,
)
from salon.gateway.http.schemas import ChatCompletionRequest
from salon.gateway.sessions import SessionTable
from salon.gateway.tenants import Tenant
from salon.gateway.types import dialogue_key, response_key

log = get_logger(__name__)
_tracer = trace.get_tracer(__name__)
router = APIRouter()

_ROLES = ("user", "assistant", "system", "developer")
_ITEM_FIELDS = {"type", "role", "content", "id", "status", "phase"}  # the last three: an output item sent back
_TEXT_PARTS = ("input_text", "output_text")


@dataclass(frozen=True)
class StoredResponse:
    """What a continuation needs of a stored response, and the response itself."""

    conversation_id: str
    model: str
    messages: list[dict]  # the dialogue so far, {role, content} with string content, its reply included
    num_tokens: int  # the dialogue's size: the response's input plus output tokens
    response: dict

    def dump(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @staticmethod
    def load(record: str) -> StoredResponse:
        return StoredResponse(**json.loads(record))


def input_messages(given: Any) -> list[dict]:
    """The request's `input` as chat messages {role, content: str}, or a 400 naming the offending item."""
    if isinstance(given, str):
        if not given:
            raise invalid("input", "must not be empty")
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise invalid("input", "must be a non-empty string or a non-empty list of input items")
    return [_message(item, f"input[{i}]") for i, item in enumerate(given)]


def _message(item: Any, where: str) -> dict:
    if not isinstance(item, dict):
        raise invalid(where, "must be an object (a message with role and content)")
    if item.get("type", "message") != "message":
        raise unsupported(f"{where}.type", f"{item['type']!r} items are not supported; only messages")
    for field in item:
        if field not in _ITEM_FIELDS:
            raise unsupported(f"{where}.{field}", "is not a supported field")
    role = item.get("role")
    if role not in _ROLES:
        raise invalid(f"{where}.role", f"must be one of {', '.join(_ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        pieces = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise unsupported(f"{where}.content[{j}].type", f"{kind!r} content is not supported; only text")
            if not isinstance(part.get("text"), str):
                raise invalid(f"{where}.content[{j}].text", "must be a string")
            pieces.append(part["text"])
        text = "".join(pieces)
    else:
        raise invalid(f"{where}.content", "must be a string or a list of input_text parts")
    if not text:
        raise invalid(f"{where}.content", "must not be empty")
    return {"role": role, "content": text}


def not_found(response_id: str, param: str) -> ApiError:
    return ApiError(
        404,
        f"{param}: no stored response {response_id!r} (unknown, expired, erased, or created with store=false)",
        "invalid_request_error",
        "previous_response_not_found" if param == "previous_response_id" else "response_not_found",
        param,
    )


async def load_stored(sessions: SessionTable, tenant: Tenant, response_id: str, param: str) -> StoredResponse:
    """The tenant's stored response `response_id`, else 404 (503 while the store cannot be reached)."""
    record = None
    if len(response_id) <= MAX_ID_CHARS:
        record = await sessions.get_response(response_key(tenant.tenant_id, response_id))
    if record is None:
        if not sessions.available:
            raise ApiError(503, "the session store cannot be reached; retry", "service_unavailable", "store_down")
        raise not_found(response_id, param)
    return StoredResponse.load(record)


def _echo(body: ResponsesRequest, model: str) -> dict:
    """The Response fields that repeat the request."""
    return {
        "model": model,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "previous_response_id": body.previous_response_id,
        "store": body.store,
        "metadata": body.metadata or {},
        "user": body.user,
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "tool_choice": body.tool_choice or "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "background": False,
    }


def _chat_body(body: ResponsesRequest, model: str, messages: list[dict]) -> ChatCompletionRequest:
    fields: dict[str, Any] = {"model": model, "messages": messages}
    if body.max_output_tokens is not None:
        fields["max_completion_tokens"] = body.max_output_tokens
    if body.temperature is not None:
        fields["temperature"] = body.temperature
    if body.top_p is not None:
        fields["top_p"] = body.top_p
    fmt = (body.text or {}).get("format")
    if fmt is not None and fmt.get("type") == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.get("type") == "json_schema":  # the chat API's json_schema, flattened
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        fields["response_format"] = {"type": "json_schema", "json_schema": spec}
    return ChatCompletionRequest.model_validate(fields)


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    arrived_s = time.perf_counter()
    front: Front = request.app.state.front
    tenant = front.authenticate(request)
    body: ResponsesRequest = await parse(request, ResponsesRequest)
    sessions = front.dispatcher.sessions
    try:
        refuse_unsupported(body)
        new_messages = input_messages(body.input)
    except ApiError:
        metrics.REFUSALS.labels(reason="invalid").inc()
        raise
    previous = None
    if body.previous_response_id is not None:
        previous = await load_stored(sessions, tenant, body.previous_response_id, "previous_response_id")
    info = await front.catalog.resolve(body.model or (previous.model if previous else None))
    history = previous.messages if previous else []
    if previous and info.max_context_tokens and previous.num_tokens + 1 >= info.max_context_tokens:
        raise invalid(
            "previous_response_id",
            f"the dialogue holds {previous.num_tokens} tokens and the model's context is "
            f"{info.max_context_tokens}: there is no room for another turn; start a new dialogue",
            "context_length_exceeded",
        )
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages = instructions + history + new_messages
    if all(m["role"] in ("system", "developer") for m in messages):
        raise invalid("input", "at least one user or assistant message is required")
    engine_request, opening = convert.chat_request(_chat_body(body, info.model_id, messages))
    given_conversation_id = request.headers.get(CONVERSATION_ID_HEADER)
    if previous and given_conversation_id not in (None, previous.conversation_id):
        raise invalid(CONVERSATION_ID_HEADER, "differs from the conversation of previous_response_id")
    refusal = front.admission.admit(tenant, time.monotonic())
    if refusal is not None:
        metrics.REFUSALS.labels(reason=refusal.reason).inc()
        raise ApiError(429, refusal.message, "rate_limit_error", "rate_limit_exceeded", None, refusal.retry_after_ms)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            front.admission.release(tenant)

    try:
        request_id = uuid.uuid4().hex
        engine_request.request_id = request_id
        if previous:
            engine_request.conversation_id = previous.conversation_id
        else:
            engine_request.conversation_id = front.conversation_id(request, tenant, opening, request_id)
        engine_request.namespace_salt = tenant.namespace_salt
        engine_request.namespace_grant = front.grants.for_tenant(tenant)
        # A new trace: the public port does not continue a client's trace context.
        span = _tracer.start_span(
            f"chat {info.model_id}",
            kind=SpanKind.SERVER,
            context=otel_context.Context(),
            attributes={"http.route": request.url.path},
        )
        set_request_attributes(span, "chat", info.model_id, engine_request.sampling, 1)
        context = contextvars.copy_context()
        context.run(_enter, span, request_id, engine_request.conversation_id, tenant)
        events = run_choices(
            front.dispatcher, [engine_request], 1, tenant.tenant_id, None, arrived_s, context, info.model_id
        )
    except BaseException:
        release()
        raise
    completion = Completion(
        kind="chat",
        response_id="resp_" + request_id,
        model=info.model_id,
        num_choices=1,
        events=events,
        span=span,
        release=release,
        logprobs=False,
        include_usage=False,
        arrived_s=arrived_s,
        # the only constraint here is text.format's, which the engine may refuse (it does not compile)
        fields={"sampling.constraint": "text.format"},
    )
    conversation_id = engine_request.conversation_id

    async def finish(response: dict, reply: str) -> None:
        if not body.store:
            return
        dialogue = history + new_messages + ([{"role": "assistant", "content": reply}] if reply else [])
        usage = response["usage"]
        stored = StoredResponse(
            conversation_id, info.model_id, dialogue, usage["input_tokens"] + usage["output_tokens"], response
        )
        key = response_key(tenant.tenant_id, response["id"])
        if not await sessions.put_response(dialogue_key(tenant.tenant_id, conversation_id), key, stored.dump()):
            log.warning("response_not_stored", response_id=response["id"])

    answer = ResponseAnswer(completion, _echo(body, info.model_id), finish)
    headers = {REQUEST_ID_HEADER: request_id, CONVERSATION_ID_HEADER: conversation_id}
    if body.stream:
        first = await completion.first()
        return StreamingResponse(
            answer.sse(first), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"}
        )
    result = await answer.body()
    return JSONResponse(result, headers={**headers, ENGINE_ID_HEADER: completion.engine_id})


def _enter(span, request_id: str, conversation_id: str, tenant: Tenant) -> None:
    otel_context.attach(trace.set_span_in_context(span))
    bind_request_context(request_id=request_id, conversation_id=conversation_id, tenant=tenant.tenant_id)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> Response:
    front: Front = request.app.state.front
    tenant = front.authenticate(request)
    stored = await load_stored(front.dispatcher.sessions, tenant, response_id, "response_id")
    return JSONResponse(stored.response, headers={CONVERSATION_ID_HEADER: stored.conversation_id})


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Response:
    front: Front = request.app.state.front
    tenant = front.authenticate(request)
    sessions = front.dispatcher.sessions
    await load_stored(sessions, tenant, response_id, "response_id")
    if not await sessions.delete_response(response_key(tenant.tenant_id, response_id)):
        raise ApiError(503, "the session store cannot be reached; retry", "service_unavailable", "store_down")
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
