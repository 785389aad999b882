"""The supervisor's health probe: any answer (NOT_SERVING included) is alive; a port that accepts the
connection and never answers fails the probe, and `failures` such probes in a row say "kill it"."""

from __future__ import annotations

import socket
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from salon.cli.health_probe import HealthProbe, ProbeSettings
from salon.cli.up import build_parser

SETTINGS = ProbeSettings(interval_s=0.05, timeout_s=0.3, failures=3)


def _poll_until(probe: HealthProbe, stop, timeout_s: float = 20.0) -> bool:
    """Poll as the supervisor does until stop(probe, verdict) holds; the last verdict."""
    deadline = time.monotonic() + timeout_s
    while True:
        verdict = probe.poll(time.monotonic())
        if stop(probe, verdict):
            return verdict
        assert time.monotonic() < deadline, (probe.consecutive_failures, probe.last_error)
        time.sleep(0.01)


class _CountingHealth(health.HealthServicer):
    def __init__(self):
        super().__init__()
        self.checks = 0

    def Check(self, request, context):
        self.checks += 1
        return super().Check(request, context)


def test_an_answer_of_not_serving_is_alive() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = _CountingHealth()
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    probe = HealthProbe(f"127.0.0.1:{port}", SETTINGS)
    try:
        # Positive control for the absence of a verdict: probes were answered, well past `failures` of them.
        verdict = _poll_until(probe, lambda p, v: v or servicer.checks >= 2 * SETTINGS.failures)
        assert verdict is False
        assert probe.consecutive_failures == 0 and probe.last_error == ""
    finally:
        probe.close()
        server.stop(None)


def test_a_port_that_never_answers_fails_failures_probes_in_a_row() -> None:
    with socket.socket() as listener:  # accepts connections (the kernel's backlog), never speaks
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        probe = HealthProbe(f"127.0.0.1:{listener.getsockname()[1]}", SETTINGS)
        try:
            assert _poll_until(probe, lambda p, v: v) is True
            assert probe.consecutive_failures == SETTINGS.failures
            assert probe.last_error == "DEADLINE_EXCEEDED"
        finally:
            probe.close()


def test_failures_zero_never_probes() -> None:
    probe = HealthProbe("127.0.0.1:9", ProbeSettings(interval_s=0.01, timeout_s=0.01, failures=0))
    try:
        assert probe.poll(time.monotonic()) is False
        assert probe._pending is None
    finally:
        probe.close()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--health-probe-timeout-s", "0"], "argument --health-probe-timeout-s: 0: give a number of seconds above 0"),
        (["--health-probe-interval-s", "nan"], "argument --health-probe-interval-s: nan: give a number of seconds"),
        (["--health-probe-failures", "-1"], "argument --health-probe-failures: -1: give 0 or more"),
    ],
)
def test_salon_up_refuses_probe_flags_that_cannot_work(flags, message, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(flags)  # parsing only: nothing starts
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert build_parser().parse_args(["--health-probe-failures", "0"]).health_probe_failures == 0
