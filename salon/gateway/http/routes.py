"""The endpoints. Each one authenticates first (401 before anything is parsed), then validates the body
(400 naming the field; parsed off the loop when large, body_parse.py), resolves the model (404), checks
the body's counts against its context (bounds.py), is admitted (429: tokenize and detokenize as well
as completions, and a completion of n choices counts n streams), and only then reaches an engine.
The body itself was bounded before any of this (413, body_limit.py).

    POST /v1/chat/completions   chat (stream or not)            POST /tokenize    vLLM's shape
    POST /v1/completions        text or token-id prompt          POST /detokenize  vLLM's shape
    GET  /v1/models             the served models                GET  /health      200 / 503, no auth
"""

from __future__ import annotations

import contextvars
import time
import uuid
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from pydantic import BaseModel

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2
from salon.common.errors import SalonError
from salon.common.logging import bind_request_context, get_logger
from salon.gateway import metrics
from salon.gateway.dispatch import Dispatcher
from salon.gateway.genai_span import set_request_attributes
from salon.gateway.grants import Grants
from salon.gateway.http import convert
from salon.gateway.http.body_parse import BodyParser, BodyProblem
from salon.gateway.http.bounds import check_fits
from salon.gateway.http.catalog import ModelCatalog
from salon.gateway.http.choices import run_choices
from salon.gateway.http.completion import Completion
from salon.gateway.http.errors import ApiError, from_salon_error, invalid, too_large, unsupported
from salon.gateway.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from salon.gateway.http.structured import constraint_field
from salon.gateway.ratelimit import AdmissionControl
from salon.gateway.routing import OPENING_MAX_BYTES, opening_conversation_id
from salon.gateway.tenants import Tenant, TenantTable
from salon.gateway.validate import MAX_CONVERSATION_ID_BYTES

CONVERSATION_ID_HEADER = "x-salon-conversation-id"
ENGINE_ID_HEADER = "x-salon-engine-id"
REQUEST_ID_HEADER = "x-request-id"

_tracer = trace.get_tracer(__name__)
log = get_logger(__name__)
router = APIRouter()


@dataclass
class Front:
    """The gateway core as the HTTP routes use it (the same objects the gRPC servicer uses)."""

    tenants: TenantTable
    admission: AdmissionControl
    dispatcher: Dispatcher
    catalog: ModelCatalog
    grants: Grants
    opening_max_bytes: int = OPENING_MAX_BYTES
    parser: BodyParser = field(default_factory=BodyParser)

    def authenticate(self, request: Request) -> Tenant:
        tenant = self.tenants.authenticate(request.headers.get("authorization"))
        if tenant is None:
            metrics.REFUSALS.labels(reason="unauthenticated").inc()
            raise ApiError(
                401,
                "authorization: missing or unknown API key (expected 'Bearer <key>')",
                "invalid_request_error",
                "invalid_api_key",
            )
        return tenant

    def conversation_id(self, request: Request, tenant: Tenant, opening: bytes, request_id: str) -> str:
        given = request.headers.get(CONVERSATION_ID_HEADER)
        if given is not None:
            if not given or len(given.encode()) > MAX_CONVERSATION_ID_BYTES:
                raise invalid(CONVERSATION_ID_HEADER, f"must be 1..{MAX_CONVERSATION_ID_BYTES} bytes")
            return given
        return (
            opening_conversation_id(tenant.namespace_salt, opening, self.opening_max_bytes) or f"~request/{request_id}"
        )

    def admit(self, tenant: Tenant, num_streams: int = 1) -> None:
        """Take `num_streams` of the tenant's streams and a rate token (release them after), or 429/400."""
        limit = tenant.max_concurrent_streams
        if limit is not None and num_streams > limit:
            metrics.REFUSALS.labels(reason="invalid").inc()
            raise invalid("n", f"{num_streams} choices are more than this key's limit of {limit} concurrent streams")
        refusal = self.admission.admit(tenant, time.monotonic(), num_streams)
        if refusal is not None:
            metrics.REFUSALS.labels(reason=refusal.reason).inc()
            raise ApiError(
                429, refusal.message, "rate_limit_error", "rate_limit_exceeded", None, refusal.retry_after_ms
            )


def _front(request: Request) -> Front:
    return request.app.state.front


async def parse(request: Request, model: type[BaseModel]):
    """The body as `model`, or a 400 (413) naming the first offending field."""
    result = await _front(request).parser.parse(await request.body(), model)
    if not isinstance(result, BodyProblem):
        return result
    metrics.REFUSALS.labels(reason="invalid").inc()
    if result.unsupported:
        raise unsupported(result.param, result.message)
    if result.status == 413:
        raise too_large(result.param, result.message)
    if result.status == 503:
        raise ApiError(503, f"{result.param}: {result.message}", "service_unavailable", "parser_restarted")
    raise invalid(result.param, result.message)


async def _complete(request: Request, body_model: type, operation: str) -> Response:
    arrived_s = time.perf_counter()
    front = _front(request)
    tenant = front.authenticate(request)
    body = await parse(request, body_model)
    info = await front.catalog.resolve(body.model)
    try:
        check_fits(body, info)
        if operation == "chat":
            prompts = [convert.chat_request(body)]
            echo = [convert.chat_echo(body)]
            logprobs = body.logprobs
        else:
            prompts = convert.completion_requests(body)
            echo = None
            logprobs = body.logprobs is not None
    except ApiError:
        metrics.REFUSALS.labels(reason="invalid").inc()
        raise
    front.admit(tenant, body.n)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            front.admission.release(tenant, body.n)

    try:
        request_id = uuid.uuid4().hex
        for p, (engine_request, opening) in enumerate(prompts):
            engine_request.request_id = request_id if p == 0 else f"{request_id}-p{p}"
            engine_request.conversation_id = front.conversation_id(request, tenant, opening, engine_request.request_id)
            engine_request.namespace_salt = tenant.namespace_salt
            engine_request.namespace_grant = front.grants.for_tenant(tenant)
        engine_request = prompts[0][0]
        if echo is None:  # after admission: a token-id prompt's text costs an engine call
            echo = [await _prompt_text(front, r, info.model_id) if body.echo else "" for r, _ in prompts]
        # A new trace: the public port does not continue a client's trace context.
        span = _tracer.start_span(
            f"{operation} {info.model_id}",
            kind=SpanKind.SERVER,
            context=otel_context.Context(),
            attributes={"http.route": request.url.path},
        )
        set_request_attributes(span, operation, info.model_id, engine_request.sampling, body.n)
        context = contextvars.copy_context()
        context.run(_enter, span, request_id, engine_request.conversation_id, tenant)
        events = run_choices(
            front.dispatcher, [r for r, _ in prompts], body.n, tenant.tenant_id, None, arrived_s, context, info.model_id
        )
    except BaseException:
        release()
        raise
    prefix = "chatcmpl-" if operation == "chat" else "cmpl-"
    stream_options = body.stream_options
    # a constraint the engine refuses (it does not compile) came from a structured output field, or from the tools
    constraint = constraint_field(body) or ("tools" if getattr(body, "tools", None) else None)
    completion = Completion(
        kind=operation,
        response_id=prefix + request_id,
        model=info.model_id,
        num_choices=body.n * len(prompts),
        events=events,
        span=span,
        release=release,
        logprobs=logprobs,
        include_usage=bool(body.stream and stream_options and stream_options.include_usage),
        arrived_s=arrived_s,
        return_token_ids=body.return_token_ids,
        choices_per_prompt=body.n,
        echo=[text for text in echo for _ in range(body.n)],
        tool_names=[t.name for t in engine_request.tools]
        if engine_request.tool_choice.mode != chat_pb2.TOOL_CHOICE_MODE_NONE
        else [],
        fields={"sampling.constraint": constraint} if constraint else None,
        parallel_tool_calls=not engine_request.HasField("parallel_tool_calls") or engine_request.parallel_tool_calls,
    )
    headers = {REQUEST_ID_HEADER: request_id}
    if body.stream:
        first = await completion.first()
        return StreamingResponse(
            completion.sse(first), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"}
        )
    result = await completion.body()
    return JSONResponse(result, headers={**headers, ENGINE_ID_HEADER: completion.engine_id})


async def _prompt_text(front: Front, request: engine_pb2.GenerateRequest, model_id: str) -> str:
    """A completion prompt's text (echo): the text itself, or the token ids detokenized by an engine."""
    if request.WhichOneof("context") == "text":
        return request.text
    response = await front.catalog.call_any(
        "Detokenize", engine_pb2.DetokenizeRequest(token_ids=request.tokens.token_ids), model_id
    )
    return response.text


def _enter(span, request_id: str, conversation_id: str, tenant: Tenant) -> None:
    otel_context.attach(trace.set_span_in_context(span))
    bind_request_context(request_id=request_id, conversation_id=conversation_id, tenant=tenant.tenant_id)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _complete(request, ChatCompletionRequest, "chat")


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _complete(request, CompletionRequest, "text_completion")


def _model_entry(info: chat_pb2.ModelInfo, created: int) -> dict:
    return {
        "id": info.model_id,
        "object": "model",
        "created": created,
        "owned_by": "salon",
        "max_model_len": info.max_context_tokens,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    front = _front(request)
    front.authenticate(request)
    models = await front.catalog.models()
    return JSONResponse({"object": "list", "data": [_model_entry(m, front.catalog.created_unix_s) for m in models]})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> Response:
    front = _front(request)
    front.authenticate(request)
    info = await front.catalog.resolve(model_id)
    return JSONResponse(_model_entry(info, front.catalog.created_unix_s))


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    front = _front(request)
    tenant = front.authenticate(request)
    body: TokenizeRequest = await parse(request, TokenizeRequest)
    info = await front.catalog.resolve(body.model)
    check_fits(body, info)
    if (body.prompt is None) == (body.messages is None):
        raise invalid("prompt", "give exactly one of prompt and messages")
    if body.prompt is not None:
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        engine_request = engine_pb2.TokenizeRequest(text=body.prompt, add_special_tokens=add_special)
    else:
        if not body.add_generation_prompt:
            raise unsupported("add_generation_prompt", "salon always renders the generation prompt")
        if body.add_special_tokens:
            raise unsupported("add_special_tokens", "with messages, the rendered template has its own special tokens")
        character, dialogue, _ = convert.chat_dialogue(body.messages)
        engine_request = engine_pb2.TokenizeRequest(dialogue=dialogue, namespace_salt=tenant.namespace_salt)
        if character is not None:
            engine_request.character.CopyFrom(character)
    front.admit(tenant)
    try:
        response = await front.catalog.call_any("Tokenize", engine_request, info.model_id)
    finally:
        front.admission.release(tenant)
    return JSONResponse(
        {
            "count": len(response.token_ids),
            "max_model_len": response.max_context_tokens or info.max_context_tokens,
            "tokens": list(response.token_ids),
            "token_strs": None,
        }
    )


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    front = _front(request)
    tenant = front.authenticate(request)
    body: DetokenizeRequest = await parse(request, DetokenizeRequest)
    info = await front.catalog.resolve(body.model)
    check_fits(body, info)
    front.admit(tenant)
    try:
        response = await front.catalog.call_any(
            "Detokenize", engine_pb2.DetokenizeRequest(token_ids=body.tokens), info.model_id
        )
    finally:
        front.admission.release(tenant)
    return JSONResponse({"prompt": response.text})


@router.get("/health")
async def health(request: Request) -> Response:
    if _front(request).catalog.accepting_handles():
        return Response(status_code=200)
    return JSONResponse(
        {
            "error": {
                "message": "no engine is serving",
                "type": "service_unavailable",
                "param": None,
                "code": "no_engine",
            }
        },
        status_code=503,
    )


def salon_error_response(exc: SalonError) -> Response:
    return from_salon_error(exc).response()
