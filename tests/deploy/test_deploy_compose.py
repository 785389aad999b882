"""docker-compose.yml: valid against the Compose spec, commands are real entry points with real flags, ports
agree, only public ports are published, and every internal link is mutual TLS with identities."""

import dataclasses
import importlib
import json
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


def test_only_public_ports_are_published_and_only_on_loopback():
    services = _compose()["services"]
    published = {name: _published(svc) for name, svc in services.items() if svc.get("ports")}
    # The gateway's gRPC port and OpenAI HTTP API, on this host's loopback: a proxy in front faces a network.
    assert published.pop("gateway") == [("127.0.0.1", "50051"), ("127.0.0.1", "8000")]
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
        assert _flag(command, "--tls-cert-file") == f"/certs/{role}/cert.pem", name
        assert _flag(command, "--tls-key-file") == f"/certs/{role}/key.pem", name
        assert _flag(command, "--tls-client-ca-file") == f"/certs/{role}/ca.pem", name
        assert "--internal-auth" not in command  # the default: mtls
    for name in ("engine-0", "engine-1"):
        assert _flag(salon[name]["command"], "--kvstore-tls-cert-file") == "/certs/engine/cert.pem"
    gateway = salon["gateway"]["command"]
    assert _flag(gateway, "--engine-tls-cert-file") == "/certs/gateway/cert.pem"
    # The same grant key (one file of the CA volume), each from its own role's copy.
    assert _flag(gateway, "--namespace-grant-key-file") == "/certs/gateway/namespace-grant.key"
    assert _flag(salon["kvstore"]["command"], "--namespace-grant-key-file") == "/certs/kvstore/namespace-grant.key"
    assert _flag(gateway, "--salt-secret-file") == "/certs/gateway/salt-secret.key"
    certs = _compose()["services"]["certs"]["command"]
    assert certs[:3] == ["python", "-m", "salon.cli.certs"] and _flag(certs, "--out") == "/certs/ca"
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


# Which role's files each salon service may hold; the volumes with keys or secrets in them.
ROLE_OF = {"gateway": "gateway", "engine-0": "engine", "engine-1": "engine", "kvstore": "kvstore"}
SECRET_VOLUMES = {"ca", "gateway-secrets", "engine-secrets", "kvstore-secrets"}


def _mounts(svc) -> dict[str, tuple[str, bool]]:
    """Source (named volume or host path) -> (container path, read-only) of each of a service's mounts."""
    out = {}
    for entry in svc.get("volumes", []):
        source, target, *options = entry.split(":")
        out[source] = (target, "ro" in options)
    return out


def test_each_service_mounts_only_its_own_roles_secrets_read_only():
    compose = _compose()
    assert SECRET_VOLUMES <= set(compose["volumes"])
    for name, svc in compose["services"].items():
        secret = {source: mount for source, mount in _mounts(svc).items() if source in SECRET_VOLUMES}
        if name == "certs":  # the one-shot job: the CA volume, which nothing else mounts, and every role's copy
            assert secret == {source: (f"/certs/{source.removesuffix('-secrets')}", False) for source in SECRET_VOLUMES}
        elif name in ROLE_OF:
            role = ROLE_OF[name]
            assert secret == {f"{role}-secrets": (f"/certs/{role}", True)}, name
            named = [arg for arg in svc["command"] if arg.startswith("/certs/")]
            assert named and all(arg.startswith(f"/certs/{role}/") for arg in named), (name, named)
        else:
            assert not secret, name
        assert not any("tenants" in source for source in _mounts(svc)), name  # no tenant table from the repository


def test_the_image_makes_each_mount_point_for_the_services_user():
    dockerfile = (REPO / "Dockerfile").read_text()
    targets = {target for svc in _compose()["services"].values() for target, _ in _mounts(svc).values()}
    for target in sorted(t for t in targets if t.startswith("/certs/")):
        assert re.search(rf"mkdir -p [^\n]*{re.escape(target)}\b", dockerfile), target
    assert "chown -R salon:salon /certs && chmod -R 0700 /certs" in dockerfile


def _run_certs_job(root: Path, capsys) -> str:
    """The compose file's certs command, with /certs at `root`; returns what it printed."""
    from salon.cli import certs

    command = _compose()["services"]["certs"]["command"]
    assert command[:3] == ["python", "-m", "salon.cli.certs"]
    assert certs.main([arg.replace("/certs/", f"{root}/") for arg in command[3:]]) == 0
    return capsys.readouterr().out


def test_the_certs_job_gives_each_role_only_what_it_may_hold(tmp_path, capsys):
    _run_certs_job(tmp_path, capsys)
    assert sorted(p.name for p in (tmp_path / "engine").iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
    assert sorted(p.name for p in (tmp_path / "kvstore").iterdir()) == [
        "ca.pem",
        "cert.pem",
        "key.pem",
        "namespace-grant.key",
    ]
    assert sorted(p.name for p in (tmp_path / "gateway").iterdir()) == [
        "ca.pem",
        "cert.pem",
        "key.pem",
        "namespace-grant.key",
        "salt-secret.key",
        "tenants.json",
    ]
    ca = tmp_path / "ca"
    keys = {role: (ca / f"{role}.key").read_bytes() for role in ("gateway", "engine", "kvstore")}
    for role in keys:
        directory = tmp_path / role
        assert oct(directory.stat().st_mode & 0o777) == "0o700"
        assert (directory / "key.pem").read_bytes() == keys[role]
        assert (directory / "cert.pem").read_bytes() == (ca / f"{role}.pem").read_bytes()
        assert (directory / "ca.pem").read_bytes() == (ca / "ca.pem").read_bytes()
        held = b"".join(p.read_bytes() for p in directory.iterdir())
        assert (ca / "ca.key").read_bytes() not in held  # nobody but the certs job can mint identities
        assert all(keys[other] not in held for other in keys if other != role)
        for path in directory.iterdir():
            assert path.stat().st_mode & 0o077 == 0, path
    # Every file a service's command names is one the job made in that service's own volume.
    for name, svc in _salon_services().items():
        for arg in svc["command"]:
            if arg.startswith("/certs/"):
                assert (tmp_path / arg.removeprefix("/certs/")).is_file(), (name, arg)


def test_no_example_key_a_random_one_is_made_at_first_start_and_printed_once(tmp_path, capsys):
    assert "salon-dev-key" not in COMPOSE.read_text()
    gateway = _salon_services()["gateway"]["command"]
    certs = _compose()["services"]["certs"]["command"]
    assert _flag(gateway, "--tenants-file") == _flag(certs, "--tenants-file") == "/certs/gateway/tenants.json"
    first = _run_certs_job(tmp_path / "a", capsys)
    tenants_file = tmp_path / "a" / "gateway" / "tenants.json"
    table = json.loads(tenants_file.read_text())
    ((tenant),) = table["tenants"]
    key = tenant["api_key"]
    assert tenant["tenant_id"] == "default" and "namespace_salt" not in tenant  # derived from the salt secret
    assert re.fullmatch(r"sk-salon-[A-Za-z0-9_-]{32}", key)
    assert [line for line in first.splitlines() if key in line] == [
        f"tenant 'default' in {tenants_file}; its API key, shown this once: {key}"
    ]
    again = _run_certs_job(tmp_path / "a", capsys)  # a restart keeps the table and prints no key
    assert "certificates and secrets in" in again and key not in again and "API key" not in again
    assert json.loads(tenants_file.read_text()) == table
    _run_certs_job(tmp_path / "b", capsys)  # another stack gets another key
    other = json.loads((tmp_path / "b" / "gateway" / "tenants.json").read_text())["tenants"][0]["api_key"]
    assert other != key
