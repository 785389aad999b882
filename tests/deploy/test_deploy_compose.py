"""docker-compose.yml: valid against the Compose spec, commands are real entry points with real flags, ports agree."""

import dataclasses
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from services.common.config import parse_config

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"


def _compose():
    return yaml.safe_load(COMPOSE.read_text())


def _flag(command, name):
    return command[command.index(name) + 1]


def _salon_services():
    return {name: svc for name, svc in _compose()["services"].items() if svc.get("image") == "salon:latest"}


def test_compose_file_matches_the_compose_spec():
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    result = subprocess.run([exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _config_class(module_name):
    module = importlib.import_module(module_name)
    classes = [obj for obj in vars(module).values()
               if isinstance(obj, type) and dataclasses.is_dataclass(obj)
               and "server" in {f.name for f in dataclasses.fields(obj)}]
    assert len(classes) == 1, f"{module_name} must define exactly one service config dataclass, found {classes}"
    return classes[0]


@pytest.mark.parametrize("name", sorted(_salon_services()))
def test_service_command_is_a_real_entry_point_with_valid_flags(name):
    command = _salon_services()[name]["command"]
    assert command[:2] == ["python", "-m"], command
    module = command[2]
    assert re.fullmatch(r"services\.(gateway|engine|kvstore)", module), module
    assert (REPO / module.replace(".", "/") / "__main__.py").exists()
    config = parse_config(_config_class(module + ".config"), command[3:], environ={})
    port = _flag(command, "--port")
    assert config.server.port == int(port)


def test_ports_agree():
    services = _compose()["services"]
    salon = _salon_services()
    by_host = {}
    for name, svc in salon.items():
        command = svc["command"]
        port, metrics_port = _flag(command, "--port"), _flag(command, "--metrics-port")
        published = {p.split(":")[1] for p in svc["ports"]}
        assert {port, metrics_port} <= published, (name, svc["ports"])
        assert svc["healthcheck"]["test"][-1] == f"127.0.0.1:{port}", name
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
    collector = services["otel-collector"]
    endpoint = salon["gateway"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert endpoint.endswith(":4317") and "4317:4317" in collector["ports"]
