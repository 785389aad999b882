"""salon.chat.v1.ChatService: authenticate, validate, admit, then hand the reply to the dispatcher.

Before anything reaches an engine:
  * the tenant's API key decides its namespace salt, and (with a grant key) a namespace grant that
    lets the engines store KV in that namespace (salon/common/namespace_grant.py);
  * the request's model resolves to a served model's pool ("" = the default; NOT_FOUND naming the
    served models otherwise, model_pools.py), and the reply is routed within that pool;
  * a prompt whose count of messages or ids cannot fit the model's context (known from
    GetModelInfo) is refused here, before it is copied and forwarded (salon/common/prompt_bounds.py);
  * tool_choice REQUIRED / FUNCTION become the JSON-schema constraint of the reply's calls, and a reply to a
    request with tools is parsed into TokenDelta.content / tool_calls and GenerateFinal.tool_calls, as the HTTP
    API parses it (tool_choice.py, tool_call_events.py);
  * the engine's request id is always generated here: a client's request_id or x-request-id is kept
    for its logs and echoed in GenerateFinal.request_id, never used as the engine's id (two tenants'
    ids would collide there).

DeleteConversation fans out to every known engine, then forgets the dialogue's session entry and its stored
responses (sessions.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import structlog
from opentelemetry import trace

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.api.engine.v1 import engine_pb2
from salon.common.errors import OutOfRange, ResourceExhausted, Unauthenticated, Unavailable
from salon.common.logging import bind_request_context, get_logger
from salon.common.prompt_bounds import prompt_count_problem
from salon.gateway import metrics
from salon.gateway.dispatch import Dispatcher
from salon.gateway.genai_span import set_request_attributes, set_response_attributes
from salon.gateway.grants import Grants
from salon.gateway.model_pools import ModelPools
from salon.gateway.ratelimit import AdmissionControl
from salon.gateway.tenants import Tenant, TenantTable
from salon.gateway.tool_call_events import ToolCallEvents
from salon.gateway.tool_choice import apply_tool_choice
from salon.gateway.types import dialogue_key
from salon.gateway.validate import validate_conversation_id, validate_generate

log = get_logger(__name__)

AUTHORIZATION_METADATA_KEY = "authorization"
_DELETE_TIMEOUT_S = 10.0


def to_engine_request(
    request: chat_pb2.GenerateRequest, request_id: str, namespace_salt: str, grant: bytes = b""
) -> engine_pb2.GenerateRequest:
    engine_request = engine_pb2.GenerateRequest(
        request_id=request_id,
        conversation_id=request.conversation_id,
        namespace_salt=namespace_salt,
        namespace_grant=grant,
        priority=request.priority,
        cache_salt=request.cache_salt,
        chat_template_kwargs_json=request.chat_template_kwargs_json,
    )
    if request.HasField("character"):
        engine_request.character.CopyFrom(request.character)
    if request.HasField("sampling"):
        engine_request.sampling.CopyFrom(request.sampling)
    engine_request.tools.extend(request.tools)
    if request.HasField("tool_choice"):
        engine_request.tool_choice.CopyFrom(request.tool_choice)
    if request.HasField("parallel_tool_calls"):
        engine_request.parallel_tool_calls = request.parallel_tool_calls
    which = request.WhichOneof("context")
    if which == "dialogue":
        engine_request.dialogue.CopyFrom(request.dialogue)
    elif which == "text":
        engine_request.text = request.text
    else:
        engine_request.tokens.CopyFrom(request.tokens)
    return engine_request


class ChatServicer(chat_pb2_grpc.ChatServiceServicer):
    def __init__(
        self,
        tenants: TenantTable,
        admission: AdmissionControl,
        dispatcher: Dispatcher,
        pools: ModelPools,
        grants: Grants,
    ):
        self.tenants = tenants
        self.admission = admission
        self.dispatcher = dispatcher
        self.pools = pools
        self.pool = pools.pool
        self.grants = grants

    def _grant(self, tenant: Tenant) -> bytes:
        return self.grants.for_tenant(tenant)

    def _check_prompt_counts(self, request: chat_pb2.GenerateRequest, model: str) -> None:
        """OUT_OF_RANGE when the counts alone cannot fit the model's context (once it is known)."""
        info = self.pools.cached_info(model)
        if info is None or not info.max_context_tokens:
            return  # the engine applies the same bound
        problem = prompt_count_problem(request, info.max_context_tokens)
        if problem is not None:
            metrics.REFUSALS.labels(reason="invalid").inc()
            raise OutOfRange(problem)

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
            replies = apply_tool_choice(request)
            model = self.pools.resolve(request.model)
        except Exception:
            metrics.REFUSALS.labels(reason="invalid").inc()
            raise
        refusal = self.admission.admit(tenant, time.monotonic())
        if refusal is not None:
            metrics.REFUSALS.labels(reason=refusal.reason).inc()
            raise ResourceExhausted(refusal.message, refusal.retry_after_ms)
        try:
            self._check_prompt_counts(request, model)
            # The caller's id (field, else x-request-id) is for its own correlation only.
            client_request_id = request.request_id or structlog.contextvars.get_contextvars().get("request_id") or ""
            request_id = uuid.uuid4().hex
            bind_request_context(
                request_id=request_id,
                client_request_id=client_request_id or None,
                conversation_id=request.conversation_id,
                tenant=tenant.tenant_id,
            )
            remaining_s = context.time_remaining()
            deadline_s = None if remaining_s is None else time.monotonic() + remaining_s
            engine_request = to_engine_request(request, request_id, tenant.namespace_salt, self._grant(tenant))
            span = trace.get_current_span()
            operation = "text_completion" if request.WhichOneof("context") != "dialogue" else "chat"
            set_request_attributes(span, operation, model, request.sampling)
            first_token_s = None
            tool_events = ToolCallEvents(replies) if replies is not None else None
            async for event in self.dispatcher.stream(
                engine_request,
                tenant.tenant_id,
                deadline_s,
                arrived_s,
                model,
                reply_request_id=client_request_id or request_id,
            ):
                if first_token_s is None and event.delta.token_ids:
                    first_token_s = time.perf_counter() - arrived_s
                for out in tool_events.events(event) if tool_events is not None else (event,):
                    if out.HasField("final"):
                        reason = chat_pb2.FinishReason.Name(out.final.finish_reason).removeprefix("FINISH_REASON_")
                        set_response_attributes(span, request_id, model, [reason.lower()], [out.final], first_token_s)
                    yield out
        finally:
            self.admission.release(tenant)

    async def DeleteConversation(
        self, request: chat_pb2.DeleteConversationRequest, context: grpc.aio.ServicerContext
    ) -> chat_pb2.DeleteConversationResponse:
        tenant = self._authenticate(context)
        validate_conversation_id(request.conversation_id)
        refusal = self.admission.admit(tenant, time.monotonic())
        if refusal is not None:
            metrics.REFUSALS.labels(reason=refusal.reason).inc()
            raise ResourceExhausted(refusal.message, refusal.retry_after_ms)
        try:
            bind_request_context(conversation_id=request.conversation_id, tenant=tenant.tenant_id)
            handles = self.pool.handles()
            if not handles:
                raise Unavailable("DeleteConversation: no engine is known; retry shortly")
            engine_request = engine_pb2.DeleteConversationRequest(
                conversation_id=request.conversation_id,
                namespace_salt=tenant.namespace_salt,
                namespace_grant=self._grant(tenant),
            )
            results = await asyncio.gather(
                *(h.stub.DeleteConversation(engine_request, timeout=_DELETE_TIMEOUT_S) for h in handles),
                return_exceptions=True,
            )
            session_ok = await self.dispatcher.sessions.delete(dialogue_key(tenant.tenant_id, request.conversation_id))
        finally:
            self.admission.release(tenant)
        failed = [
            f"{h.engine_id or h.address}: {_error_name(r)}"
            for h, r in zip(handles, results)
            if isinstance(r, BaseException)
        ]
        if not session_ok:
            failed.append("session table: unreachable")
        if failed:
            log.warning("delete_incomplete", failed=failed)
            raise Unavailable(
                f"DeleteConversation: not confirmed by {', '.join(failed)}; retry (deleting is idempotent)"
            )
        done = [r for r in results if not isinstance(r, BaseException)]
        log.info("conversation_deleted", engines=len(done))
        return chat_pb2.DeleteConversationResponse(
            engines=len(done),
            device_blocks_dropped=sum(r.device_blocks_dropped for r in done),
            host_blocks_dropped=sum(r.host_blocks_dropped for r in done),
        )

    async def GetModelInfo(
        self, request: chat_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> chat_pb2.GetModelInfoResponse:
        self._authenticate(context)
        return chat_pb2.GetModelInfoResponse(model=await self.pools.info(self.pools.resolve(request.model)))

    async def ListModels(
        self, request: chat_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> chat_pb2.ListModelsResponse:
        self._authenticate(context)
        return await self.pools.list_models()


def _error_name(error: BaseException) -> str:
    return error.code().name if isinstance(error, grpc.aio.AioRpcError) else type(error).__name__
