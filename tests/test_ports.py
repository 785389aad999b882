"""tests/ports.py: the runs of ports it picks are free, apart and below the kernel's ephemeral ports; a run with a
taken port is passed over and leaves nothing bound."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.ports import LOWEST, _held_run, free_port_spans


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_runs_are_free_apart_and_below_the_ephemeral_ports():
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        spans = [1, 1, 3, 4, 1]
        runs = [range(first, first + span) for first, span in zip(free_port_spans(spans), spans, strict=True)]
        ports = [port for run in runs for port in run]
        assert len(set(ports)) == len(ports), runs
        assert all(LOWEST <= port < max(ephemeral_low, 2 * LOWEST) for port in ports), runs
        assert all(_bindable(port) for port in ports), runs  # released when returned


def test_a_run_with_a_taken_port_is_passed_over_and_holds_nothing():
    (first,) = free_port_spans([5])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 2))
        assert _held_run(first, 4) is None
        assert _bindable(first) and _bindable(first + 1)  # what it bound before the taken port, it let go
        held = _held_run(first + 3, 2)
        assert held is not None and not _bindable(first + 3) and not _bindable(first + 4)
        for sock in held:
            sock.close()
