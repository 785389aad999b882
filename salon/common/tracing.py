"""OpenTelemetry tracing shared by every service.

W3C trace context travels in gRPC metadata through gateway -> engine -> kvstore: the server
interceptor continues the caller's trace and the client interceptors (see channel.py) pass it on.
The exporter follows the standard OTEL_* variables: OTLP when OTEL_EXPORTER_OTLP_ENDPOINT (or
..._TRACES_ENDPOINT) is set and OTEL_TRACES_EXPORTER is not "none", over gRPC or, with
OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL=http/protobuf, over HTTP; otherwise spans are still made (log
lines carry their ids) but not exported. OTEL_SERVICE_NAME names the service (default `salon-<svc>`). `trace_file` adds
a JSON-lines file exporter, one span
per line, used by the tests and for local debugging.

Trust: only the W3C trace context propagates, never baggage. The internal services continue the
context their (authenticated) caller sent. The public port does not: a client's `traceparent`,
`tracestate` and `baggage` are ignored (extract_inbound=False installs InjectOnlyPropagator), so a
client can neither force its requests to be recorded nor smuggle values into the internal calls; every
public request starts a trace of its own, which the gateway passes on to the engines.

Sampling is parent-based behind the gateway: a call that arrives with a trace context keeps its
caller's decision, so a trace is either recorded in every service or in none. `sample_ratio` sets the share of
new traces (those started here) that are recorded; unset, the SDK's own choice applies
(OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, by default every trace). An unsampled request still
carries its trace id downstream (flag 00), so the services it reaches do not start traces of their own.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


class InjectOnlyPropagator(TextMapPropagator):
    """W3C trace context out, nothing in: what arrives on a public port starts a trace of its own."""

    def __init__(self) -> None:
        self._inner = TraceContextTextMapPropagator()

    def extract(
        self, carrier: CarrierT, context: otel_context.Context | None = None, getter: Getter = default_getter
    ) -> otel_context.Context:
        return context if context is not None else otel_context.Context()

    def inject(
        self, carrier: CarrierT, context: otel_context.Context | None = None, setter: Setter = default_setter
    ) -> None:
        self._inner.inject(carrier, context, setter)

    @property
    def fields(self) -> set[str]:
        return self._inner.fields


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span to a file as one JSON object per line."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            parent = span.parent
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "service": span.resource.attributes.get("service.name"),
                        "trace_id": format(span.context.trace_id, "032x"),
                        "span_id": format(span.context.span_id, "016x"),
                        "parent_span_id": format(parent.span_id, "016x") if parent else None,
                        "kind": span.kind.name,
                        "start_unix_ns": span.start_time,
                        "end_unix_ns": span.end_time,
                        "attributes": {k: str(v) for k, v in (span.attributes or {}).items()},
                        "status": span.status.status_code.name,
                    }
                )
            )
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def ratio_sampler(sample_ratio: float) -> ParentBased:
    """Follow the caller's decision; record `sample_ratio` of the traces that start here."""
    if not 0.0 <= sample_ratio <= 1.0:
        raise ValueError(f"trace_sample_ratio: must be within [0, 1], got {sample_ratio}")
    return ParentBased(TraceIdRatioBased(sample_ratio))


OTLP_PROTOCOLS = ("grpc", "http/protobuf")


def service_name(service: str, environ: Mapping[str, str]) -> str:
    """OTEL_SERVICE_NAME when set, else `salon-<service>`."""
    return environ.get("OTEL_SERVICE_NAME") or f"salon-{service}"


def otlp_exporter(environ: Mapping[str, str]):
    """The OTLP span exporter the standard variables ask for: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
    OTEL_EXPORTER_OTLP_PROTOCOL: `grpc` (the default) or `http/protobuf`. The exporter itself reads the
    endpoint, headers and timeout variables."""
    protocol = (
        (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc")
        .strip()
        .lower()
    )
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported (one of {', '.join(OTLP_PROTOCOLS)})")


def configure_tracing(
    service: str,
    trace_file: str | None = None,
    environ: Mapping[str, str] | None = None,
    sample_ratio: float | None = None,
    extract_inbound: bool = True,
) -> None:
    """Install the global tracer provider and propagator for this process. extract_inbound=False for a
    public port: inbound trace context and baggage are ignored."""
    environ = os.environ if environ is None else environ
    propagate.set_global_textmap(TraceContextTextMapPropagator() if extract_inbound else InjectOnlyPropagator())
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return
    sampler = None if sample_ratio is None else ratio_sampler(sample_ratio)
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name(service, environ)}), sampler=sampler
    )
    exporter_choice = environ.get("OTEL_TRACES_EXPORTER", "otlp").lower()
    endpoint_set = bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    if endpoint_set and exporter_choice != "none":
        provider.add_span_processor(BatchSpanProcessor(otlp_exporter(environ)))
    if trace_file:
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(trace_file)))
    trace.set_tracer_provider(provider)


def shutdown_tracing() -> None:
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)
