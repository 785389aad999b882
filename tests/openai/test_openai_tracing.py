"""Traces over OTLP/HTTP (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf) to a real OTLP/HTTP receiver:
OTEL_SERVICE_NAME is respected, a completion's spans carry the GenAI semantic-convention attributes
and TTFT on both fronts, the trace continues into the engine, and the public HTTP port starts its own
trace instead of continuing a client's `traceparent`."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service
from tests.hardening.hardening_stack import MODEL, stop_all
from tests.openai.openai_stack import KEY, TENANTS

INBOUND_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class Receiver(http.server.ThreadingHTTPServer):
    """POST /v1/traces bodies, parsed: (service name, span) pairs."""

    def __init__(self):
        self.spans: list[tuple[str, object]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    for rs in request.resource_spans:
                        name = next(a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
                        for ss in rs.scope_spans:
                            receiver.spans.extend((name, span) for span in ss.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def wait(self, predicate, timeout_s: float = 20.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if predicate(*s)]
            if found:
                return found
            time.sleep(0.1)
        with self.lock:
            names = [(n, s.name) for n, s in self.spans]
        raise AssertionError(f"no such span; received {names}")


def attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        kind = v.WhichOneof("value")
        out[a.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("otlp")
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_address[1]}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    env.pop("OTEL_SERVICE_NAME", None)
    (tmp / "tenants.json").write_text(json.dumps(TENANTS))
    procs = []
    try:
        engine = start_service(
            "engine",
            [
                "--port",
                "0",
                *INSECURE_LOOPBACK_FLAGS,
                "--model",
                MODEL,
                "--engine-id",
                "e0",
                "--kv-cache-bytes",
                str(16 << 20),
            ],
            log_path=tmp / "engine.log",
            env=env,
            timeout_s=180,
        )
        procs.append(engine)
        gateway = start_service(
            "gateway",
            [
                "--port",
                "0",
                *INSECURE_LOOPBACK_FLAGS,
                "--engines",
                f"e0={engine.address}",
                "--tenants-file",
                str(tmp / "tenants.json"),
                "--http-port",
                "0",
                "--grace-s",
                "1",
            ],
            log_path=tmp / "gateway.log",
            env={**env, "OTEL_SERVICE_NAME": "chat-front-under-test"},
            timeout_s=60,
        )
        procs.append(gateway)
        yield receiver, gateway
    finally:
        stop_all(reversed(procs))
        receiver.shutdown()


def test_http_completion_span_has_genai_attributes_and_ignores_inbound_traceparent(stack):
    receiver, gateway = stack
    port = gateway.extra_ports["http_port"]
    inbound = f"00-{INBOUND_TRACE_ID}-00f067aa0ba902b7-01"
    response = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        timeout=60,
        headers={"authorization": f"Bearer {KEY}", "traceparent": inbound, "baggage": "k=v"},
        json={
            "model": MODEL,
            "max_tokens": 5,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 3,
            "messages": [{"role": "user", "content": "Hello!"}],
        },
    )
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    ((service, span),) = receiver.wait(lambda n, s: s.name == f"chat {MODEL}")
    assert service == "chat-front-under-test"
    a = attrs(span)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.response.model"] == MODEL
    assert a["gen_ai.request.temperature"] == pytest.approx(0.5) and a["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert a["gen_ai.request.max_tokens"] == 5 and a["gen_ai.request.seed"] == 3
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 5
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert 0 < a["gen_ai.server.time_to_first_token"] < 60
    assert span.trace_id.hex() != INBOUND_TRACE_ID and not span.parent_span_id
    # The trace continues into the engine, which exports as salon-engine.
    engine_spans = receiver.wait(lambda n, s: n == "salon-engine" and s.trace_id == span.trace_id)
    assert any(s.name.endswith("EngineService/Generate") for _, s in engine_spans)


def test_grpc_generate_span_has_genai_attributes(stack):
    receiver, gateway = stack
    with grpc.insecure_channel(gateway.address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        request = chat_pb2.GenerateRequest(
            conversation_id="otlp-grpc",
            dialogue=chat_pb2.Dialogue(messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, text="Hi there")]),
            sampling=chat_pb2.SamplingParams(max_new_tokens=3, temperature=0),
        )
        finals = [
            e.final
            for e in stub.Generate(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=60)
            if e.HasField("final")
        ]
    spans = receiver.wait(
        lambda n, s: s.name.endswith("ChatService/Generate") and "gen_ai.usage.output_tokens" in attrs(s)
    )
    a = attrs(spans[-1][1])
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.usage.output_tokens"] == finals[0].usage.generated_tokens == 3
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["gen_ai.server.time_to_first_token"] > 0
