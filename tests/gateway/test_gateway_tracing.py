"""Trace sampling through the gateway, with real processes: one engine behind two gateways, one
recording every new trace (--trace-sample-ratio 1), one recording none (0). The engine has no ratio
of its own: it follows the decision the gateway passed on."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gateway_helpers import ACME_KEY, auth, chat_request, chat_stub, collect, start_gateway, write_tenants

from salon.common.config import parse_config
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service
from salon.common.tracing import ratio_sampler
from salon.gateway.config import GatewayConfig

CHAT_GENERATE = "/salon.chat.v1.ChatService/Generate"
ENGINE_GENERATE = "/salon.engine.v1.EngineService/Generate"


def test_ratio_flag_and_env_reach_the_server_config() -> None:
    assert parse_config(GatewayConfig, ["--trace-sample-ratio", "0.05"], environ={}).server.trace_sample_ratio == 0.05
    env = {"SALON_GATEWAY_TRACE_SAMPLE_RATIO": "0.25"}
    assert parse_config(GatewayConfig, [], env_prefix="SALON_GATEWAY_", environ=env).server.trace_sample_ratio == 0.25
    assert parse_config(GatewayConfig, [], environ={}).server.trace_sample_ratio is None


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_ratio_outside_zero_one_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError, match="trace_sample_ratio"):
        ratio_sampler(ratio)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracing")
    tenants = write_tenants(tmp / "tenants.json")
    procs = []
    try:
        engine = start_service(
            "engine",
            [
                *INSECURE_LOOPBACK_FLAGS,
                "--port",
                "0",
                "--model",
                "synthetic-tiny",
                "--engine-id",
                "e0",
                "--kv-cache-bytes",
                str(16 << 20),
                "--log-json",
                "true",
                "--trace-file",
                str(tmp / "engine.spans.jsonl"),
            ],
            log_path=tmp / "engine.log",
            timeout_s=180,
        )
        procs.append(engine)
        gateways = {}
        for name, ratio in (("all", "1"), ("none", "0")):
            gateways[name] = start_gateway(
                [("e0", engine.address)],
                tenants,
                tmp,
                name=f"gateway-{name}",
                extra=[
                    "--log-json",
                    "true",
                    "--trace-sample-ratio",
                    ratio,
                    "--trace-file",
                    str(tmp / f"gateway-{name}.spans.jsonl"),
                ],
            )
            procs.append(gateways[name])
        yield {"tmp": tmp, "engine": engine, **gateways}
    finally:
        for proc in reversed(procs):
            proc.stop()


def _generate(gateway, conversation_id: str) -> None:
    channel, stub = chat_stub(gateway)
    with channel:
        _tokens, _text, final = collect(
            stub.Generate(chat_request(conversation_id, max_new_tokens=3), metadata=auth(ACME_KEY), timeout=60)
        )
    assert final is not None


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def _wait_for(find, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        found = find()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _access_line(log: Path, method: str, conversation_id: str | None = None) -> dict | None:
    return next(
        (
            r
            for r in _records(log)
            if r.get("event") == "rpc_finished"
            and r.get("rpc_method") == method
            and (conversation_id is None or r.get("conversation_id") == conversation_id)
        ),
        None,
    )


def _sampled_control(stack) -> None:
    """The positive control of an absence check, run after the requests it covers: a request through the recording
    gateway. Its gateway SERVER span is in the file as soon as the call returns (a span is written as it ends, and
    the server span ends before the call's status is sent), which is what lets the unsampled gateway's empty file
    be checked right after its calls returned; and the engine writes its span, after any span of the earlier
    requests (spans are written in the order they end)."""
    tmp = stack["tmp"]
    gateway_file = tmp / "gateway-all.spans.jsonl"
    before = {s["trace_id"] for s in _records(gateway_file) if s["kind"] == "SERVER"}
    _generate(stack["all"], f"trace-control-{len(before)}")
    new = [s for s in _records(gateway_file) if s["kind"] == "SERVER" and s["trace_id"] not in before]
    assert [s["name"] for s in new] == [CHAT_GENERATE], "the recording gateway had not written its span"
    engine_span = _wait_for(
        lambda: [s for s in _records(tmp / "engine.spans.jsonl") if s["trace_id"] == new[0]["trace_id"]]
    )
    assert engine_span, "the engine wrote no span of a sampled request"


def test_sampled_request_spans_chain_gateway_server_client_engine(stack) -> None:
    _generate(stack["all"], "trace-sampled")
    tmp = stack["tmp"]

    def chain():
        gateway_spans = _records(tmp / "gateway-all.spans.jsonl")
        server = next((s for s in gateway_spans if s["kind"] == "SERVER" and s["name"] == CHAT_GENERATE), None)
        if server is None:
            return None
        client = next(
            (
                s
                for s in gateway_spans
                if s["kind"] == "CLIENT" and s["name"] == ENGINE_GENERATE and s["trace_id"] == server["trace_id"]
            ),
            None,
        )
        engine = next(
            (
                s
                for s in _records(tmp / "engine.spans.jsonl")
                if s["kind"] == "SERVER" and s["name"] == ENGINE_GENERATE and s["trace_id"] == server["trace_id"]
            ),
            None,
        )
        return (server, client, engine) if client and engine else None

    found = _wait_for(chain)
    assert found, "no gateway SERVER -> gateway CLIENT -> engine SERVER spans in one trace"
    server, client, engine = found
    assert client["parent_span_id"] == server["span_id"]
    assert engine["parent_span_id"] == client["span_id"]
    assert client["status"] != "ERROR" and client["attributes"]["rpc.grpc.status_code"] == "0"
    assert client["attributes"]["rpc.service"] == "salon.engine.v1.EngineService"
    assert client["attributes"]["rpc.method"] == "Generate"


def test_unsampled_request_records_no_span_anywhere_but_keeps_its_trace_id(stack) -> None:
    tmp = stack["tmp"]
    _generate(stack["none"], "trace-unsampled")
    gateway_line = _wait_for(lambda: _access_line(tmp / "gateway-none.log", CHAT_GENERATE, "trace-unsampled"))
    assert gateway_line and gateway_line.get("trace_id"), "the gateway's access line carries no trace id"
    trace_id = gateway_line["trace_id"]
    # The engine logged under the gateway's trace id: the (unsampled) context was passed on.
    engine_line = _wait_for(
        lambda: next(
            (
                r
                for r in _records(tmp / "engine.log")
                if r.get("event") == "rpc_finished" and r.get("trace_id") == trace_id
            ),
            None,
        )
    )
    assert engine_line and engine_line["rpc_method"] == ENGINE_GENERATE
    _sampled_control(stack)
    assert _records(tmp / "gateway-none.spans.jsonl") == []
    assert [s for s in _records(tmp / "engine.spans.jsonl") if s["trace_id"] == trace_id] == []


def test_the_public_port_ignores_inbound_trace_context_and_baggage(stack) -> None:
    """A client cannot force its request to be recorded (sampled flag 01) on a gateway that records
    none, nor continue its own trace: the gateway starts a trace of its own for every request."""
    tmp = stack["tmp"]
    client_trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    metadata = (
        *auth(ACME_KEY),
        ("traceparent", f"00-{client_trace_id}-00f067aa0ba902b7-01"),
        ("baggage", "tenant=someone-else"),
    )
    channel, stub = chat_stub(stack["none"])
    with channel:
        _tokens, _text, final = collect(
            stub.Generate(chat_request("trace-forced", max_new_tokens=3), metadata=metadata, timeout=60)
        )
    assert final is not None
    line = _wait_for(lambda: _access_line(tmp / "gateway-none.log", CHAT_GENERATE, "trace-forced"))
    assert line and line["trace_id"] != client_trace_id
    _sampled_control(stack)
    assert _records(tmp / "gateway-none.spans.jsonl") == []
    assert [
        s for s in _records(tmp / "engine.spans.jsonl") if s["trace_id"] in (client_trace_id, line["trace_id"])
    ] == []


def test_inject_only_propagator_reads_nothing_and_writes_only_trace_context() -> None:
    from opentelemetry import baggage, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    from salon.common.tracing import InjectOnlyPropagator

    propagator = InjectOnlyPropagator()
    carrier = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "baggage": "k=v"}
    context = propagator.extract(carrier)
    assert not trace.get_current_span(context).get_span_context().is_valid
    assert baggage.get_all(context) == {}
    span = NonRecordingSpan(
        SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, False, TraceFlags(TraceFlags.SAMPLED))
    )
    out: dict[str, str] = {}
    propagator.inject(out, context=baggage.set_baggage("k", "v", trace.set_span_in_context(span)))
    assert set(out) == {"traceparent"}
