"""Helpers for the hardening tests: real service processes on loopback and the engines' own accounting.

Leak check (`assert_engine_clean`): an engine that finished or dropped all its work has
running == waiting == 0, and every KV block is either free or held only by the prefix cache:
free_kv_blocks + cached_kv_blocks == total_kv_blocks. A block still owned by a dead stream breaks it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import ServiceProcess, start_service

MODEL = "synthetic-tiny"
ENGINE_KV_CACHE_BYTES = 32 << 20

KEY_A = "sk-hardening-tenant-a-7f3e9c1d"
KEY_B = "sk-hardening-tenant-b-52aa04be"
TENANTS = {
    "tenants": [
        {"tenant_id": "tenant-a", "api_key": KEY_A, "namespace_salt": "salt-a"},
        {"tenant_id": "tenant-b", "api_key": KEY_B, "namespace_salt": "salt-b"},
    ]
}
PROMPT_TOKEN_IDS = [2, 818, 5279, 529, 506, 3004, 563, 496, 8351, 1124, 236764, 11052, 6524, 236761]


def auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def write_tenants(path: Path, tenants: dict = TENANTS) -> Path:
    path.write_text(json.dumps(tenants))
    return path


def start_engine(engine_id: str, log_dir: Path, extra: Sequence[str] = (), wait: bool = True) -> ServiceProcess:
    args = [
        "--port",
        "0",
        "--model",
        MODEL,
        "--engine-id",
        engine_id,
        "--kv-cache-bytes",
        str(ENGINE_KV_CACHE_BYTES),
        "--log-json",
        "true",
        *extra,
    ]
    if "--tls-client-ca-file" not in extra:
        args += INSECURE_LOOPBACK_FLAGS
    return start_service("engine", args, log_path=log_dir / f"engine-{engine_id}.log", wait_serving=wait, timeout_s=180)


def start_gateway(
    engines: dict[str, ServiceProcess],
    tenants_file: Path,
    log_dir: Path,
    name: str = "gateway",
    extra: Sequence[str] = (),
    wait: bool = True,
) -> ServiceProcess:
    spec = ",".join(f"{engine_id}={proc.address}" for engine_id, proc in engines.items())
    args = [
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--engines",
        spec,
        "--tenants-file",
        str(tenants_file),
        "--grace-s",
        "1",
        "--load-interval-ms",
        "100",
        "--log-json",
        "true",
        *extra,
    ]
    if "--engine-tls-ca-file" not in extra:
        args += INSECURE_LOOPBACK_FLAGS
    return start_service("gateway", args, log_path=log_dir / f"{name}.log", wait_serving=wait, timeout_s=60)


def stop_all(procs: Iterable[ServiceProcess | None]) -> None:
    for proc in procs:
        if proc is not None:
            proc.stop()


def engine_load(address: str, credentials: grpc.ChannelCredentials | None = None) -> engine_pb2.LoadReport:
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with channel:
        return engine_pb2_grpc.EngineServiceStub(channel).GetLoad(engine_pb2.GetLoadRequest(), timeout=5).load


def is_clean(report: engine_pb2.LoadReport) -> bool:
    return (
        report.running_requests == 0
        and report.waiting_requests == 0
        and report.free_kv_blocks + report.cached_kv_blocks == report.total_kv_blocks
    )


def assert_engine_clean(
    engine: ServiceProcess, timeout_s: float = 10.0, credentials: grpc.ChannelCredentials | None = None
) -> engine_pb2.LoadReport:
    """Wait until the engine's own accounting shows no work and no leaked KV block; the process lives."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert engine.process.poll() is None, f"engine exited with {engine.process.returncode}"
        report = engine_load(engine.address, credentials)
        if is_clean(report):
            assert report.total_kv_blocks > 0
            return report
        assert time.monotonic() < deadline, f"engine {engine.address} not clean after {timeout_s}s: {report}"
        time.sleep(0.05)


def wait_gateway_sees(gateway: ServiceProcess, num_engines: int, timeout_s: float = 30.0) -> None:
    """Wait until the gateway's ring holds `num_engines` SERVING engines (its /metrics says so)."""
    import re
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        serving = sum(float(v) for v in re.findall(r"^salon_gateway_engine_serving\{[^}]*\} (\S+)$", text, re.M))
        if serving >= num_engines:
            return
        assert time.monotonic() < deadline, f"gateway sees {serving} of {num_engines} engines"
        time.sleep(0.05)


def wait_tls_serving(proc: ServiceProcess, credentials: grpc.ChannelCredentials, timeout_s: float = 180.0) -> None:
    """ServiceProcess.wait_serving speaks plaintext; a TLS server is polled over TLS here."""
    deadline = time.monotonic() + timeout_s
    with grpc.secure_channel(proc.address, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            assert proc.process.poll() is None, f"{proc.service} exited with {proc.process.returncode}"
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"{proc.service} not SERVING over TLS"
            time.sleep(0.1)


def chat_request(
    conversation_id: str,
    max_new_tokens: int = 8,
    prompt: Sequence[int] = PROMPT_TOKEN_IDS,
) -> chat_pb2.GenerateRequest:
    return chat_pb2.GenerateRequest(
        conversation_id=conversation_id,
        tokens=chat_pb2.TokenizedPrompt(token_ids=list(prompt)),
        sampling=chat_pb2.SamplingParams(max_new_tokens=max_new_tokens),
    )


@dataclass
class Reply:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    final: chat_pb2.GenerateFinal | None = None


def collect(events) -> Reply:
    reply = Reply()
    parts = []
    for event in events:
        if event.HasField("final"):
            assert reply.final is None, "two finals in one stream"
            reply.final = event.final
        else:
            assert reply.final is None, "a delta after the final"
            reply.token_ids.extend(event.delta.token_ids)
            parts.append(event.delta.text)
    reply.text = "".join(parts)
    return reply


def chat_stub(address: str, credentials: grpc.ChannelCredentials | None = None, options=()):
    channel = (
        grpc.secure_channel(address, credentials, options=options)
        if credentials
        else grpc.insecure_channel(address, options=options)
    )
    return channel, chat_pb2_grpc.ChatServiceStub(channel)


def gateway_metric_sum(gateway: ServiceProcess, name: str) -> float:
    """Sum of every sample of `name` on the gateway's /metrics."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def assert_gateway_clean(gateway: ServiceProcess, timeout_s: float = 10.0) -> None:
    """No stream left open from the gateway to any engine."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert gateway.process.poll() is None, f"gateway exited with {gateway.process.returncode}"
        open_streams = gateway_metric_sum(gateway, "salon_gateway_engine_inflight_streams")
        if open_streams == 0:
            return
        assert time.monotonic() < deadline, f"gateway still holds {open_streams} engine streams"
        time.sleep(0.05)
