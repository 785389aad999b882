"""Ports belong to one process: a second service on a taken port exits with one line naming the port, and
no socket of the same user (SO_REUSEPORT, or grpc's defaults) can share a service's gRPC or health port."""

import asyncio
import errno
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from salon.common.listen import NO_PORT_SHARING

PROBE = Path(__file__).with_name("bootstrap_probe_service.py")
_LISTENING = re.compile(r"LISTENING probe port=(\d+) metrics_port=(\d+) health_port=(\d+)")


@pytest.fixture
def first(tmp_path):
    """A service holding a gRPC, a metrics and a health port."""
    proc = subprocess.Popen(
        [sys.executable, str(PROBE), "--port", "0", "--metrics-port", "0", "--health-port", "0"],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "first.log", "w"),
        text=True,
    )
    line = proc.stdout.readline()
    m = _LISTENING.match(line)
    assert m, line
    yield proc, {"--port": int(m.group(1)), "--metrics-port": int(m.group(2)), "--health-port": int(m.group(3))}
    proc.kill()
    proc.wait()


def _wait_serving(port: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING:
                return True
            time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    "flag, purpose", [("--port", "gRPC port"), ("--health-port", "health port"), ("--metrics-port", "metrics port")]
)
def test_a_second_service_on_a_taken_port_exits_with_one_line_naming_it(first, flag, purpose):
    proc, ports = first
    flags = {"--port": 0, "--metrics-port": 0, "--health-port": 0, flag: ports[flag]}
    second = subprocess.run(
        [sys.executable, str(PROBE), *[str(x) for item in flags.items() for x in item]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2, second.stderr
    assert "LISTENING" not in second.stdout
    expected = f"probe: cannot listen on 127.0.0.1:{ports[flag]} for the {purpose}: address already in use"
    assert expected in second.stderr.splitlines(), second.stderr
    assert "Traceback" not in second.stderr
    # The first one never noticed.
    assert proc.poll() is None and _wait_serving(ports["--port"]) and _wait_serving(ports["--health-port"])


@pytest.mark.parametrize("flag", ["--port", "--health-port"])
def test_no_socket_of_the_same_user_can_share_a_grpc_port(first, flag):
    _proc, ports = first
    port = ports[flag]
    # A plain socket asking to share (SO_REUSEPORT), as a hijacker would.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with pytest.raises(OSError) as err:
            sock.bind(("127.0.0.1", port))
        assert err.value.errno == errno.EADDRINUSE
    # A grpc server with grpc's defaults (SO_REUSEPORT on).
    with pytest.raises(RuntimeError, match=f"Failed to bind to address 127.0.0.1:{port}"):
        grpc.server(None).add_insecure_port(f"127.0.0.1:{port}")


def test_sharing_is_possible_without_the_option_so_the_test_above_can_fail():
    """Positive control: two grpc servers with the defaults do share a port on this kernel."""

    async def main():
        first = grpc.aio.server()
        port = first.add_insecure_port("127.0.0.1:0")
        await first.start()
        try:
            assert grpc.aio.server().add_insecure_port(f"127.0.0.1:{port}") == port
            unshared = grpc.aio.server(options=[NO_PORT_SHARING])
            with pytest.raises(RuntimeError):
                unshared.add_insecure_port(f"127.0.0.1:{port}")
        finally:
            await first.stop(0)

    asyncio.run(main())


def test_every_grpc_server_in_salon_is_made_without_port_sharing():
    """grpc.aio.server / grpc.server is called only in the bootstrap, and each call passes NO_PORT_SHARING."""
    root = Path(__file__).resolve().parents[2] / "salon"
    calls = []
    for path in root.rglob("*.py"):
        if "api" in path.relative_to(root).parts[:1]:
            continue
        for m in re.finditer(r"grpc(?:\.aio)?\.server\((.*?)\)\n", path.read_text(), re.S):
            calls.append((path.relative_to(root).as_posix(), m.group(1)))
    assert [p for p, _ in calls] == ["common/server.py", "common/server.py"]
    assert all("NO_PORT_SHARING" in args for _, args in calls), calls
