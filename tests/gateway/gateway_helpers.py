"""Helpers for the gateway tests: a real redis-server process, free ports, tenant files."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.requirements import require

REDIS_BINARY = shutil.which("redis-server")


class RedisServer:
    """A throwaway redis-server: no persistence, loopback only, on a fixed port across restarts."""

    def __init__(self, port: int | None = None):
        require(REDIS_BINARY is not None, "redis-server", "Debian package redis-server; scripts/setup.sh installs it")
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.process = subprocess.Popen(
            [
                REDIS_BINARY,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            if self.ping():
                return self
            time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


TENANTS = {
    "tenants": [
        {"tenant_id": "acme", "api_key": "key-acme-0123456789", "namespace_salt": "acme-salt"},
        {
            "tenant_id": "globex",
            "api_key": "key-globex-0123456789",
            "max_concurrent_streams": 2,
            "requests_per_s": 1000.0,
            "burst_requests": 1000,
        },
    ]
}
ACME_KEY = "key-acme-0123456789"
GLOBEX_KEY = "key-globex-0123456789"


def write_tenants(path: Path, tenants: dict = TENANTS) -> Path:
    path.write_text(json.dumps(tenants))
    return path


# --- real service processes -------------------------------------------------------------------

import re  # noqa: E402
import urllib.request  # noqa: E402
from collections.abc import Iterable, Sequence  # noqa: E402

import grpc  # noqa: E402

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc  # noqa: E402
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc  # noqa: E402
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS  # noqa: E402
from salon.common.process import ServiceProcess, start_service  # noqa: E402

ENGINE_MODEL = "synthetic-tiny"


def ring_owner(engine_ids: Sequence[str], conversation_id: str, tenant_id: str = "acme") -> str:
    """Where the gateway's ring puts a tenant's dialogue when no session or load says otherwise."""
    from salon.gateway.ring import HashRing
    from salon.gateway.types import TenantId, dialogue_key

    return HashRing(engine_ids).owner(dialogue_key(TenantId(tenant_id), conversation_id))


ENGINE_KV_CACHE_BYTES = 32 << 20
# A reply long enough that a fault after its first tokens lands mid-stream on a loaded machine (seconds of decoding
# on the synthetic model; a few hundred tokens were done in a fraction of a second)
MID_STREAM_TOKENS = 1000


def start_engines(
    engine_ids: Sequence[str], log_dir: Path, ports: Sequence[int] | None = None
) -> dict[str, ServiceProcess]:
    """`python -m salon.engine` processes (synthetic model, small KV cache) started together, then
    waited on until each is SERVING."""
    procs: dict[str, ServiceProcess] = {}
    try:
        for i, engine_id in enumerate(engine_ids):
            args = (
                "--port",
                str(ports[i] if ports else 0),
                "--model",
                ENGINE_MODEL,
                "--engine-id",
                engine_id,
                "--kv-cache-bytes",
                str(ENGINE_KV_CACHE_BYTES),
                *INSECURE_LOOPBACK_FLAGS,
            )
            procs[engine_id] = ServiceProcess("engine", args, log_dir / f"engine-{engine_id}.log").start(180)
        for proc in procs.values():
            proc.wait_serving(180)
    except BaseException:
        for proc in procs.values():
            proc.kill()
        raise
    return procs


def start_engine(engine_id: str, log_dir: Path, port: int = 0) -> ServiceProcess:
    return start_engines([engine_id], log_dir, [port])[engine_id]


def start_gateway(
    engines: Iterable[ServiceProcess | tuple[str, str]],
    tenants_file: Path,
    log_dir: Path,
    name: str = "gateway",
    redis_url: str | None = None,
    extra: Sequence[str] = (),
) -> ServiceProcess:
    spec = ",".join(f"{e[0]}={e[1]}" if isinstance(e, tuple) else f"{engine_id_of(e)}={e.address}" for e in engines)
    args = [
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--engines",
        spec,
        "--tenants-file",
        str(tenants_file),
        "--salt-secret-file",
        str(write_salt_secret(log_dir)),
        "--grace-s",
        "1",
        *extra,
    ]
    if "--engine-tls-ca-file" not in extra:
        args += INSECURE_LOOPBACK_FLAGS
    if redis_url:
        args += ["--redis-url", redis_url]
    return start_service("gateway", args, log_path=log_dir / f"{name}.log", timeout_s=60)


SALT_SECRET = "5a1f" * 16  # the tests' salt secret (hex): globex's salt is HMAC(this, "globex")


def write_salt_secret(directory: Path) -> Path:
    path = directory / "salt-secret.key"
    path.write_text(SALT_SECRET)
    return path


def engine_id_of(engine: ServiceProcess) -> str:
    return engine.args[engine.args.index("--engine-id") + 1]


def gateway_metrics(gateway: ServiceProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=5) as response:
        return response.read().decode()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if not match:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def wait_engines_serving(
    gateway: ServiceProcess, engine_ids: Iterable[str], timeout_s: float = 30.0, serving: bool = True
) -> None:
    """Wait until the gateway's metrics show each engine in (or out of) the ring."""
    deadline = time.monotonic() + timeout_s
    want = 1.0 if serving else 0.0
    while True:
        text = gateway_metrics(gateway)
        if all(metric_value(text, "salon_gateway_engine_serving", engine=e) == want for e in engine_ids):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"engines {list(engine_ids)} not serving={serving} at the gateway:\n{text[-2000:]}")
        time.sleep(0.05)


def start_serving_gateway(
    engines: dict[str, ServiceProcess], log_dir: Path, name: str = "gateway", extra: Sequence[str] = ()
) -> ServiceProcess:
    """A gateway over `engines` with fresh load reports (every 100 ms), returned once every engine is in its ring
    (killed if that never comes)."""
    gateway = start_gateway(
        engines.values(),
        write_tenants(log_dir / f"{name}.json"),
        log_dir,
        name=name,
        extra=["--load-interval-ms", "100", *extra],
    )
    try:
        wait_engines_serving(gateway, engines)
    except BaseException:
        gateway.kill()
        raise
    return gateway


def chat_stub(process: ServiceProcess) -> tuple[grpc.Channel, chat_pb2_grpc.ChatServiceStub]:
    channel = grpc.insecure_channel(process.address)
    return channel, chat_pb2_grpc.ChatServiceStub(channel)


def engine_stub(process: ServiceProcess) -> tuple[grpc.Channel, engine_pb2_grpc.EngineServiceStub]:
    channel = grpc.insecure_channel(process.address)
    return channel, engine_pb2_grpc.EngineServiceStub(channel)


def auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


PROMPT_TOKEN_IDS = [2, 818, 5279, 529, 506, 3004, 563, 496, 8351, 1124, 236764, 11052, 6524, 236761]


def chat_request(
    conversation_id: str, max_new_tokens: int = 8, prompt: Sequence[int] = PROMPT_TOKEN_IDS, request_id: str = ""
) -> chat_pb2.GenerateRequest:
    return chat_pb2.GenerateRequest(
        conversation_id=conversation_id,
        request_id=request_id,
        tokens=chat_pb2.TokenizedPrompt(token_ids=list(prompt)),
        sampling=chat_pb2.SamplingParams(max_new_tokens=max_new_tokens),
    )


def engine_request(chat: chat_pb2.GenerateRequest, request_id: str = "direct") -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id=request_id, conversation_id=chat.conversation_id, tokens=chat.tokens, sampling=chat.sampling
    )


def collect(events) -> tuple[list[int], str, chat_pb2.GenerateFinal | None]:
    """Token ids, text and final of a finished stream."""
    token_ids: list[int] = []
    text = []
    final = None
    for event in events:
        if event.HasField("final"):
            final = event.final
        else:
            token_ids.extend(event.delta.token_ids)
            text.append(event.delta.text)
    return token_ids, "".join(text), final
