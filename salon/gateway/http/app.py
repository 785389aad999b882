"""The ASGI app and its uvicorn server, run inside the gateway's own event loop on `--http-port`.

The server is given a socket bound before it starts (so the port is known, and printed, at once) and
installs no signal handlers: the gateway's bootstrap owns SIGTERM and stops this server before the
gRPC one (graceful: in-flight streams get `grace_s`).

Against slow or hostile clients (HttpLimits): a request's head must arrive within `header_timeout_s`
(slow_clients.py) and its body within `body_timeout_s`, at most `max_body_bytes` of it (body_limit.py);
a connection idle between requests closes after `idle_timeout_s`; past `max_connections` open
connections a request is answered 503 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass

import grpc
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from salon.common.errors import SalonError
from salon.common.listen import PortTakenError, bind_problem
from salon.common.logging import get_logger
from salon.gateway.http import probes
from salon.gateway.http.body_limit import MAX_BODY_BYTES, BodyLimit
from salon.gateway.http.errors import ApiError, from_rpc_error, from_salon_error
from salon.gateway.http.responses import router as responses_router
from salon.gateway.http.routes import Front, router
from salon.gateway.http.slow_clients import with_header_timeout

log = get_logger(__name__)

_BACKLOG = 2048  # uvicorn's default


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int = MAX_BODY_BYTES
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 15.0
    max_connections: int = 1024


def build_app(front: Front, limits: HttpLimits = HttpLimits()) -> FastAPI:
    app = FastAPI(
        title="salon",
        description="OpenAI-compatible API of the salon gateway",
        version=probes.VERSION,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",  # unauthenticated, as vLLM serves it
    )
    app.state.front = front
    app.include_router(router)
    app.include_router(probes.router)
    app.include_router(responses_router)
    app.add_middleware(BodyLimit, max_body_bytes=limits.max_body_bytes, body_timeout_s=limits.body_timeout_s)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(SalonError)
    async def _salon_error(request: Request, exc: SalonError):
        return from_salon_error(exc).response()

    @app.exception_handler(grpc.aio.AioRpcError)
    async def _rpc_error(request: Request, exc: grpc.aio.AioRpcError):
        return from_rpc_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        type_ = "invalid_request_error" if exc.status_code < 500 else "internal_error"
        return JSONResponse(
            {
                "error": {
                    "message": f"{request.method} {request.url.path}: {exc.detail}",
                    "type": type_,
                    "param": None,
                    "code": str(exc.status_code),
                }
            },
            status_code=exc.status_code,
        )

    return app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the gateway's bootstrap handles signals
        yield


class HttpServer:
    """uvicorn serving `app` on host:port (0 picks a free port) as a task of the running loop."""

    def __init__(self, app: FastAPI, host: str, port: int, grace_s: float = 5.0, limits: HttpLimits = HttpLimits()):
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: a response's header and body writes go out at once instead
        # of the body waiting for the client's delayed ACK (40 ms per request on Linux).
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # SO_REUSEADDR (a closed gateway's TIME_WAIT connections do not block a restart) lets another
        # socket bind the port until this one listens: listen at once, so a second gateway's bind fails.
        try:
            self.sock.bind((host, port))
            self.sock.listen(_BACKLOG)
        except OSError as exc:
            self.sock.close()
            raise PortTakenError("HTTP port", host, port, bind_problem(host, port) if port else str(exc)) from exc
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=grace_s,
            http=with_header_timeout(limits.header_timeout_s),
            timeout_keep_alive=limits.idle_timeout_s,
            limit_concurrency=limits.max_connections,
        )
        self.server = _Server(config)
        self.front: Front = app.state.front
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self.front.parser.start()
        self._task = asyncio.create_task(self.server.serve(sockets=[self.sock]), name="http")
        log.info("http_listening", port=self.port)

    async def stop(self) -> None:
        if self._task is None:
            return
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self.front.parser.stop()
