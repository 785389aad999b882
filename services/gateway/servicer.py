"""salon.chat.v1.ChatService: authenticate, validate, admit, then hand the reply to the dispatcher."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import grpc
import structlog
from opentelemetry import trace

from salon.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.engine.v1 import engine_pb2
from services.common.errors import ResourceExhausted, Unauthenticated, Unavailable
from services.common.logging import bind_request_context, get_logger
from services.gateway import metrics
from services.gateway.dispatch import Dispatcher
from services.gateway.genai_span import set_request_attributes, set_response_attributes
from services.gateway.membership import EnginePool
from services.gateway.ratelimit import AdmissionControl
from services.gateway.tenants import Tenant, TenantTable
from services.gateway.validate import validate_generate

log = get_logger(__name__)

AUTHORIZATION_METADATA_KEY = "authorization"
_MODEL_INFO_TIMEOUT_S = 5.0


def to_engine_request(request: chat_pb2.GenerateRequest, request_id: str, namespace_salt: str) -> engine_pb2.GenerateRequest:
    engine_request = engine_pb2.GenerateRequest(
        request_id=request_id,
        conversation_id=request.conversation_id,
        namespace_salt=namespace_salt,
    )
    if request.HasField("character"):
        engine_request.character.CopyFrom(request.character)
    if request.HasField("sampling"):
        engine_request.sampling.CopyFrom(request.sampling)
    which = request.WhichOneof("context")
    if which == "dialogue":
        engine_request.dialogue.CopyFrom(request.dialogue)
    elif which == "text":
        engine_request.text = request.text
    else:
        engine_request.tokens.CopyFrom(request.tokens)
    return engine_request


class ChatServicer(chat_pb2_grpc.ChatServiceServicer):
    def __init__(self, tenants: TenantTable, admission: AdmissionControl, dispatcher: Dispatcher,
                 pool: EnginePool, model_info_ttl_s: float):
        self.tenants = tenants
        self.admission = admission
        self.dispatcher = dispatcher
        self.pool = pool
        self.model_info_ttl_s = model_info_ttl_s
        self._model_info: chat_pb2.ModelInfo | None = None
        self._model_info_expires_s = 0.0

    def _authenticate(self, context: grpc.aio.ServicerContext) -> Tenant:
        authorization = None
        for key, value in context.invocation_metadata() or ():
            if key == AUTHORIZATION_METADATA_KEY:
                authorization = value if isinstance(value, str) else None
        tenant = self.tenants.authenticate(authorization)
        if tenant is None:
            metrics.REFUSALS.labels(reason="unauthenticated").inc()
            raise Unauthenticated("authorization: missing or unknown API key (expected 'Bearer <key>')")
        return tenant

    async def Generate(
        self, request: chat_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[chat_pb2.GenerateResponse]:
        arrived_s = time.perf_counter()
        tenant = self._authenticate(context)
        try:
            validate_generate(request)
        except Exception:
            metrics.REFUSALS.labels(reason="invalid").inc()
            raise
        refusal = self.admission.admit(tenant, time.monotonic())
        if refusal is not None:
            metrics.REFUSALS.labels(reason=refusal.reason).inc()
            raise ResourceExhausted(refusal.message, refusal.retry_after_ms)
        try:
            request_id = (
                request.request_id
                or structlog.contextvars.get_contextvars().get("request_id")
                or uuid.uuid4().hex
            )
            bind_request_context(request_id=request_id, conversation_id=request.conversation_id,
                                 tenant=tenant.tenant_id)
            remaining_s = context.time_remaining()
            deadline_s = None if remaining_s is None else time.monotonic() + remaining_s
            engine_request = to_engine_request(request, request_id, tenant.namespace_salt)
            model = self._model_info.model_id if self._model_info is not None else ""
            span = trace.get_current_span()
            operation = "text_completion" if request.WhichOneof("context") != "dialogue" else "chat"
            set_request_attributes(span, operation, model, request.sampling)
            first_token_s = None
            async for event in self.dispatcher.stream(engine_request, tenant.tenant_id, deadline_s, arrived_s, model):
                if first_token_s is None and event.delta.token_ids:
                    first_token_s = time.perf_counter() - arrived_s
                if event.HasField("final"):
                    reason = chat_pb2.FinishReason.Name(event.final.finish_reason).removeprefix("FINISH_REASON_")
                    set_response_attributes(span, request_id, model, [reason.lower()], [event.final], first_token_s)
                yield event
        finally:
            self.admission.release(tenant)

    async def GetModelInfo(
        self, request: chat_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> chat_pb2.GetModelInfoResponse:
        self._authenticate(context)
        if self._model_info is not None and time.monotonic() < self._model_info_expires_s:
            return chat_pb2.GetModelInfoResponse(model=self._model_info)
        last_error = "no engine is serving"
        for handle in sorted(self.pool.handles(), key=lambda h: (not h.accepting, h.num_inflight)):
            if not handle.accepting:
                break
            try:
                response = await handle.stub.GetModelInfo(engine_pb2.GetModelInfoRequest(),
                                                          timeout=_MODEL_INFO_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                last_error = f"engine {handle.engine_id}: {exc.code().name}"
                continue
            self._model_info = response.model
            self._model_info_expires_s = time.monotonic() + self.model_info_ttl_s
            return chat_pb2.GetModelInfoResponse(model=response.model)
        raise Unavailable(f"GetModelInfo: {last_error}")
