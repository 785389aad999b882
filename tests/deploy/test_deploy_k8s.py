"""deploy/k8s: valid Kubernetes objects, SALON_* variables that the services really read, probes on the right
ports, mutual TLS on every internal link, NetworkPolicies and PodDisruptionBudgets per tier, non-root pods."""

import dataclasses
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from salon.common.config import env_names, parse_config

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
    assert {
        ("Deployment", "gateway"),
        ("HorizontalPodAutoscaler", "gateway"),
        ("DaemonSet", "kvstore"),
        ("StatefulSet", "engine"),
        ("Deployment", "redis"),
        ("Service", "engine"),
    } <= kinds
    engine = next(o for o in _objects() if o["kind"] == "StatefulSet")
    resources = engine["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    env = {e["name"]: e.get("value") for e in engine["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SALON_ENGINE_DEVICE"] == "cuda"  # the GPU it reserves is the one it runs on
    headless = next(o for o in _objects() if o["kind"] == "Service" and o["metadata"]["name"] == "engine")
    assert headless["spec"]["clusterIP"] == "None"


def _config_class(service):
    module = importlib.import_module(f"salon.{service}.config")
    classes = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and dataclasses.is_dataclass(obj)
        and "server" in {f.name for f in dataclasses.fields(obj)}
    ]
    assert len(classes) == 1
    return classes[0]


@pytest.mark.parametrize("service", ["gateway", "engine", "kvstore"])
def test_env_names_are_config_fields_and_probes_hit_the_grpc_port(service):
    ((obj, container),) = [(o, c) for o, c in _containers() if c["command"][-1] == f"salon.{service}"]
    prefix = f"SALON_{service.upper()}_"
    env = {e["name"]: e.get("value", "x") for e in container["env"] if e["name"].startswith(prefix)}
    resolved = {k: ("engine-0" if "$(" in v else v) for k, v in env.items()}
    unknown = set(env) - env_names(_config_class(service), prefix)
    assert not unknown, f"{service} has no config field for {sorted(unknown)}"
    config = parse_config(_config_class(service), [], env_prefix=prefix, environ=resolved)
    port = config.server.port
    probe_port = config.server.health_port if config.server.health_port is not None else port
    assert {p["containerPort"] for p in container["ports"]} >= {port, config.server.metrics_port, probe_port}
    assert container["readinessProbe"]["grpc"]["port"] == probe_port
    liveness = container["livenessProbe"]
    assert (liveness.get("grpc") or liveness.get("tcpSocket"))["port"] == probe_port
    assert all("hostPort" not in p for p in container["ports"])
    if service != "gateway":  # internal: mutual TLS, the default mode
        assert config.server.internal_auth == "mtls" and config.server.tls_client_ca_file
        assert config.server.tls_cert_file and config.server.tls_key_file
        assert config.server.health_port is not None  # probes cannot present a client certificate
    if service == "engine":
        assert config.kvstore_tls_cert_file and config.kvstore_target.startswith("kvstore.salon.svc:")
    if service == "gateway":
        # The OpenAI HTTP API: a named container port, exposed by the Service as `http`.
        assert config.http_port == 8000
        assert {"name": "http", "containerPort": config.http_port} in container["ports"]
        (service_obj,) = [o for o in _objects() if o["kind"] == "Service" and o["metadata"]["name"] == "gateway"]
        assert {"name": "http", "port": 8000, "targetPort": config.http_port} in service_obj["spec"]["ports"]
        assert config.engine_tls_cert_file and config.engine_tls_server_name == "engine.salon.svc"
        assert config.salt_secret_file and config.namespace_grant_key_file


def _by_kind(kind):
    return {o["metadata"]["name"]: o for o in _objects() if o["kind"] == kind}


def _tier(name: str) -> dict:
    return {"app.kubernetes.io/name": name}


def test_network_policies_let_each_tier_be_reached_only_by_its_callers():
    policies = _by_kind("NetworkPolicy")
    deny = policies["default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and "ingress" not in deny

    def rules(tier):
        (policy,) = [p for p in policies.values() if p["spec"]["podSelector"].get("matchLabels") == _tier(tier)]
        return {
            (p["port"]): [f for f in rule.get("from", [])] for rule in policy["spec"]["ingress"] for p in rule["ports"]
        }

    for tier, port, callers in (("engine", 50071, "gateway"), ("kvstore", 50061, "engine"), ("redis", 6379, "gateway")):
        assert rules(tier)[port] == [{"podSelector": {"matchLabels": _tier(callers)}}], tier
    assert rules("gateway")[50051] == []  # the public port: from anywhere
    assert rules("gateway")[8000] == []  # the OpenAI HTTP API: public too
    for tier, health_port in (("engine", 50072), ("kvstore", 50062)):
        assert rules(tier)[health_port] == []  # health only (plaintext): the kubelet's probes


def test_every_tier_has_a_disruption_budget():
    budgets = _by_kind("PodDisruptionBudget")
    selected = {tuple(b["spec"]["selector"]["matchLabels"].items()) for b in budgets.values()}
    for tier in ("gateway", "engine", "kvstore", "redis"):
        assert tuple(_tier(tier).items()) in selected, tier
    assert budgets["gateway"]["spec"]["minAvailable"] == 1


def test_every_pod_runs_as_a_non_root_user_without_privilege_escalation():
    workloads = [o for o in _objects() if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]
    assert len(workloads) == 4
    for obj in workloads:
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0, obj
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] & 0o007 == 0  # not readable by others


# The Secrets each tier's pods may mount: one per role (`salon certs --role-dir ROLE=DIR`), and the tenant table.
SECRETS_OF = {"gateway": {"salon-gateway", "salon-tenants"}, "engine": {"salon-engine"}, "kvstore": {"salon-kvstore"}}


def _pod_secrets(obj) -> dict[str, str]:
    """Volume name -> Secret name of a workload's pod."""
    pod = obj["spec"]["template"]["spec"]
    return {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}


def test_each_tier_mounts_only_its_own_roles_secret():
    workloads = {
        o["metadata"]["name"]: o for o in _objects() if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    }
    assert set(workloads) == {*SECRETS_OF, "redis"}
    assert not _pod_secrets(workloads["redis"])
    for tier, allowed in SECRETS_OF.items():
        assert set(_pod_secrets(workloads[tier]).values()) == allowed, tier


def test_no_credential_is_written_in_the_manifests():
    """Secrets are made from `salon certs` output, never applied from this directory (`kubectl apply -f
    deploy/k8s/` would otherwise install an example API key or key)."""
    assert [o["metadata"]["name"] for o in _objects() if o["kind"] == "Secret"] == []


def test_the_role_dirs_salon_certs_makes_hold_every_file_the_pods_read(tmp_path, capsys):
    from salon.cli import certs

    roles = ("gateway", "engine", "kvstore")
    argv = ["--out", str(tmp_path / "ca"), "--tenants-file", str(tmp_path / "tenants.json")]
    argv += [arg for role in roles for arg in ("--role-dir", f"{role}={tmp_path / role}")]
    assert certs.main(argv) == 0
    for tier in roles:
        ((obj, container),) = [(o, c) for o, c in _containers() if c["command"][-1] == f"salon.{tier}"]
        secrets = _pod_secrets(obj)
        mounts = {m["mountPath"]: secrets[m["name"]] for m in container["volumeMounts"] if m["name"] in secrets}
        read = [e["value"] for e in container["env"] if e["name"].endswith("_FILE")]
        assert read, tier
        for path in read:
            (mount,) = [m for m in mounts if path.startswith(m + "/")]
            name = path.removeprefix(mount + "/")
            source = tmp_path / tier / name if mounts[mount] == f"salon-{tier}" else tmp_path / name
            assert source.is_file(), (tier, path, source)
        held = sorted(p.name for p in (tmp_path / tier).iterdir())
        assert "ca.key" not in held and not [n for n in held if n.startswith(tuple(r for r in roles if r != tier))]


@pytest.mark.parametrize("doc", ["README.md", "docs/deployment.md", "docs/security.md"])
def test_the_documented_secret_commands_load_role_dirs_and_never_the_ca_key(doc):
    text = (K8S.parents[1] / doc).read_text()
    creates = [line for line in text.splitlines() if "create secret" in line]
    assert creates, doc
    assert all("ca.key" not in line for line in creates), creates
    assert any("salon-$role --from-file=certs/$role/" in line for line in creates), creates
    assert any("salon-tenants --from-file=tenants.json=certs/tenants.json" in line for line in creates), creates
