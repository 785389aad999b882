"""OpenAI error objects: `{"error": {"message", "type", "param", "code"}}` with the HTTP status of
each salon error, defined once.

    salon error / gRPC status              HTTP  type                    code
    INVALID_ARGUMENT, OUT_OF_RANGE         400   invalid_request_error   invalid_value / unsupported_parameter
    UNAUTHENTICATED                        401   invalid_request_error   invalid_api_key
    PERMISSION_DENIED                      403   permission_error        permission_denied
    NOT_FOUND                              404   invalid_request_error   model_not_found
    RESOURCE_EXHAUSTED                     429   rate_limit_error        rate_limit_exceeded   + Retry-After
      ... from grpc's message size limit   413   invalid_request_error   request_too_large
    UNAVAILABLE                            503   service_unavailable     no_engine
    DEADLINE_EXCEEDED                      504   timeout                 deadline_exceeded
    anything else                          500   internal_error          internal

A request too large for a gRPC message limit is the client's to shrink, not a rate to wait out: grpc
reports both as RESOURCE_EXHAUSTED, told apart by grpc's own wording ("... message larger than max").

A 429 carries `Retry-After` (whole seconds, rounded up) and `retry-after-ms` (the exact hint, which
the official clients read first).
"""

from __future__ import annotations

import math

import grpc
from fastapi.responses import JSONResponse

from salon.common.errors import ResourceExhausted, SalonError

_BY_CODE: dict[grpc.StatusCode, tuple[int, str, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", "invalid_value"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error", "invalid_value"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "invalid_request_error", "invalid_api_key"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error", "permission_denied"),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "rate_limit_exceeded"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable", "no_engine"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout", "deadline_exceeded"),
}


# grpc's wording when a message is over a channel's send or receive limit (either side of the call).
_MESSAGE_TOO_LARGE = "message larger than max"


def status_of(code: grpc.StatusCode, message: str) -> tuple[int, str, str]:
    """(HTTP status, error type, error code) of a gRPC status with its message."""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _MESSAGE_TOO_LARGE in message:
        return 413, "invalid_request_error", "request_too_large"
    return _BY_CODE.get(code, (500, "internal_error", "internal"))


class ApiError(Exception):
    """An error to answer with, already in OpenAI's terms."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str,
        param: str | None = None,
        retry_after_ms: int | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.retry_after_ms = retry_after_ms

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {}
        if self.retry_after_ms is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_ms / 1000)))
            headers["retry-after-ms"] = str(int(self.retry_after_ms))
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def invalid(param: str, message: str, code: str = "invalid_value") -> ApiError:
    """400 naming the field."""
    return ApiError(400, f"{param}: {message}", "invalid_request_error", code, param)


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param}: {why}", "invalid_request_error", "unsupported_parameter", param)


def model_not_found(model: str, served: list[str]) -> ApiError:
    return ApiError(
        404,
        f"model {model!r} is not served (served: {', '.join(served) or 'none yet'})",
        "invalid_request_error",
        "model_not_found",
        "model",
    )


def too_large(param: str, message: str) -> ApiError:
    """413 naming what was too large."""
    return ApiError(413, f"{param}: {message}", "invalid_request_error", "request_too_large", param)


def from_rpc_error(exc: grpc.aio.AioRpcError) -> ApiError:
    """The HTTP answer to a failed call to an engine."""
    message = exc.details() or exc.code().name
    status, type_, code = status_of(exc.code(), message)
    return ApiError(status, message, type_, code)


def from_salon_error(exc: SalonError, fields: dict[str, str] | None = None) -> ApiError:
    """The HTTP answer to a salon error raised by the core (dispatcher, admission, engines). fields: engine field
    names (a refusal's "field: why", as salon.engine.api.validation words it) -> the request's field that gave
    them; a refusal naming one of them, or a field under it, names the request's field instead (param too)."""
    status, type_, code = status_of(exc.code, exc.message)
    message, param = exc.message, None
    field, _, why = message.partition(": ")
    if status == 400 and why:
        for engine_field, request_field in (fields or {}).items():
            if field == engine_field or field.startswith((engine_field + ".", engine_field + "[")):
                message, param = f"{request_field}: {why}", request_field
                break
    retry_after_ms = None
    if isinstance(exc, ResourceExhausted) and exc.retry_after_ms is not None:
        retry_after_ms = int(exc.retry_after_ms)
    else:
        for key, value in exc.trailing_metadata():
            if key == "retry-after-ms" and value.isdigit():
                retry_after_ms = int(value)
    if status != 429:
        retry_after_ms = None
    elif retry_after_ms is None:
        retry_after_ms = 1000
    return ApiError(status, message, type_, code, param, retry_after_ms)
