"""The server interceptor every service runs: caller's role, typed errors -> gRPC status, request
context, RPC metrics.

With an AccessPolicy (internal services in mtls mode), each method's allowed roles are resolved once
per method and checked before the handler runs: a caller without one gets UNAUTHENTICATED.

Servicers stay thin: they raise `SalonError`s (salon/common/errors.py) and this interceptor turns
them into the status code, message and trailing metadata the client sees. Anything else that escapes a
handler is a bug: it is logged with its traceback and answered INTERNAL without leaking internals.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from salon.common.errors import InvalidArgument, SalonError
from salon.common.logging import get_logger
from salon.common.metrics import RPC_DURATION_SECONDS, RPC_REQUESTS
from salon.common.peer_identity import AccessPolicy, require_role

REQUEST_ID_METADATA_KEY = "x-request-id"

# Polled constantly by load balancers and peers: counted in the metrics, not written to the access log.
_QUIET_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

log = get_logger(__name__)


class _Outcome:
    """The status code an RPC ended with, for the metrics."""

    __slots__ = ("code", "ended")

    def __init__(self) -> None:
        self.code = grpc.StatusCode.OK
        self.ended = False  # counted and logged (before an abort sends the status: a client that sees the
        # status then reads the metrics finds its RPC counted)


class _MethodMetrics:
    """One method's RPC metric children, bound once (labels() costs a lock and a dict lookup per call)."""

    __slots__ = ("_service", "_method", "duration_s", "_requests_by_code")

    def __init__(self, service: str, method: str) -> None:
        self._service = service
        self._method = method
        self.duration_s = RPC_DURATION_SECONDS.labels(service, method)
        self._requests_by_code: dict[grpc.StatusCode, Any] = {}

    def requests(self, code: grpc.StatusCode):
        child = self._requests_by_code.get(code)
        if child is None:
            child = self._requests_by_code[code] = RPC_REQUESTS.labels(self._service, self._method, code.name)
        return child


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, service: str, policy: AccessPolicy | None = None) -> None:
        self._service = service
        self._policy = policy
        # method -> (the handler it was built for, the wrapped handler). A method's handler is one
        # object for the server's life, so each is wrapped once; a new handler object replaces the entry.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped_handler = self._wrap_handler(handler, method)
        self._wrapped[method] = (handler, wrapped_handler)
        return wrapped_handler

    def _wrap_handler(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        kind, factory = _handler_kind(handler)
        behavior = getattr(handler, kind)
        method_metrics = _MethodMetrics(self._service, method)
        access_logged = not method.startswith(_QUIET_SERVICES)
        roles = self._policy.roles_for(method) if self._policy is not None else None
        # Streaming handlers are async generators, or coroutines that write with context.write
        # (grpc.health.v1's Watch): those are wrapped like unary ones, they return when done.
        if kind in ("unary_unary", "stream_unary") or not inspect.isasyncgenfunction(behavior):
            wrapped = _wrap_unary(behavior, method, method_metrics, access_logged, roles)
        else:
            wrapped = _wrap_stream(behavior, method, method_metrics, access_logged, roles)
        deserializer = handler.request_deserializer
        if kind in ("unary_unary", "unary_stream") and deserializer is not None:
            deserializer = _tolerant(deserializer)
        return factory(
            wrapped,
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )


def _request_id(context: grpc.aio.ServicerContext) -> str:
    """The caller's x-request-id (the last one sent), else a new id."""
    request_id = None
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_METADATA_KEY and isinstance(value, str):
            request_id = value
    return request_id or uuid.uuid4().hex


def _begin(method: str, context: grpc.aio.ServicerContext) -> float:
    structlog.contextvars.bind_contextvars(rpc_method=method, request_id=_request_id(context))
    return time.perf_counter()


def _end(started: float, outcome: _Outcome, method_metrics: _MethodMetrics, access_logged: bool) -> None:
    if outcome.ended:
        return
    outcome.ended = True
    elapsed_s = time.perf_counter() - started
    method_metrics.requests(outcome.code).inc()
    method_metrics.duration_s.observe(elapsed_s)
    if access_logged:
        log.info("rpc_finished", code=outcome.code.name, duration_ms=round(elapsed_s * 1000.0, 3))


def _wrap_unary(
    behavior: Callable[..., Awaitable[Any]],
    method: str,
    method_metrics: _MethodMetrics,
    access_logged: bool,
    roles: frozenset[str] | None,
):
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = _begin(method, context)
        outcome = _Outcome()
        try:
            if roles is not None:
                require_role(context, roles, method)
            _check_decoded(request)
            return await behavior(request, context)
        except BaseException as exc:  # noqa: BLE001 - mapped below, re-raised when not ours
            if not await _handle(exc, context, outcome, lambda: _end(started, outcome, method_metrics, access_logged)):
                raise
            return None  # the status set stands; grpc sends no message with it
        finally:
            _end(started, outcome, method_metrics, access_logged)

    return wrapped


def _wrap_stream(
    behavior: Callable[..., AsyncIterator[Any]],
    method: str,
    method_metrics: _MethodMetrics,
    access_logged: bool,
    roles: frozenset[str] | None,
):
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        started = _begin(method, context)
        outcome = _Outcome()
        try:
            if roles is not None:
                require_role(context, roles, method)
            _check_decoded(request)
            async for response in behavior(request, context):
                yield response
        except BaseException as exc:  # noqa: BLE001
            if not await _handle(exc, context, outcome, lambda: _end(started, outcome, method_metrics, access_logged)):
                raise
        finally:
            _end(started, outcome, method_metrics, access_logged)

    return wrapped


class _Undecodable:
    """A request whose bytes did not parse (e.g. a string field holding invalid UTF-8). grpc itself
    would answer UNKNOWN with the parser's exception; the handler wrapper answers INVALID_ARGUMENT."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return _Undecodable(str(exc))

    return deserialize


def _check_decoded(request: Any) -> None:
    if isinstance(request, _Undecodable):
        raise InvalidArgument(f"request: does not parse ({request.error}); string fields must be valid UTF-8")


async def _handle(
    exc: BaseException, context: grpc.aio.ServicerContext, outcome: _Outcome, end: Callable[[], None]
) -> bool:
    """Record the outcome and turn the exception into a status, calling `end` (the RPC's metrics and access log)
    before the status is sent. A SalonError is the caller's answer, not a fault: its status is set on the context
    and True returned (the handler ends without raising, so the tracing interceptor records no exception: a
    formatted traceback per refused request cost the event loop milliseconds). Anything else is a bug: answered
    INTERNAL by an abort (raises AbortError), its traceback logged and on the span. False: re-raise `exc`."""
    if isinstance(exc, asyncio.CancelledError):
        outcome.code = grpc.StatusCode.CANCELLED
        return False
    if isinstance(exc, grpc.aio.AbortError):
        code = context.code()
        outcome.code = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
        return False
    if isinstance(exc, SalonError):
        outcome.code = exc.code
        log.info("request_failed", code=exc.code.name, error=exc.message)
        end()
        context.set_code(exc.code)
        context.set_details(exc.message)
        context.set_trailing_metadata(exc.trailing_metadata())
        return True
    if isinstance(exc, Exception):
        outcome.code = grpc.StatusCode.INTERNAL
        log.exception("unhandled_error", error_type=type(exc).__name__)
        end()
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the server log")
    return False


def _handler_kind(handler: grpc.RpcMethodHandler):
    if handler.unary_unary:
        return "unary_unary", grpc.unary_unary_rpc_method_handler
    if handler.unary_stream:
        return "unary_stream", grpc.unary_stream_rpc_method_handler
    if handler.stream_unary:
        return "stream_unary", grpc.stream_unary_rpc_method_handler
    return "stream_stream", grpc.stream_stream_rpc_method_handler
