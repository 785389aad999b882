"""Start a salon service as a separate OS process and wait until it serves.

Used by `salon up` and by the tests, so both run the services exactly as production does:
`python -m salon.<svc> --port 0 ...`, reading the `LISTENING <svc> port=<p> metrics_port=<m> health_port=<h>`
line the bootstrap prints, then waiting for grpc.health.v1 to report SERVING (on the plaintext health
port when the service has one: a mutual-TLS port takes no caller without a certificate).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

_LISTENING = re.compile(r"^LISTENING (\S+) port=(\d+) metrics_port=(\S+)(.*)")
_EXTRA_PORT = re.compile(r"(\w+)=(\d+)")


class ServiceStartError(RuntimeError):
    """The process exited or did not become SERVING in time; the message holds its last log lines."""


@dataclass
class ServiceProcess:
    """One running service process."""

    service: str
    args: tuple[str, ...]
    log_path: Path | None = None
    env: Mapping[str, str] | None = None
    # Called with each line the service prints on stdout after its LISTENING line (e.g. a model conversion's
    # progress); None drops them.
    on_output: Callable[[str], None] | None = None
    process: subprocess.Popen | None = field(default=None, init=False)
    port: int | None = field(default=None, init=False)
    metrics_port: int | None = field(default=None, init=False)
    # Further listeners the service announced (e.g. the gateway's `http_port`).
    extra_ports: dict[str, int] = field(default_factory=dict, init=False)
    health_port: int | None = field(default=None, init=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def health_address(self) -> str:
        """Where grpc.health.v1 answers without a client certificate."""
        return f"127.0.0.1:{self.health_port}" if self.health_port is not None else self.address

    def start(self, timeout_s: float = 120.0) -> ServiceProcess:
        env = dict(os.environ if self.env is None else self.env)
        log_file = _open_private_log(self.log_path) if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [sys.executable, "-m", f"salon.{self.service}", *self.args],
            stdout=subprocess.PIPE,
            stderr=log_file,
            env=env,
            text=True,
            start_new_session=True,
        )
        # Lines before LISTENING (a model conversion that starts while the server does) go to on_output.
        deadline = time.monotonic() + timeout_s
        while True:
            line = _read_line_with_timeout(self.process, max(0.0, deadline - time.monotonic()))
            match = _LISTENING.match(line or "")
            if match or not line or time.monotonic() >= deadline:
                break
            if self.on_output is not None:
                self.on_output(line.rstrip("\n"))
        if not match:
            self.kill()
            raise ServiceStartError(f"{self.service} did not start: {line!r}{self._log_tail()}")
        self.port = int(match.group(2))
        self.metrics_port = None if match.group(3) == "None" else int(match.group(3))
        ports = {name: int(value) for name, value in _EXTRA_PORT.findall(match.group(4))}
        self.health_port = ports.pop("health_port", None)
        self.extra_ports = ports
        # Keep draining stdout so the child never blocks on a full pipe.
        threading.Thread(target=_drain, args=(self.process.stdout, self.on_output), daemon=True).start()
        return self

    def wait_serving(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.health_address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise ServiceStartError(f"{self.service} exited with {self.process.returncode}{self._log_tail()}")
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise ServiceStartError(f"{self.service} not SERVING after {timeout_s}s{self._log_tail()}")

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (graceful), then SIGKILL if it does not exit in time. Returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def _log_tail(self, num_lines: int = 20) -> str:
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        lines = Path(self.log_path).read_text(errors="replace").splitlines()[-num_lines:]
        return "\n" + "\n".join(lines)


def _open_private_log(path: Path):
    """`path` for appending, readable by this user alone (0600, an existing file too): logs name tenants,
    conversations and errors."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def threads_per_process(num_processes: int) -> int:
    """An equal share of this host's cores for each of num_processes compute-bound processes (at least 1)."""
    return max(1, (os.cpu_count() or 1) // max(1, num_processes))


def start_service(
    service: str,
    args: Sequence[str] = (),
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    wait_serving: bool = True,
    timeout_s: float = 300.0,
) -> ServiceProcess:
    proc = ServiceProcess(service, tuple(args), log_path, env).start(timeout_s)
    if wait_serving:
        try:
            proc.wait_serving(timeout_s)
        except BaseException:
            proc.kill()
            raise
    return proc


def _read_line_with_timeout(process: subprocess.Popen, timeout_s: float) -> str | None:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return result[0] if result else None


def _drain(stream, on_line: Callable[[str], None] | None) -> None:
    for line in stream:
        if on_line is not None:
            on_line(line.rstrip("\n"))
