"""Ports for services that tests start on fixed ports: free when picked, and below the kernel's ephemeral ports, so
that a port another process binds to 0 meanwhile (a service's health port, a client's connection) cannot take one
between the pick and the service's bind."""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from pathlib import Path

LOWEST = 10_000


def free_port_spans(spans: Sequence[int]) -> list[int]:
    """The first port of each of `spans` runs of consecutive ports, every port of them free and no two runs
    overlapping (each run is held while the next is picked)."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    highest = max(ephemeral_low, 2 * LOWEST)
    rng = random.Random()  # unseeded: test sessions side by side should not pick alike
    held: list[socket.socket] = []
    firsts = []
    try:
        for span in spans:
            while (run := _held_run(first := rng.randrange(LOWEST, highest - span), span)) is None:
                pass
            held += run
            firsts.append(first)
    finally:
        for sock in held:
            sock.close()
    return firsts


def _held_run(first: int, span: int) -> list[socket.socket] | None:
    """Sockets bound to ports first .. first + span - 1 on 127.0.0.1, or None (and none held) if one is taken."""
    socks: list[socket.socket] = []
    try:
        for port in range(first, first + span):
            socks.append(socket.socket())
            socks[-1].bind(("127.0.0.1", port))
    except OSError:
        for sock in socks:
            sock.close()
        return None
    return socks


def free_port() -> int:
    return free_port_spans([1])[0]
