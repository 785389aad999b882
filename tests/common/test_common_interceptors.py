"""The server interceptors every service runs (the tracing one, then salon's), on a real grpc.aio server on
loopback: a SalonError reaches the client as its status, message and trailing metadata, in unary and streaming
handlers (after responses already sent, too); its span carries the status code (an error status where the
semantic conventions call the code the server's: UNAVAILABLE, not INVALID_ARGUMENT) but no exception event
(formatting a traceback per refused request cost the event loop milliseconds). A bug is answered INTERNAL
without its internals, and its span keeps the exception."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from salon.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from salon.common.interceptors import ServiceInterceptor

SERVICE = "probe.v1.Probe"


def _identity(data: bytes) -> bytes:
    return data


async def _refuse(request: bytes, context) -> bytes:
    raise InvalidArgument(f"name: {request.decode()!r} is not a name")


async def _stream_then_refuse(request: bytes, context):
    yield b"first"
    raise ResourceExhausted("queue: full", retry_after_ms=1500)


async def _restarting(request: bytes, context) -> bytes:
    raise Unavailable("the engine is restarting")


async def _bug(request: bytes, context) -> bytes:
    raise KeyError("a secret of the server")


def _handlers() -> grpc.GenericRpcHandler:
    kw = {"request_deserializer": _identity, "response_serializer": _identity}
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Refuse": grpc.unary_unary_rpc_method_handler(_refuse, **kw),
            "StreamThenRefuse": grpc.unary_stream_rpc_method_handler(_stream_then_refuse, **kw),
            "Restarting": grpc.unary_unary_rpc_method_handler(_restarting, **kw),
            "Bug": grpc.unary_unary_rpc_method_handler(_bug, **kw),
        },
    )


async def _calls(exporter: InMemorySpanExporter) -> dict:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = grpc.aio.server(
        interceptors=[aio_server_interceptor(tracer_provider=provider), ServiceInterceptor("probe")]
    )
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    seen = {}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            kw = {"request_serializer": _identity, "response_deserializer": _identity}
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await channel.unary_unary(f"/{SERVICE}/Refuse", **kw)(b"7up")
            seen["Refuse"] = refused.value
            call = channel.unary_stream(f"/{SERVICE}/StreamThenRefuse", **kw)(b"")
            received = []
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for message in call:
                    received.append(message)
            seen["StreamThenRefuse"] = refused.value
            seen["received"] = received
            with pytest.raises(grpc.aio.AioRpcError) as restarting:
                await channel.unary_unary(f"/{SERVICE}/Restarting", **kw)(b"")
            seen["Restarting"] = restarting.value
            with pytest.raises(grpc.aio.AioRpcError) as bug:
                await channel.unary_unary(f"/{SERVICE}/Bug", **kw)(b"")
            seen["Bug"] = bug.value
    finally:
        await server.stop(None)
    return seen


def test_refusals_reach_the_client_and_their_spans_hold_no_exception():
    exporter = InMemorySpanExporter()
    seen = asyncio.run(_calls(exporter))

    refused = seen["Refuse"]
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == "name: '7up' is not a name"
    streamed = seen["StreamThenRefuse"]
    assert seen["received"] == [b"first"]
    assert streamed.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert streamed.details() == "queue: full"
    assert ("retry-after-ms", "1500") in tuple(streamed.trailing_metadata())
    assert seen["Restarting"].code() == grpc.StatusCode.UNAVAILABLE
    assert seen["Restarting"].details() == "the engine is restarting"
    bug = seen["Bug"]
    assert bug.code() == grpc.StatusCode.INTERNAL
    assert bug.details() == "internal error (KeyError); see the server log"

    spans = {span.name.rsplit("/", 1)[-1]: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"Refuse", "StreamThenRefuse", "Restarting", "Bug"}
    for name, code, status in (
        ("Refuse", grpc.StatusCode.INVALID_ARGUMENT, StatusCode.UNSET),
        ("StreamThenRefuse", grpc.StatusCode.RESOURCE_EXHAUSTED, StatusCode.UNSET),
        ("Restarting", grpc.StatusCode.UNAVAILABLE, StatusCode.ERROR),
    ):
        span = spans[name]
        assert span.status.status_code is status, name
        assert span.attributes["rpc.grpc.status_code"] == code.value[0], name
        assert span.events == (), (name, [e.name for e in span.events])
    assert spans["Restarting"].status.description == "StatusCode.UNAVAILABLE:the engine is restarting"
    assert spans["Bug"].status.status_code is StatusCode.ERROR
    assert {e.name for e in spans["Bug"].events} == {"exception"}
