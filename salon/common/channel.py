"""Client channels between services: tracing interceptors, message limits, optional (mutual) TLS."""

from __future__ import annotations

import grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors

from salon.common.client_tls import ClientTLS, client_credentials, tls_options
from salon.common.message_limits import grpc_options


def create_channel(target: str, tls: ClientTLS | None = None, traced: bool = True) -> grpc.aio.Channel:
    """Open an aio channel to `target` (host:port) that propagates the trace context.

    traced=False leaves out the tracing interceptors: for hot calls whose caller propagates the
    context itself (the interceptors cost an extra task and two wrapping layers per call)."""
    options: list[tuple[str, object]] = [*grpc_options(), *tls_options(tls)]
    interceptors = aio_client_interceptors() if traced else None
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(target, client_credentials(tls), options=options, interceptors=interceptors)
