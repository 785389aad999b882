"""Every service's Prometheus series against the list in docs/metrics.md: after real traffic (HTTP and gRPC
turns, a cache hit, a kvstore put, a refused key), each `salon_*` and `vllm:*` family a service exports is
listed for that service with its type and labels, every listed family is exported, latency histograms are
in seconds, the turn's latencies carry `model_name`, the engine's request series follow vLLM's
(finished_reason values, request phases), the HTTP port's /metrics is the gateway's less its per-tenant
series, promtool finds nothing but vLLM's colons, and every query of the Grafana dashboard names a series
these scrapes hold."""

from __future__ import annotations

import json
import re
import subprocess
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
from tests.requirements import require_tools

ROOT = Path(__file__).resolve().parents[2]
METRICS_DOC = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "salon.json"
_ROW = re.compile(r"^\| `((?:salon_|vllm:)[\w:]+)` \| (counter|gauge|histogram) \| ([^|]*) \| [^|]+ \|$")
_SERIES = re.compile(r"(?:vllm:|salon_)[a-zA-Z0-9_:]+")
VLLM_FINISHED_REASONS = {"stop", "length", "abort", "error"}
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


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def scrape(text: str) -> dict[str, tuple[str, frozenset[str] | None]]:
    """series name (counters with _total) -> (type, label names, None when no sample yet)."""
    out = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(("salon_", "vllm:")):
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
            "gateway": scrape_text(gateway.metrics_port),
            "engine": scrape_text(engine.metrics_port),
            "kvstore": scrape_text(kv.metrics_port),
            "gateway_http": scrape_text(gateway.extra_ports["http_port"]),
        }
    finally:
        stop_all(reversed(procs))


@pytest.mark.parametrize("service", ["gateway", "engine", "kvstore"])
def test_exported_series_match_the_readme(scrapes, service):
    listed = readme_series()[service]
    exported = scrape(scrapes[service])
    assert sorted(set(exported) - set(listed)) == [], f"{service}: exported but not in docs/metrics.md"
    assert sorted(set(listed) - set(exported)) == [], f"{service}: in docs/metrics.md but not exported"
    for name, (type_, labels) in exported.items():
        assert listed[name][0] == type_, (name, type_, listed[name][0])
        if labels is not None:
            assert labels == listed[name][1], (name, sorted(labels), sorted(listed[name][1]))


def test_latency_histograms_are_in_seconds_and_turns_carry_the_model(scrapes):
    parsed = {service: scrape(text) for service, text in scrapes.items()}
    for exported in parsed.values():
        for name, (type_, _labels) in exported.items():
            if type_ == "histogram" and re.search(r"(latency|time|duration|ttft)", name):
                assert name.endswith("_seconds"), name
            assert not name.endswith("_ms"), name
    for service, name in [
        ("engine", "vllm:time_to_first_token_seconds"),
        ("engine", "vllm:inter_token_latency_seconds"),
        ("engine", "vllm:e2e_request_latency_seconds"),
        ("engine", "vllm:request_queue_time_seconds"),
        ("engine", "vllm:prefix_cache_hits_total"),
        ("engine", "salon_engine_prefix_cache_hits_total"),
        ("gateway", "salon_gateway_time_to_first_token_seconds"),
    ]:
        assert "model_name" in parsed[service][name][1], (service, name)


def samples(text: str, name: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def test_each_service_froze_its_start_up_heap_and_times_its_collections(scrapes):
    """Each service froze what its start-up built when it first served (salon.common.startup_heap): the frozen
    objects are counted, and the freeze's own full collection was timed."""
    for service in ("gateway", "engine", "kvstore"):
        frozen = samples(scrapes[service], "salon_gc_frozen_objects")
        assert len(frozen) == 1 and frozen[0].value > 10_000, (service, frozen)
        full = [s for s in samples(scrapes[service], "salon_gc_pause_seconds_count") if s.labels["generation"] == "2"]
        assert len(full) == 1 and full[0].value >= 1, (service, full)


def test_engine_requests_follow_vllm(scrapes):
    """Three turns reached the engine (two HTTP, one gRPC): each finished once with a vLLM reason, under the
    engine's model_name and id, and was observed once in each phase; the phases add up."""
    engine = scrapes["engine"]
    finished = samples(engine, "vllm:request_success_total")
    assert {s.labels["finished_reason"] for s in finished} <= VLLM_FINISHED_REASONS, finished
    assert sum(s.value for s in finished) == 3
    assert {(s.labels["model_name"], s.labels["engine"]) for s in finished} == {(MODEL, "e0")}
    for name in ("queue", "prefill", "decode", "inference"):
        assert [s.value for s in samples(engine, f"vllm:request_{name}_time_seconds_count")] == [3], name

    def total(name: str) -> float:
        return sum(s.value for s in samples(engine, name))

    prefill, decode = total("vllm:request_prefill_time_seconds_sum"), total("vllm:request_decode_time_seconds_sum")
    inference, queue = total("vllm:request_inference_time_seconds_sum"), total("vllm:request_queue_time_seconds_sum")
    assert inference > 0
    assert inference == pytest.approx(prefill + decode, abs=1e-6)
    assert total("vllm:e2e_request_latency_seconds_sum") == pytest.approx(queue + inference, abs=1e-6)


def test_http_metrics_is_the_gateway_registry_less_its_tenant_series(scrapes):
    on_metrics_port, on_http = scrape(scrapes["gateway"]), scrape(scrapes["gateway_http"])
    per_tenant = {name for name, (_type, labels) in on_metrics_port.items() if labels and "tenant" in labels}
    assert per_tenant == {"salon_gateway_requests_total"}
    assert set(on_http) == set(on_metrics_port) - per_tenant
    assert "tenant=" not in scrapes["gateway_http"] and 'tenant="plain"' in scrapes["gateway"]


def test_a_store_not_configured_has_no_series(scrapes):
    gateway = scrapes["gateway"]
    assert samples(gateway, "salon_gateway_engine_serving")  # this scrape does hold the gateway's gauges
    assert samples(gateway, "salon_gateway_session_store_up") == []  # no Redis: absent, not 0


# promtool reserves ':' for recording rules; vLLM's names have one, and are kept for its dashboards.
_VLLM_COLON = re.compile(r"vllm:\w+ metric names should not contain ':'")


@pytest.mark.parametrize("service", ["gateway", "gateway_http", "engine", "kvstore"])
def test_promtool_finds_nothing_but_vllm_colons(scrapes, service):
    require_tools("promtool", why="Debian's prometheus package; scripts/setup.sh installs it")
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=scrapes[service], capture_output=True, text=True, timeout=60
    )
    problems = [line for line in (checked.stdout + checked.stderr).splitlines() if line.strip()]
    assert [p for p in problems if not _VLLM_COLON.fullmatch(p)] == []


_SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def queryable_names(text: str) -> set[str]:
    """The series names a PromQL query can use on this scrape (a family declared without samples included)."""
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in _SAMPLE_SUFFIXES.get(family.type, ("",))
    }


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    variables = dashboard.get("templating", {}).get("list", [])
    return queries + [v["query"]["query"] for v in variables if v.get("type") == "query"]


def test_every_dashboard_query_names_scraped_series(scrapes):
    scraped = queryable_names(scrapes["engine"]) | queryable_names(scrapes["gateway"])
    queries = dashboard_queries()
    named: set[str] = set()
    for query in queries:
        names = set(_SERIES.findall(query))
        assert names, query
        assert sorted(names - scraped) == [], query
        named |= names
    assert {
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:generation_tokens_total",
        "salon_gateway_refusals_total",
        "salon_gateway_failovers_total",
    } <= named
