"""The shared server bootstrap, in a real OS process: health, reflection, error mapping, metrics, shutdown."""

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from salon.api.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from salon.common.reflection import add_v1_descriptor

PROBE = Path(__file__).with_name("bootstrap_probe_service.py")


@pytest.fixture
def probe(tmp_path):
    trace_file = tmp_path / "spans.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(PROBE), "--metrics-port", "0", "--trace-file", str(trace_file)],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "probe.log", "w"),
        text=True,
    )
    line = proc.stdout.readline()
    m = re.match(r"LISTENING probe port=(\d+) metrics_port=(\d+)", line)
    assert m, line
    yield proc, int(m.group(1)), int(m.group(2)), tmp_path
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_health_goes_serving_after_start(probe):
    _proc, port, _m, _ = probe
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        first = stub.Check(health_pb2.HealthCheckRequest()).status
        assert first == health_pb2.HealthCheckResponse.NOT_SERVING
        deadline = time.monotonic() + 10
        while stub.Check(health_pb2.HealthCheckRequest()).status != health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        named = stub.Check(health_pb2.HealthCheckRequest(service="salon.kvstore.v1.KVStoreService")).status
        assert named == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_services(probe):
    _proc, port, _m, _ = probe
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for r in responses for s in r.list_services_response.service}
    assert {
        "salon.kvstore.v1.KVStoreService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names


def test_reflection_v1_lists_and_describes_services(probe):
    """A grpc.reflection.v1 client (grpcurl's first choice), with v1 messages, not v1alpha's."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(descriptor_pb2.DESCRIPTOR.serialized_pb))
    add_v1_descriptor(pool)
    request_type = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest")
    )
    response_type = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse")
    )
    _proc, port, _m, _ = probe
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=request_type.SerializeToString,
            response_deserializer=response_type.FromString,
        )
        listed, described, itself = call(
            iter(
                [
                    request_type(list_services=""),
                    request_type(file_containing_symbol="salon.kvstore.v1.KVStoreService"),
                    request_type(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
                ]
            )
        )
    assert {s.name for s in listed.list_services_response.service} >= {
        "salon.kvstore.v1.KVStoreService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b)
        for b in described.file_descriptor_response.file_descriptor_proto
    ]
    assert "salon.kvstore.v1.KVStoreService" in {f"{f.package}.{s.name}" for f in files for s in f.service}
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b) for b in itself.file_descriptor_response.file_descriptor_proto
    ]
    assert [(f.name, f.package) for f in files] == [("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")]


def test_typed_errors_map_to_status_codes(probe):
    _proc, port, _m, _ = probe
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = kvstore_pb2_grpc.KVStoreServiceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Match(kvstore_pb2.MatchRequest())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "namespace: must be 32 bytes, got 0"

        with pytest.raises(grpc.RpcError) as err:
            stub.GetStats(kvstore_pb2.GetStatsRequest())
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("retry-after-ms", "250") in tuple(err.value.trailing_metadata())

        with pytest.raises(grpc.RpcError) as err:
            stub.Drop(kvstore_pb2.DropRequest())
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "secret internal detail" not in err.value.details()
        assert "RuntimeError" in err.value.details()

        stream = stub.Fetch(kvstore_pb2.FetchRequest())
        assert next(stream).header.num_tokens == 16
        with pytest.raises(grpc.RpcError) as err:
            next(stream)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "num_tokens" in err.value.details()


def test_metrics_count_rpcs_by_code(probe):
    _proc, port, metrics_port, _ = probe
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = kvstore_pb2_grpc.KVStoreServiceStub(ch)
        for _ in range(3):
            with pytest.raises(grpc.RpcError):
                stub.Match(kvstore_pb2.MatchRequest())
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    line = [
        ln
        for ln in text.splitlines()
        if ln.startswith("salon_rpc_requests_total{") and "Match" in ln and "INVALID_ARGUMENT" in ln
    ]
    assert line and float(line[0].split()[-1]) == 3.0


def test_logs_are_json_with_trace_ids_and_sigterm_is_graceful(probe):
    proc, port, _m, tmp_path = probe
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        with pytest.raises(grpc.RpcError):
            kvstore_pb2_grpc.KVStoreServiceStub(ch).Match(kvstore_pb2.MatchRequest())
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(15) == 0
    assert "PROBE STOPPED" in rest
    records = [json.loads(line) for line in (tmp_path / "probe.log").read_text().splitlines() if line.startswith("{")]
    failed = [r for r in records if r.get("event") == "request_failed"]
    assert failed and failed[0]["code"] == "INVALID_ARGUMENT"
    assert re.fullmatch(r"[0-9a-f]{32}", failed[0]["trace_id"]) and failed[0]["request_id"]
    spans = [json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    match_span = [s for s in spans if s["name"].endswith("/Match")]
    assert match_span and match_span[0]["trace_id"] == failed[0]["trace_id"]
    assert {"shutting_down", "stopped"} <= {r.get("event") for r in records}


def _start_probe(tmp_path, *flags):
    proc = subprocess.Popen(
        [sys.executable, str(PROBE), *flags],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "tls-probe.log", "w"),
        text=True,
    )
    m = re.match(r"LISTENING probe port=(\d+)", proc.stdout.readline())
    assert m
    return proc, int(m.group(1))


def _health_over(port, credentials):
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_tls_and_mutual_tls(tmp_path, tls_files):
    ca = tls_files.ca_cert.read_bytes()
    proc, port = _start_probe(
        tmp_path, "--tls-cert-file", str(tls_files.server_cert), "--tls-key-file", str(tls_files.server_key)
    )
    try:
        assert _health_over(port, grpc.ssl_channel_credentials(ca)) is not None
        with pytest.raises(grpc.RpcError):  # a server certificate from an unknown CA is refused
            _health_over(port, grpc.ssl_channel_credentials(tls_files.other_ca_cert.read_bytes()))
        with pytest.raises(grpc.RpcError):  # plaintext clients cannot talk to a TLS port
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    finally:
        proc.kill()
        proc.wait()

    proc, port = _start_probe(
        tmp_path,
        "--tls-cert-file",
        str(tls_files.server_cert),
        "--tls-key-file",
        str(tls_files.server_key),
        "--tls-client-ca-file",
        str(tls_files.ca_cert),
    )
    try:
        with pytest.raises(grpc.RpcError):  # mutual TLS: a client without a certificate is refused
            _health_over(port, grpc.ssl_channel_credentials(ca))
        mtls = grpc.ssl_channel_credentials(ca, tls_files.client_key.read_bytes(), tls_files.client_cert.read_bytes())
        assert _health_over(port, mtls) is not None
    finally:
        proc.kill()
        proc.wait()


def test_health_watch_streams_status_changes(probe):
    _proc, port, _m, _ = probe
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=10)
        seen = []
        for response in stream:
            seen.append(response.status)
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                break
    assert seen[-1] == health_pb2.HealthCheckResponse.SERVING


def test_fatal_reports_not_serving_and_exits_for_the_supervisor(probe):
    """health.fatal(): NOT_SERVING, then the process stops with EXIT_FATAL (70) instead of running on."""
    proc, port, _m, tmp_path = probe
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=20)
        while next(watch).status != health_pb2.HealthCheckResponse.SERVING:
            pass
        kvstore_pb2_grpc.KVStoreServiceStub(ch).ReleaseLease(kvstore_pb2.ReleaseLeaseRequest(), timeout=5)
        statuses = []
        try:
            for response in watch:
                statuses.append(response.status)
        except grpc.RpcError:
            pass  # the server went away
    assert proc.wait(15) == 70
    assert statuses == [health_pb2.HealthCheckResponse.NOT_SERVING]
    records = [json.loads(line) for line in (tmp_path / "probe.log").read_text().splitlines() if line.startswith("{")]
    assert any(r.get("event") == "fatal" and "asked to give up" in r.get("reason", "") for r in records)


def test_sighup_stops_it_like_sigterm(probe):
    proc, _port, _m, _ = probe
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(15) == 0
    assert "PROBE STOPPED" in proc.stdout.read()


def test_it_stops_when_its_parent_dies(tmp_path):
    """--parent-pid: when the supervisor is SIGKILLed, the service still stops (PR_SET_PDEATHSIG)."""
    parent = subprocess.Popen(
        [
            "bash",
            "-c",
            f'"{sys.executable}" "{PROBE}" --parent-pid $$ > "{tmp_path}/out" 2>/dev/null & echo $!; sleep 60',
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    probe_pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while not (tmp_path / "out").exists() or "LISTENING" not in (tmp_path / "out").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    parent.kill()
    parent.wait(5)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{probe_pid}").exists() and "zombie" not in _proc_state(probe_pid):
        assert time.monotonic() < deadline, "the service outlived its parent"
        time.sleep(0.05)
    assert "PROBE STOPPED" in (tmp_path / "out").read_text()  # a graceful stop, not a kill


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


@pytest.mark.parametrize(
    "internal, flags, message",
    [
        (False, ["--tls-cert-file", "{server_cert}"], "--tls-cert-file and --tls-key-file go together"),
        (False, ["--tls-key-file", "{server_key}"], "--tls-cert-file and --tls-key-file go together"),
        (False, ["--tls-client-ca-file", "{ca}"], "--tls-client-ca-file needs --tls-cert-file"),
        (
            True,
            ["--tls-cert-file", "{server_cert}", "--tls-key-file", "{server_key}"],
            "--internal-auth mtls needs --tls-cert-file, --tls-key-file and --tls-client-ca-file",
        ),
        (True, [], "--internal-auth mtls needs"),
        (True, ["--internal-auth", "insecure-loopback", "--host", "0.0.0.0"], "listens on loopback only"),
        (
            True,
            [
                "--internal-auth",
                "insecure-loopback",
                "--tls-cert-file",
                "{server_cert}",
                "--tls-key-file",
                "{server_key}",
            ],
            "serves plaintext",
        ),
        (True, ["--internal-auth", "plaintext"], "is not one of mtls, insecure-loopback"),
    ],
)
def test_a_half_or_unsafe_security_config_refuses_to_start(tmp_path, tls_files, internal, flags, message):
    values = {"server_cert": tls_files.server_cert, "server_key": tls_files.server_key, "ca": tls_files.ca_cert}
    argv = [sys.executable, str(PROBE), *(["--internal"] if internal else []), *(f.format(**values) for f in flags)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert message in result.stderr and "LISTENING" not in result.stdout


def test_an_internal_service_takes_only_the_roles_it_names(tmp_path, tls_files):
    """Only an engine identity may call the (probe) kvstore API: another role or a certificate without a
    salon identity gets UNAUTHENTICATED, a caller without a certificate does not get past TLS. Health
    answers any TLS peer, and plaintext on the health port."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(PROBE),
            "--internal",
            "--tls-cert-file",
            str(tls_files.cert("kvstore")),
            "--tls-key-file",
            str(tls_files.key("kvstore")),
            "--tls-client-ca-file",
            str(tls_files.ca_cert),
            "--health-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "probe.log", "w"),
        text=True,
    )
    try:
        m = re.match(r"LISTENING probe port=(\d+) metrics_port=None health_port=(\d+)", proc.stdout.readline())
        assert m
        port, health_port = int(m.group(1)), int(m.group(2))
        ca = tls_files.ca_cert.read_bytes()

        def as_(cert, key):
            return grpc.ssl_channel_credentials(ca, key.read_bytes(), cert.read_bytes())

        def stats(credentials):
            with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as ch:
                return kvstore_pb2_grpc.KVStoreServiceStub(ch).GetStats(kvstore_pb2.GetStatsRequest(), timeout=5)

        with pytest.raises(grpc.RpcError) as info:
            stats(as_(tls_files.cert("engine"), tls_files.key("engine")))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # past the role check: the probe's answer
        for cert, key, who in (
            (tls_files.cert("gateway"), tls_files.key("gateway"), "spiffe://salon/gateway/gateway"),
            (tls_files.client_cert, tls_files.client_key, "without a salon identity"),
        ):
            with pytest.raises(grpc.RpcError) as info:
                stats(as_(cert, key))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "only engine identities may call" in info.value.details() and who in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            stats(grpc.ssl_channel_credentials(ca))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # no certificate: the handshake fails
        assert _health_over(port, as_(tls_files.cert("gateway"), tls_files.key("gateway"))) is not None
        with grpc.insecure_channel(f"127.0.0.1:{health_port}") as ch:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            with pytest.raises(grpc.RpcError) as info:  # the health port serves health only
                kvstore_pb2_grpc.KVStoreServiceStub(ch).GetStats(kvstore_pb2.GetStatsRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        proc.kill()
        proc.wait()
