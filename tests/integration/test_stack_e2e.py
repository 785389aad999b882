"""The whole stack as real OS processes: kvstore, engine (synthetic model), gateway.

One Generate call through the gateway crosses all three processes; the test finds one trace id with
parent/child spans across them, and JSON log lines in each service that carry that trace id.
"""

import json
import time

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service

API_KEY = "e2e-test-key"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stack")
    spans = tmp / "spans.jsonl"
    tenants = tmp / "tenants.json"
    tenants.write_text(json.dumps({"tenants": [{"tenant_id": "t1", "api_key": API_KEY, "namespace_salt": "t1-salt"}]}))
    common = ["--port", "0", "--metrics-port", "0", "--log-json", "true", "--trace-file", str(spans)]
    procs = []
    try:
        kv = start_service("kvstore", [*common, *INSECURE_LOOPBACK_FLAGS], log_path=tmp / "kvstore.log")
        procs.append(kv)
        engine = start_service(
            "engine",
            [
                *INSECURE_LOOPBACK_FLAGS,
                *common,
                "--model",
                "synthetic-tiny",
                "--engine-id",
                "e0",
                "--kvstore-target",
                kv.address,
            ],
            log_path=tmp / "engine.log",
        )
        procs.append(engine)
        gateway = start_service(
            "gateway",
            [*common, *INSECURE_LOOPBACK_FLAGS, "--engines", f"e0={engine.address}", "--tenants-file", str(tenants)],
            log_path=tmp / "gateway.log",
        )
        procs.append(gateway)
        yield {"kvstore": kv, "engine": engine, "gateway": gateway, "spans": spans, "tmp": tmp}
    finally:
        for p in reversed(procs):
            p.stop()


def _list_services(address):
    with grpc.insecure_channel(address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        return {s.name for r in responses for s in r.list_services_response.service}


def test_reflection_lists_each_services_api(stack):
    assert "salon.kvstore.v1.KVStoreService" in _list_services(stack["kvstore"].address)
    assert "salon.engine.v1.EngineService" in _list_services(stack["engine"].address)
    assert "salon.chat.v1.ChatService" in _list_services(stack["gateway"].address)
    for name in ("kvstore", "engine", "gateway"):
        assert "grpc.health.v1.Health" in _list_services(stack[name].address)


def _generate(address, conversation_id):
    request = chat_pb2.GenerateRequest(
        conversation_id=conversation_id,
        character=chat_pb2.Character(name="Ada", definition="Ada answers briefly."),
        dialogue=chat_pb2.Dialogue(
            messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, author="u", text="Tell me about the sea. " * 8)]
        ),
        sampling=chat_pb2.SamplingParams(max_new_tokens=6),
    )
    with grpc.insecure_channel(address) as ch:
        events = list(
            chat_pb2_grpc.ChatServiceStub(ch).Generate(
                request, metadata=(("authorization", f"Bearer {API_KEY}"),), timeout=120
            )
        )
    return events


def _spans(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_one_call_crosses_all_three_processes_in_one_trace(stack):
    events = _generate(stack["gateway"].address, "conv-trace-1")
    assert events[-1].HasField("final") and events[-1].final.engine_id == "e0"
    assert sum(len(e.delta.token_ids) for e in events if e.HasField("delta")) == events[-1].final.usage.generated_tokens

    deadline = time.monotonic() + 20
    while True:
        spans = _spans(stack["spans"])
        root = [
            s
            for s in spans
            if s["service"] == "salon-gateway" and s["kind"] == "SERVER" and s["name"].endswith("ChatService/Generate")
        ]
        trace_id = root[-1]["trace_id"] if root else None
        in_trace = [s for s in spans if s["trace_id"] == trace_id]
        services = {s["service"] for s in in_trace}
        if {"salon-gateway", "salon-engine", "salon-kvstore"} <= services or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {"salon-gateway", "salon-engine", "salon-kvstore"} <= services, services
    by_id = {s["span_id"]: s for s in in_trace}

    def ancestors(span):
        chain = []
        while span.get("parent_span_id") in by_id:
            span = by_id[span["parent_span_id"]]
            chain.append(span["service"])
        return chain

    engine_server = [s for s in in_trace if s["service"] == "salon-engine" and s["kind"] == "SERVER"]
    assert engine_server and "salon-gateway" in ancestors(engine_server[0])
    kv_server = [s for s in in_trace if s["service"] == "salon-kvstore" and s["kind"] == "SERVER"]
    assert kv_server and {"salon-engine", "salon-gateway"} <= set(ancestors(kv_server[0]))

    for name in ("gateway", "engine", "kvstore"):
        lines = [
            json.loads(line) for line in (stack["tmp"] / f"{name}.log").read_text().splitlines() if line.startswith("{")
        ]
        assert any(rec.get("trace_id") == trace_id for rec in lines), f"no {name} log line carries {trace_id}"
