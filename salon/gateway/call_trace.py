"""The trace of one engine call, made on a channel without the client tracing interceptor.

The interceptor costs every call an extra task and two async-generator layers, sampled or not. Here
the work follows the sampling decision of the request being served:

    request sampled     a CLIENT span (named and attributed as the interceptor names them) is the
                        parent the engine sees; it ends when the call does, with its status code
    request unsampled   no span; the request's trace context is still passed on (flag 00), so the
                        engine keeps the decision instead of starting a trace of its own
    no trace context    nothing is sent (tracing off)
"""

from __future__ import annotations

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

_tracer = trace.get_tracer(__name__)


class CallTrace:
    """Start it just before the call; pass `metadata` with the call; `end` it once the call is over."""

    __slots__ = ("_span", "metadata")

    def __init__(self, method: str):
        request_span = trace.get_current_span()
        carrier: dict[str, str] = {}
        self._span: trace.Span | None = None
        if request_span.is_recording():
            service, _, name = method.lstrip("/").partition("/")
            self._span = _tracer.start_span(
                method,
                kind=SpanKind.CLIENT,
                attributes={
                    "rpc.system": "grpc",
                    "rpc.service": service,
                    "rpc.method": name,
                    "rpc.grpc.status_code": grpc.StatusCode.OK.value[0],
                },
            )
            propagate.inject(carrier, context=trace.set_span_in_context(self._span))
        elif request_span.get_span_context().is_valid:
            propagate.inject(carrier)
        # gRPC metadata for the call (None when there is nothing to pass on).
        self.metadata: tuple[tuple[str, str], ...] | None = tuple(carrier.items()) or None

    def end(self, code: grpc.StatusCode, details: str | None = None) -> None:
        if self._span is None:
            return
        if code != grpc.StatusCode.OK:
            self._span.set_attribute("rpc.grpc.status_code", code.value[0])
            self._span.set_status(Status(StatusCode.ERROR, details or code.name))
        self._span.end()
        self._span = None
