"""Whether a supervised child still answers: grpc.health.v1 Check on its health port, every few seconds.

A child that has stopped answering (stopped by a signal, its event loop blocked, deadlocked) has not
exited, so only a probe notices it. `salon up` (up.py) asks each child's health port (the plaintext one
beside a mutual-TLS port) every `interval_s`; a probe that gets no answer within `timeout_s` fails; after
`failures` failed probes in a row the child is killed (SIGKILL) and restarted like one that exited.

Any answer counts as alive, NOT_SERVING included: an engine loading its model and a gateway waiting for
its engines answer NOT_SERVING. Probes are sent without blocking (a future per probe), so a hung child
never holds up the supervision of the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

PROBE_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 2.0
PROBE_FAILURES = 3


@dataclass(frozen=True)
class ProbeSettings:
    interval_s: float = PROBE_INTERVAL_S
    timeout_s: float = PROBE_TIMEOUT_S
    failures: int = PROBE_FAILURES  # failed probes in a row before the child is killed; 0: never probe


class HealthProbe:
    """Probes one child process at `address` (host:port of its grpc.health.v1 service)."""

    def __init__(self, address: str, settings: ProbeSettings):
        self.address = address
        self.settings = settings
        self.consecutive_failures = 0
        self.last_error = ""
        self._channel = grpc.insecure_channel(address)
        self._check = health_pb2_grpc.HealthStub(self._channel).Check
        self._pending: grpc.Future | None = None
        self._next_s: float | None = None

    def poll(self, now_s: float) -> bool:
        """Collect a finished probe and send the next one when due. True once `failures` probes in a row
        went unanswered (the child should be killed)."""
        if self.settings.failures <= 0:
            return False
        if self._pending is not None:
            if not self._pending.done():
                return False  # its own deadline ends it
            try:
                self._pending.result()
                self.consecutive_failures = 0
            except grpc.RpcError as exc:
                self.consecutive_failures += 1
                self.last_error = exc.code().name
            self._pending = None
        if self.consecutive_failures >= self.settings.failures:
            return True
        if self._next_s is None or now_s >= self._next_s:
            self._pending = self._check.future(health_pb2.HealthCheckRequest(), timeout=self.settings.timeout_s)
            self._next_s = now_s + self.settings.interval_s
        return False

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._channel.close()
