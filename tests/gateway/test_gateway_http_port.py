"""The gateway's HTTP port is its own: bound and listening at once (SO_REUSEADDR alone lets another socket
bind a port nobody listens on yet), and a second gateway on it exits with one line naming the port."""

import errno
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from fastapi import FastAPI

from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.listen import PortTakenError
from salon.common.process import start_service
from salon.gateway.http.app import HttpServer


@pytest.mark.parametrize("option", [socket.SO_REUSEADDR, socket.SO_REUSEPORT], ids=["SO_REUSEADDR", "SO_REUSEPORT"])
def test_no_other_socket_binds_the_http_port_before_the_server_starts(option):
    server = HttpServer(FastAPI(), "127.0.0.1", 0)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, option, 1)
            with pytest.raises(OSError) as err:
                sock.bind(("127.0.0.1", server.port))
            assert err.value.errno == errno.EADDRINUSE
        with pytest.raises(PortTakenError) as taken:
            HttpServer(FastAPI(), "127.0.0.1", server.port)
        assert str(taken.value) == f"cannot listen on 127.0.0.1:{server.port} for the HTTP port: address already in use"
    finally:
        server.sock.close()


def test_a_second_gateway_on_a_taken_http_port_exits_with_one_line(tmp_path):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": [{"tenant_id": "t", "api_key": "sk-port-test", "namespace_salt": "s"}]}))
    # No engine answers on port 9: the gateway starts and listens, without becoming SERVING.
    flags = ["--engines", "e0=127.0.0.1:9", "--tenants-file", str(tenants), *INSECURE_LOOPBACK_FLAGS]
    first = start_service(
        "gateway", ["--port", "0", "--http-port", "0", *flags], tmp_path / "first.log", wait_serving=False
    )
    try:
        http_port = first.extra_ports["http_port"]
        second = subprocess.run(
            [sys.executable, "-m", "salon.gateway", "--port", "0", "--http-port", str(http_port), *flags],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr
        assert "LISTENING" not in second.stdout
        line = f"gateway: cannot listen on 127.0.0.1:{http_port} for the HTTP port: address already in use"
        assert line in second.stderr.splitlines(), second.stderr
        assert "Traceback" not in second.stderr
        # The first gateway still answers on it (an unauthenticated call: 401 with an OpenAI error object).
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/models", timeout=10)
        assert err.value.code == 401
    finally:
        first.stop()
