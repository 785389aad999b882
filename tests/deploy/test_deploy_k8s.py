"""deploy/k8s: valid Kubernetes objects, SALON_* variables that the services really read, probes on the right ports."""

import dataclasses
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from services.common.config import env_names, parse_config

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))


def _objects():
    return [obj for path in MANIFESTS for obj in yaml.safe_load_all(path.read_text()) if obj]


def _containers():
    for obj in _objects():
        spec = obj.get("spec", {}).get("template", {}).get("spec")
        if spec:
            for container in spec["containers"]:
                if container["image"].startswith("salon:"):
                    yield obj, container


def test_manifests_validate_strictly():
    exe = shutil.which("kubernetes-validate") or str(Path(sys.executable).with_name("kubernetes-validate"))
    result = subprocess.run([exe, "--strict", "--quiet", *map(str, MANIFESTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_workload_kinds():
    kinds = {(o["kind"], o["metadata"]["name"]) for o in _objects()}
    assert {("Deployment", "gateway"), ("HorizontalPodAutoscaler", "gateway"), ("DaemonSet", "kvstore"),
            ("StatefulSet", "engine"), ("Deployment", "redis"), ("Service", "engine")} <= kinds
    engine = next(o for o in _objects() if o["kind"] == "StatefulSet")
    resources = engine["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    headless = next(o for o in _objects() if o["kind"] == "Service" and o["metadata"]["name"] == "engine")
    assert headless["spec"]["clusterIP"] == "None"


def _config_class(service):
    module = importlib.import_module(f"services.{service}.config")
    classes = [obj for obj in vars(module).values() if isinstance(obj, type) and dataclasses.is_dataclass(obj)
               and "server" in {f.name for f in dataclasses.fields(obj)}]
    assert len(classes) == 1
    return classes[0]


@pytest.mark.parametrize("service", ["gateway", "engine", "kvstore"])
def test_env_names_are_config_fields_and_probes_hit_the_grpc_port(service):
    (obj, container), = [(o, c) for o, c in _containers() if c["command"][-1] == f"services.{service}"]
    prefix = f"SALON_{service.upper()}_"
    env = {e["name"]: e.get("value", "x") for e in container["env"] if e["name"].startswith(prefix)}
    resolved = {k: ("engine-0" if "$(" in v else v) for k, v in env.items()}
    if service == "engine":
        resolved[prefix + "KVSTORE_TARGET"] = "10.0.0.1:50061"
    unknown = set(env) - env_names(_config_class(service), prefix)
    assert not unknown, f"{service} has no config field for {sorted(unknown)}"
    config = parse_config(_config_class(service), [], env_prefix=prefix, environ=resolved)
    port = config.server.port
    assert {p["containerPort"] for p in container["ports"]} >= {port, config.server.metrics_port}
    assert container["readinessProbe"]["grpc"]["port"] == port
    liveness = container["livenessProbe"]
    assert (liveness.get("grpc") or liveness.get("tcpSocket"))["port"] == port
