"""Every service's Prometheus series against the list in docs/metrics.md: after real traffic (HTTP and gRPC
turns, a cache hit, a kvstore put), each `salon_*` family a service exports is listed for that
service with its type and labels, every listed family is exported, latency histograms are in seconds,
and the turn's latencies carry the `model` label."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service
from tests.hardening.hardening_stack import MODEL, stop_all, wait_gateway_sees
from tests.openai.openai_stack import KEY, TENANTS

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
_ROW = re.compile(r"^\| `(salon_\w+)` \| (counter|gauge|histogram) \| ([^|]*) \| [^|]+ \|$")
_SECTION = re.compile(r"^## (every service|gateway|engine|kvstore) metrics$")


def readme_series() -> dict[str, dict[str, tuple[str, frozenset[str]]]]:
    """service -> series name -> (type, labels), from the metric tables of docs/metrics.md."""
    out: dict[str, dict[str, tuple[str, frozenset[str]]]] = {}
    service = None
    for line in METRICS_DOC.read_text().splitlines():
        if m := _SECTION.match(line):
            service = m.group(1)
            out[service] = {}
        elif service and (m := _ROW.match(line)):
            labels = frozenset(x.strip(" `") for x in m.group(3).split(",") if x.strip(" `-"))
            out[service][m.group(1)] = (m.group(2), labels)
    common = out.pop("every service")
    return {service: {**common, **series} for service, series in out.items()}


def scrape(port: int) -> dict[str, tuple[str, frozenset[str] | None]]:
    """series name (counters with _total) -> (type, label names, None when no sample yet)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("salon_"):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k not in ("le",)}
        out[name] = (family.type, frozenset(labels) if family.samples else None)
    return out


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory):
    yield from traffic_and_scrapes(tmp_path_factory.mktemp("metrics"))


def traffic_and_scrapes(tmp: Path):
    """Start kvstore, engine and gateway, run the traffic, yield each service's scrape, stop them."""
    (tmp / "tenants.json").write_text(json.dumps(TENANTS))
    procs = []
    try:
        kv = start_service(
            "kvstore",
            ["--port", "0", "--metrics-port", "0", "--capacity-bytes", str(64 << 20), *INSECURE_LOOPBACK_FLAGS],
            log_path=tmp / "kv.log",
        )
        procs.append(kv)
        engine = start_service(
            "engine",
            [
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--model",
                MODEL,
                "--engine-id",
                "e0",
                "--kv-cache-bytes",
                str(16 << 20),
                "--kvstore-target",
                kv.address,
                *INSECURE_LOOPBACK_FLAGS,
            ],
            log_path=tmp / "engine.log",
            timeout_s=180,
        )
        procs.append(engine)
        gateway = start_service(
            "gateway",
            [
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--engines",
                f"e0={engine.address}",
                "--tenants-file",
                str(tmp / "tenants.json"),
                "--http-port",
                "0",
                "--grace-s",
                "1",
                *INSECURE_LOOPBACK_FLAGS,
            ],
            log_path=tmp / "gateway.log",
            timeout_s=60,
        )
        procs.append(gateway)
        wait_gateway_sees(gateway, 1)
        import openai

        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{gateway.extra_ports['http_port']}/v1", api_key=KEY, max_retries=0
        )
        messages = [{"role": "system", "content": "You are Ada."}, {"role": "user", "content": "Hello " * 40}]
        for _ in range(2):
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=client.base_url, api_key="sk-wrong-key-0000", max_retries=0).models.list()
        with grpc.insecure_channel(gateway.address) as channel:
            request = chat_pb2.GenerateRequest(
                conversation_id="metrics",
                dialogue=chat_pb2.Dialogue(messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, text="Hi " * 40)]),
                sampling=chat_pb2.SamplingParams(max_new_tokens=3),
            )
            list(
                chat_pb2_grpc.ChatServiceStub(channel).Generate(request, metadata=(("authorization", f"Bearer {KEY}"),))
            )
        time.sleep(1.0)  # the engine's puts reach the kvstore, load gauges refresh
        yield {
            "gateway": scrape(gateway.metrics_port),
            "engine": scrape(engine.metrics_port),
            "kvstore": scrape(kv.metrics_port),
        }
    finally:
        stop_all(reversed(procs))


@pytest.mark.parametrize("service", ["gateway", "engine", "kvstore"])
def test_exported_series_match_the_readme(scrapes, service):
    listed = readme_series()[service]
    exported = scrapes[service]
    assert sorted(set(exported) - set(listed)) == [], f"{service}: exported but not in docs/metrics.md"
    assert sorted(set(listed) - set(exported)) == [], f"{service}: in docs/metrics.md but not exported"
    for name, (type_, labels) in exported.items():
        assert listed[name][0] == type_, (name, type_, listed[name][0])
        if labels is not None:
            assert labels == listed[name][1], (name, sorted(labels), sorted(listed[name][1]))


def test_latency_histograms_are_in_seconds_and_turns_carry_the_model(scrapes):
    for exported in scrapes.values():
        for name, (type_, _labels) in exported.items():
            if type_ == "histogram" and re.search(r"(latency|time|duration|ttft)", name):
                assert name.endswith("_seconds"), name
            assert not name.endswith("_ms"), name
    for service, name in [
        ("engine", "salon_engine_time_to_first_token_seconds"),
        ("engine", "salon_engine_inter_token_latency_seconds"),
        ("engine", "salon_engine_e2e_request_latency_seconds"),
        ("engine", "salon_engine_request_queue_time_seconds"),
        ("engine", "salon_engine_prefix_cache_hits_total"),
        ("gateway", "salon_gateway_time_to_first_token_seconds"),
    ]:
        assert "model" in scrapes[service][name][1], (service, name)
