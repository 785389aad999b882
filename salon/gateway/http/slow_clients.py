"""uvicorn's h11 protocol with a deadline on each request's head, against clients that hold connections
open by sending nothing, or their headers a byte at a time (slowloris).

uvicorn closes a connection idle *between* requests after `timeout_keep_alive`, but any byte received
resets that timer and nothing bounds the wait for a request's head: 300 such connections were held for
80 s and more without ever authenticating. Here the head must be complete within `header_timeout_s`
of the connection opening (or of the previous response ending); otherwise the connection is closed.
The body's own deadline is body_limit.py's; the number of connections is uvicorn's limit_concurrency.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def with_header_timeout(header_timeout_s: float) -> type[H11Protocol]:
    """An H11Protocol class closing connections whose request head is late by `header_timeout_s`."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the head is in (or the connection is over)
                self._cancel_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_timeout_s, self._on_header_timeout)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _on_header_timeout(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
