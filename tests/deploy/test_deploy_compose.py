"""docker-compose.yml: valid against the Compose spec, commands are real entry points with real flags, ports
agree, only public ports are published, and every internal link is mutual TLS with identities."""

import dataclasses
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from salon.common.config import parse_config

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"


def _compose():
    return yaml.safe_load(COMPOSE.read_text())


def _flag(command, name):
    return command[command.index(name) + 1]


def _salon_services():
    """The services that run a salon service (the image also runs the one-shot certs step)."""
    return {
        name: svc
        for name, svc in _compose()["services"].items()
        if svc.get("image") == "salon:latest"
        and svc["command"][2] in ("salon.gateway", "salon.engine", "salon.kvstore")
    }


def test_compose_file_matches_the_compose_spec():
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    result = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _config_class(module_name):
    module = importlib.import_module(module_name)
    classes = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and dataclasses.is_dataclass(obj)
        and "server" in {f.name for f in dataclasses.fields(obj)}
    ]
    assert len(classes) == 1, f"{module_name} must define exactly one service config dataclass, found {classes}"
    return classes[0]


@pytest.mark.parametrize("name", sorted(_salon_services()))
def test_service_command_is_a_real_entry_point_with_valid_flags(name):
    command = _salon_services()[name]["command"]
    assert command[:2] == ["python", "-m"], command
    module = command[2]
    assert re.fullmatch(r"salon\.(gateway|engine|kvstore)", module), module
    assert (REPO / module.replace(".", "/") / "__main__.py").exists()
    config = parse_config(_config_class(module + ".config"), command[3:], environ={})
    port = _flag(command, "--port")
    assert config.server.port == int(port)


def _published(svc) -> list[tuple[str, str]]:
    """(host address, container port) of each published port ("" = every interface)."""
    out = []
    for entry in svc.get("ports", []):
        parts = str(entry).split(":")
        address = parts[0] if len(parts) == 3 else ""
        out.append((address, parts[-1]))
    return out


def test_only_public_ports_are_published():
    services = _compose()["services"]
    published = {name: _published(svc) for name, svc in services.items() if svc.get("ports")}
    # The public gRPC port on every interface; the OpenAI HTTP API on this host's loopback.
    assert published.pop("gateway") == [("", "50051"), ("127.0.0.1", "8000")]
    for name, ports in published.items():  # anything else (Jaeger's UI) only on this host's loopback
        assert all(address == "127.0.0.1" for address, _ in ports), (name, ports)
    assert set(published) <= {"jaeger"}


def test_the_gateway_serves_the_http_api_on_the_port_it_publishes():
    command = _salon_services()["gateway"]["command"]
    config = parse_config(_config_class("salon.gateway.config"), command[3:], environ={})
    assert config.http_port == 8000 and config.server.host == "0.0.0.0"  # reachable from the published port
    assert ("127.0.0.1", str(config.http_port)) in _published(_compose()["services"]["gateway"])
    assert "127.0.0.1:8000:8000" in _compose()["services"]["gateway"]["ports"]


def test_internal_links_are_mutual_tls_with_identities():
    salon = _salon_services()
    for name in ("kvstore", "engine-0", "engine-1"):
        command = salon[name]["command"]
        role = name.split("-")[0]
        assert _flag(command, "--tls-cert-file") == f"/certs/tls/{role}.pem", name
        assert _flag(command, "--tls-client-ca-file") == "/certs/tls/ca.pem", name
        assert "--internal-auth" not in command  # the default: mtls
    for name in ("engine-0", "engine-1"):
        assert _flag(salon[name]["command"], "--kvstore-tls-cert-file") == "/certs/tls/engine.pem"
    gateway = salon["gateway"]["command"]
    assert _flag(gateway, "--engine-tls-cert-file") == "/certs/tls/gateway.pem"
    assert _flag(gateway, "--namespace-grant-key-file") == _flag(
        salon["kvstore"]["command"], "--namespace-grant-key-file"
    )
    assert "--salt-secret-file" in gateway
    certs = _compose()["services"]["certs"]["command"]
    assert certs[:3] == ["python", "-m", "salon.cli.certs"] and _flag(certs, "--out") == "/certs/tls"
    for name in salon:
        assert salon[name]["depends_on"], name  # after the certificates exist (directly or through the kvstore)


def test_ports_agree():
    services = _compose()["services"]
    salon = _salon_services()
    by_host = {}
    for name, svc in salon.items():
        command = svc["command"]
        port = _flag(command, "--port")
        probe_port = _flag(command, "--health-port") if "--health-port" in command else port
        assert svc["healthcheck"]["test"][-1] == f"127.0.0.1:{probe_port}", name
        by_host[name] = port
    gateway = salon["gateway"]["command"]
    for entry in _flag(gateway, "--engines").split(","):
        engine_id, target = entry.split("=")
        host, port = target.split(":")
        assert host in salon and by_host[host] == port, entry
        assert _flag(salon[host]["command"], "--engine-id") == engine_id
    for name, svc in salon.items():
        if "--kvstore-target" in svc["command"]:
            host, port = _flag(svc["command"], "--kvstore-target").split(":")
            assert by_host[host] == port, name
    redis_url = _flag(gateway, "--redis-url")
    assert redis_url.startswith("redis://redis:6379") and "redis" in services
    endpoint = salon["gateway"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert endpoint == "http://otel-collector:4317" and "otel-collector" in services


GPU_OVERRIDE = REPO / "docker-compose.gpu.yaml"


def test_gpu_override_reserves_a_device_per_engine_and_runs_the_engine_on_it():
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    result = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(GPU_OVERRIDE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    override = yaml.safe_load(GPU_OVERRIDE.read_text())["services"]
    engines = {name for name, svc in _salon_services().items() if svc["command"][2] == "salon.engine"}
    assert set(override) == engines
    device_ids = []
    for name in engines:
        assert override[name]["environment"]["SALON_ENGINE_DEVICE"] == "cuda"
        (device,) = override[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        device_ids += device["device_ids"]
    assert len(set(device_ids)) == len(engines)  # one GPU each
    # The variable is the engine's own --device setting (salon.common.config's SALON_ENGINE_<FIELD>).
    from salon.engine.config import EngineConfig

    assert (
        parse_config(EngineConfig, [], env_prefix="SALON_ENGINE_", environ={"SALON_ENGINE_DEVICE": "cuda"}).device
        == "cuda"
    )
